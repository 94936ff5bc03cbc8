r"""Engine roles, shared by the brain (control/, agent/) and the bodies (engine/, live/, sim/).

A role is what the router asks an engine to do, not what the engine is: on vLLM both legs of a
disaggregated turn run on any engine, so a switch is draining plus bookkeeping.

        +---------+  drain prefills  +--------+
        | PREFILL | ---------------> | DECODE |
        +---------+ <--------------- +--------+
             \      drain decodes       /
              \                        /
               +------>  MIXED  <-----+     (both phases, chunked prefill co-batched with decode)

Where the KV connector has no role for both sides (vLLM deprecates kv_both for NIXL), an engine
is started as the side its role needs: a PREFILL engine exports KV, DECODE and MIXED engines pull
it (a mixed engine runs its own turns whole and decodes what prefill engines ship it, and never
prefills for another engine). A switch across that line is a restart (restarts_kv).
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

    @property
    def exports_kv(self) -> bool:
        """Whether an engine started for one side of the connector must be its producer."""
        return self is Role.PREFILL


def restarts_kv(old: Role, new: Role) -> bool:
    """Whether a switch old -> new changes the connector side, which an engine started without
    a role for both sides takes only by restarting."""
    return old.exports_kv != new.exports_kv


def role_resources(role: Role, slots: int) -> dict[str, float]:
    """Dask worker resources for an engine in `role`: both keys always present (0 where absent),
    because a task asking for a resource its worker never declared fails with KeyError."""
    return {
        "prefill": float(slots) if role.serves_prefill else 0.0,
        "decode": float(slots) if role.serves_decode else 0.0,
    }
