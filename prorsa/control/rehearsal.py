"""The policy's rehearsals: the body's simulator replaying trajectories under candidate splits.

    Rehearsal(rehearse, calibration)   over the body's rehearse (control/policy.py Rehearse), with
                                       the model the calibration corrects
    replay(specs, splits[, told]) -> {split: s}   each distinct split's makespan, kept in `log`
    times(specs, older, splits) -> {split: s}     `specs` as one step plus `older` as another
    over_resamples(times, base, specs, older, n) -> {split: s}   the finalists of `times` at their
                                       mean over it and n rehearsals of resampled steps
    split_name(split) -> str           "P1 D7 M0", or one such per engine group

A rehearsal decides nothing: adaptive.Prorsa (and ProrsaGroups) pick a split from what these
return, and the oracle logs its own replays beside them.
"""

from __future__ import annotations

from collections.abc import Sequence

from prorsa.agent.trace import TrajectorySpec
from prorsa.control.calibration import Calibration
from prorsa.control.policy import Rehearse
from prorsa.control.replayed import resampled

MAX_REHEARSED = 4096  # trajectories; past this a rehearsal of every candidate costs more than a step
# A rehearsed split must end the replayed step this much sooner than the split kept: the next step's
# trajectories are not the ones replayed, and a split's lead that small is within their difference
# (a replay of the same trajectories differs from the run by 1-2% on the paper cells). Chosen on the
# tuning set (adaptive.py's constants, evidence in docs/notes/allocator-experiments.md).
REHEARSAL_GAIN = 0.01
# a split rehearsed within this of the fastest is a finalist, ranked again over resampled steps;
# chosen on the tuning set (priors.py --table drivers --steps 3: no prior 0.961-1.004 -> 0.987-1.006)
FINALIST_BAND = 0.05


class Rehearsal:
    def __init__(self, rehearse: Rehearse | None, calibration: Calibration) -> None:
        self.rehearse = rehearse
        self.calibration = calibration
        self.log: list[dict] = []  # each rehearsal's makespans, for the record

    def replay(self, specs, splits: list, told: bool = True) -> dict:
        """Each distinct split's makespan replaying `specs` (the body's simulator), kept for the
        record; `told` False: as a run told no prior would (sim/rehearse.py)."""
        assert self.rehearse is not None
        model = {} if self.calibration.scale.exact else {"scale": self.calibration.scale}
        if not told:
            model["told"] = False
        if not hasattr(specs, "key"):  # one tuple for every split: hashed once for the rehearsal cache
            specs = tuple(specs)
        times = {c: self.rehearse(specs, c, **model) for c in dict.fromkeys(splits)}
        self.log.append(times)
        return times

    def times(self, specs, older: Sequence[TrajectorySpec], splits: list) -> dict:
        """Each split's makespan replaying `specs`, plus replaying `older` where given."""
        times = self.replay(specs, splits)
        if older and len(older) <= MAX_REHEARSED:
            more = self.replay(older, splits)
            times = {c: t + more[c] for c, t in times.items()}
        return times

    def over_resamples(self, times: dict, base, specs: Sequence[TrajectorySpec],
                       older: Sequence[TrajectorySpec], n: int) -> dict:
        """The finalists of `times` (the splits within FINALIST_BAND of the fastest, and `base`,
        the split kept unless beaten) at their mean over `times` and `n` rehearsals of resampled
        steps. A step's replay ranks splits a few percent apart by its own draw of lengths, and the
        next step is another draw: on tokens x4, three steps, the step that ran on 2:6 replayed all
        mixed 816.6 s and 2:6 828.2 s, over three resamples all mixed averaged 879.7 s and 2:6
        835.3 s; ranked by the one draw, prorsa ran 0.948 of the best fixed split, by the mean 1.000."""
        lead = min(times.values())
        finalists = [c for c in times if c == base or times[c] <= (1 + FINALIST_BAND) * lead]
        if n < 1 or len(finalists) < 2:
            return times
        total = {c: times[c] for c in finalists}
        for r in range(n):
            more = self.times(resampled(specs, r), resampled(older, r), finalists)
            total = {c: t + more[c] for c, t in total.items()}
        return {c: t / (n + 1) for c, t in total.items()}


def split_name(split) -> str:
    """(P, D, M), or one per engine group (control/adaptive_groups.py), in words."""
    if split and isinstance(split[0], tuple):
        return " | ".join(map(split_name, split))
    return "P{} D{} M{}".format(*split)
