"""The replay a fluid-model move must pass: the trajectories that completed last, replayed under the
split as it is, the goal and the fluid model's best.

    ReplayVeto(rehearsal, concurrency)
    veto(current, goal, best, finished) -> str   why not to move ("" to move)
"""

from __future__ import annotations

from collections.abc import Sequence

from prorsa.agent.trace import TrajectorySpec
from prorsa.control.rehearsal import REHEARSAL_GAIN, Rehearsal, split_name
from prorsa.control.replayed import completed_since

# completed trajectories before a fluid-model move is replayed first: fewer replay only the short
# ones (SWE MoE async gave its prefill engines back at 25 s on 16 of them, 0.994 -> 0.931). Chosen
# on the tuning set (adaptive.py's constants).
VETO_EVIDENCE = 16


class ReplayVeto:
    def __init__(self, rehearsal: Rehearsal, concurrency: int) -> None:
        self.rehearsal = rehearsal
        self.concurrency = concurrency
        # (current, goal) -> the last trajectory completed when its replay refused the move
        self._refused: dict[tuple, str] = {}

    def __call__(self, current: tuple[int, int, int], goal: tuple[int, int, int], best: tuple[int, int, int],
                 finished: Sequence[TrajectorySpec]) -> str:
        """Why not to move to the fluid model's `goal` ("" to move): the last `concurrency`
        trajectories to complete, replayed in the simulator, do not end sooner under it than under
        the current split by REHEARSAL_GAIN, or end sooner still under the fluid model's `best`
        split by REHEARSAL_GAIN. The fluid model prices a horizon's demand as given, whatever the
        split; in a rollout the demand is the trajectories' own, slower where they are served
        slower, and the replay closes that loop (benchmarks/priors.py --table phases).
        The goal is the split cheapest to reach, and one reached without a drain can be a detour:
        on the phases trace at EP16 with decodes spread 10%, P0 D7 M1 (seven mixed engines turned
        decode, none draining) replayed 53.7 s against 57.0 s as all mixed, and was carried out,
        while P2 beside mixed, the fluid model's best, replayed 51.6 s (0.911 of the best fixed
        split; refused for it, 0.970).
        Until VETO_EVIDENCE trajectories have completed there is too little to replay and the
        fluid model decides alone: a run's opening moves, made while the engines are empty, are
        most of what an MoE run gains (held for evidence, EP16 sync lost all its gain over colocated).
        A goal refused stays refused until another quarter of `concurrency` has completed."""
        if self.rehearsal.rehearse is None or len(finished) < VETO_EVIDENCE:
            return ""
        if self._too_few_since(finished, self._refused.get((current, goal))):
            return f"{split_name(goal)} refused by its replay, too few completed since: "
        specs = self._window(finished)
        times = self.rehearsal.replay(specs, [current, goal, best])
        margin = self.rehearsal.calibration.margin(REHEARSAL_GAIN)
        if times[goal] * (1 + margin) >= times[current]:
            why = f"{times[goal]:.1f} s under it, {times[current]:.1f} s as now"
        elif times[best] * (1 + margin) < times[goal]:
            why = f"{times[goal]:.1f} s under it, {times[best]:.1f} s under {split_name(best)}"
        else:
            return ""
        self._refused[current, goal] = finished[-1].traj_id
        return f"{split_name(goal)} refused: the last {len(specs)} trajectories replayed end in {why}: "

    def _window(self, finished: Sequence[TrajectorySpec]) -> list[TrajectorySpec]:
        """What a mid-run replay replays: the last `concurrency` trajectories to complete."""
        return list(finished[-self.concurrency:]) if self.concurrency else list(finished)

    def _too_few_since(self, finished: Sequence[TrajectorySpec], last: str | None) -> bool:
        """Fewer than a quarter of `concurrency` completed since `last` (None: never replayed)."""
        return last is not None and completed_since(finished, last) < max(self.concurrency // 4, 1)
