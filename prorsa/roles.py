r"""Engine roles, shared by the brain (control/, agent/) and the bodies (engine/, live/, sim/).

A role is what the router asks an engine to do, not what the engine is: on vLLM both legs of a
disaggregated turn run on any engine, so a switch is draining plus bookkeeping.

        +---------+  drain prefills  +--------+
        | PREFILL | ---------------> | DECODE |
        +---------+ <--------------- +--------+
             \      drain decodes       /
              \                        /
               +------>  MIXED  <-----+     (both phases, chunked prefill co-batched with decode)
"""

from __future__ import annotations

from enum import Enum


class Role(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"

    @property
    def serves_prefill(self) -> bool:
        return self is not Role.DECODE

    @property
    def serves_decode(self) -> bool:
        return self is not Role.PREFILL


def role_resources(role: Role, slots: int) -> dict[str, float]:
    """Dask worker resources for an engine in `role`: both keys always present (0 where absent),
    because a task asking for a resource its worker never declared fails with KeyError."""
    return {
        "prefill": float(slots) if role.serves_prefill else 0.0,
        "decode": float(slots) if role.serves_decode else 0.0,
    }
