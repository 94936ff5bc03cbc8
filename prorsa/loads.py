"""What an engine holds at a moment: the one record every side of a run reads it in.

The engine reports it (`Engine.stats()`: EngineStats adds its counters), the scheduler builds it
from the legs it has sent each engine worker (cluster/lifecycle_plugin.py), the policy reads it
(`Snapshot.engines`), the recorder samples it (`EngineSample` adds the time) and the dashboard
shows it. A side fills the fields it can see and leaves the rest 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from prorsa.roles import Role


@dataclass(frozen=True)
class EngineLoad:
    engine_id: str
    role: Role  # observed role
    queued: int = 0  # requests waiting for admission
    active: int = 0  # sequences admitted (prefilling or decoding)
    # KV tokens written by admitted sequences: their contexts and what they have decoded so far
    # (never a reservation for tokens still to come: that would tell how long each turn decodes)
    kv_tokens: int = 0
    kv_capacity: int = 0  # KV tokens the engine can hold
    queued_prefill_tokens: int = 0  # prompt tokens of the prefills waiting there
    prefill_legs: int = 0  # prefill legs sent to it and not yet finished (the scheduler's view)
    decode_legs: int = 0  # decode or generate legs sent to it and not yet finished

    @property
    def kv_use(self) -> float:
        return self.kv_tokens / self.kv_capacity if self.kv_capacity else 0.0

    @classmethod
    def of(cls, load: EngineLoad) -> EngineLoad:
        """The load fields alone of a richer record (EngineStats), to keep one per sample."""
        return load if type(load) is cls else cls(*(getattr(load, f.name) for f in _FIELDS))


_FIELDS = fields(EngineLoad)
