"""summary.json's headline figures as a typed record (outputs.summarise builds it, write_summary
writes it with what a live run, a simulation or training adds beside it).

    RunSummary(...)              the figures every run has, each documented (help(RunSummary))
    RunSummary.of(data)          from a summary.json's dict; keys it does not hold are ignored
    summary.as_dict()            for summary.json, key for key
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class RunSummary:
    """The headline figures of one run, as summary.json holds them. Times are seconds since the
    rollout began on the run's clock (summary.json `clock`: wall for `prorsa run`, body seconds
    of the cost model for `prorsa sim`); rates are per second of that clock.

    Attributes:
        name: the pipeline's name.
        policy: the policy that placed roles (colocated, static:P:D, prorsa, ...).
        config_hash: a digest of the resolved pipeline: two runs with the same one ran the same configuration.
        makespan_s: seconds from the first trajectory's start to the last one's end.
        trajectories_expected: trajectories the workload asked for (prompts x group size x steps).
        trajectories_completed: of those, played to their final turn.
        trajectories_failed: ended by an error (an engine, a tool, the context limit).
        trajectories_dropped: partial rollouts only: cancelled at a step's end or stale, untrained, no failure.
        trajectories_per_s: completed trajectories per second of the makespan; None for a makespan of 0.
        turns: turns played, over every trajectory.
        prefill_tokens: tokens appended and prefilled (prompts and observations).
        cached_tokens: context tokens served from an engine's prefix cache instead of prefilled again.
        recomputed_tokens: context tokens prefilled again (their prefix was not cached on that engine).
        prefix_hit_rate: cached / (cached + recomputed), a share from 0 to 1; None without context to reuse.
        decode_tokens: tokens generated.
        tokens_per_s: prefill and decode tokens per second of the makespan.
        decode_tokens_per_s: generated tokens per second of the makespan.
        role_switches: engines that changed role during the run.
        forecast_mape: the policy's demand forecast error at its last scored interval, per metric,
            as a share (0.1 = 10%); None for a policy that does not forecast.
        mean_trajectory_s: mean seconds from a completed trajectory's start to its end.
    """

    name: str
    policy: str
    config_hash: str
    makespan_s: float
    trajectories_expected: int
    trajectories_completed: int
    trajectories_failed: int
    trajectories_dropped: int
    trajectories_per_s: float | None
    turns: int
    prefill_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    prefix_hit_rate: float | None
    decode_tokens: int
    tokens_per_s: float | None
    decode_tokens_per_s: float | None
    role_switches: int
    forecast_mape: dict[str, float] | None
    mean_trajectory_s: float | None

    @classmethod
    def of(cls, data: dict[str, Any]) -> RunSummary:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
