"""What a run records while it goes; the writers turn it into files afterwards.

    on_turn(spec, result)       a turn finished (from the trajectory loop)
    on_done(result)             a trajectory finished (completed or failed)
    sample(t, loads)            a snapshot of every engine (from the body's sampler): EngineLoad
                                records (EngineStats, or an emulated engine's load())
    role_change(change)         the controller moved an engine
    control(record)             one control interval: observed roles, the decision, its forecast
    merged(recorders, expected) -> RunRecorder   several of one run on one clock (cells: one a
                                cell) as one, for the writers

Counters are updated in place so the progress display reads them without copying.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.workload import TrajectorySpec
from prorsa.control.forecast import ForecastSummary
from prorsa.loads import EngineLoad
from prorsa.roles import Role


@dataclass(frozen=True)
class EngineSample:
    t: float  # seconds since the rollout began
    load: EngineLoad  # the engine's own reading then


@dataclass(frozen=True)
class RoleChange:
    t: float
    engine: str
    from_role: Role
    to_role: Role
    reason: str  # the forecast or rule that justified it
    drain_s: float  # time from request to the engine serving its new role
    forecast: ForecastSummary | None = None  # the demand behind it


@dataclass(frozen=True)
class ControlRecord:
    t: float
    roles: dict[str, Role]  # observed at the start of the interval
    reason: str
    forecast: ForecastSummary | None  # the policy's, if it forecasts
    forecast_error: dict[str, float]  # MAPE per horizon bin (e.g. "prefill_tps@0-0.5s"), as known at t


DROPPED = ("cancelled", "stale")  # a partial rollout's untrained trajectories: no failure (rollout/partial.py)


@dataclass
class RunRecorder:
    engines: list[str]
    slots: int | dict[str, int]  # concurrent requests one engine admits (engines.groups: each engine's)
    expected: int | None  # trajectories expected; None for an async run bounded by time
    samples: list[EngineSample] = field(default_factory=list)
    trajectories: list[TrajectoryResult] = field(default_factory=list)
    role_changes: list[RoleChange] = field(default_factory=list)
    controls: list[ControlRecord] = field(default_factory=list)
    turns: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0
    decode_tokens: int = 0
    completed: int = 0
    failed: int = 0
    dropped: int = 0  # partial rollouts: cut at a step's end or past the staleness bound, untrained

    def on_turn(self, spec: TrajectorySpec, res: TurnResult) -> None:
        self.turns += 1
        self.prefill_tokens += res.prefill_tokens
        self.cached_tokens += res.cached_tokens
        self.recomputed_tokens += res.recomputed_tokens
        self.decode_tokens += res.decode_tokens

    def prefix_hit_rate(self) -> float | None:
        """Of the context tokens later turns found already computed, the share a prefix cache
        served (the rest were prefilled again); None before any later turn."""
        reusable = self.cached_tokens + self.recomputed_tokens
        return round(self.cached_tokens / reusable, 4) if reusable else None

    def on_done(self, result: TrajectoryResult) -> None:
        self.trajectories.append(result)
        if result.status == "completed":
            self.completed += 1
        elif result.status in DROPPED:
            self.dropped += 1
        else:
            self.failed += 1

    def sample(self, t: float, loads: Iterable[EngineLoad]) -> None:
        self.samples.extend(EngineSample(t, EngineLoad.of(x)) for x in loads)

    def role_change(self, change: RoleChange) -> None:
        self.role_changes.append(change)

    def control(self, record: ControlRecord) -> None:
        self.controls.append(record)

    def latest_roles(self) -> dict[str, Role]:
        roles: dict[str, Role] = {}
        for s in self.samples[-len(self.engines):]:
            roles[s.load.engine_id] = s.load.role
        return roles

    def utilisation(self) -> dict[str, float]:
        """Per role, latest sample: admitted sequences over the slots of the engines in that role."""
        by_role: dict[str, list[EngineLoad]] = {}
        for s in self.samples[-len(self.engines):]:
            by_role.setdefault(s.load.role.value, []).append(s.load)
        def slots(load: EngineLoad) -> int:
            return self.slots[load.engine_id] if isinstance(self.slots, dict) else self.slots

        return {role: sum(x.active for x in xs) / sum(map(slots, xs)) for role, xs in by_role.items()}


def merged(recorders: Sequence[RunRecorder], expected: int | None) -> RunRecorder:
    """Engines in the order first seen (an engine moved between cells is one engine), records in
    time order, counters summed. The recorders must share a clock."""
    engines = list(dict.fromkeys(e for r in recorders for e in r.engines))
    slots = recorders[0].slots
    out = RunRecorder(engines, slots, expected)
    out.samples = sorted((s for r in recorders for s in r.samples), key=lambda s: s.t)
    out.trajectories = sorted((t for r in recorders for t in r.trajectories), key=lambda t: t.end_s)
    out.role_changes = sorted((c for r in recorders for c in r.role_changes), key=lambda c: c.t)
    out.controls = sorted((c for r in recorders for c in r.controls), key=lambda c: c.t)
    for k in ("turns", "prefill_tokens", "cached_tokens", "recomputed_tokens", "decode_tokens", "completed", "failed",
              "dropped"):
        setattr(out, k, sum(getattr(r, k) for r in recorders))
    return out
