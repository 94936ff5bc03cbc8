"""`prorsa` over engine groups: the same policy, its splits one (P, D, M) per group.

    ProrsaGroups(args, context)   what `prorsa` builds where the pipeline declares engines.groups
                                   (PolicyContext.groups); without groups it builds Prorsa as ever

Every step of adaptive.Prorsa is kept (the opening rehearsed on an earlier run's trajectories, the
steady split of a prior, votes, replays before a move, the step-boundary rehearsal); what changes is
the split: counts per group, priced by group_search (each group's engines by their own cost model
and slots) and rehearsed in the simulator engine by engine (sim/rehearse.py). Candidates never
leave a group's roles, and WithinGroups still clips whatever is asked.

Where adaptive.Prorsa defaults to all mixed (no prior; a steady state or a rehearsal that does not
beat it clearly), the groups' declared openings stand (each engine in its group's first role: what
the pipeline says the group is for). Rehearsed at a step's start: the openings, the most-mixed
split (mixed wherever a group allows it), the fluid model's pick, and through the pick and through
the openings, each group's counts along its P:D and P:M lines with the other groups held (about
four times the engines; a group's best counts often lie beside the others' declared roles).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from prorsa.config.policies import ProrsaArgs
from prorsa.control.adaptive import MAX_REHEARSED, REHEARSAL_GAIN, Prorsa, reassign
from prorsa.control.replayed import fill
from prorsa.control.opening import steady_forecast
from prorsa.control.allocator import ROLES, Capacity
from prorsa.control.group_search import (Group, GroupAllocator, GroupSplit, group_roles, most_mixed, openings,
                                         score_groups, serves_both)
from prorsa.control.policy import Decision, PolicyContext, Snapshot, WorkloadHint, register
from prorsa.engine.registry import engine_name
from prorsa.loads import EngineLoad
from prorsa.roles import Role

_TIE = 1e-3  # as adaptive._TIE: steady-state costs this close are the fluid model's tie


class ProrsaGroups(Prorsa):
    def __init__(self, args: ProrsaArgs | None = None, *, context: PolicyContext) -> None:
        assert context.groups is not None
        # the steady state's demand is estimated on the group that holds the most decode slots
        # (what paces the trajectories); the split itself is priced group by group
        rep = max((g for g in context.groups if Role.DECODE in g.roles or Role.MIXED in g.roles),
                  key=lambda g: g.count * g.slots, default=context.groups[0])
        super().__init__(args, context=replace(context, cost=rep.cost, slots=rep.slots,
                                                kv_capacity_tokens=rep.kv_capacity_tokens, layouts=None))
        self.groups = tuple(Group(g.count, g.roles, Capacity.from_cost(g.cost, g.slots, g.kv_capacity_tokens))
                            for g in context.groups)
        a = self.allocator
        self.allocator = GroupAllocator(self.groups, hysteresis=a.hysteresis,
                                        max_switches_per_interval=a.max_switches, min_gain=a.min_gain)

    def initial_roles(self, n_engines: int) -> list[Role]:
        if sum(g.count for g in self.groups) != n_engines:
            raise ValueError(f"the groups declare {sum(g.count for g in self.groups)} engines, the run has {n_engines}")
        goal = self._steady_split(self.prior, n_engines)
        split = self._rehearsed(fill(self.prior_trajectories, self.concurrency), n_engines, goal)
        self._held_on_prior = self._held is not None
        self.calibration.begin(0.0, split)
        self.opening_reason = self._why_opening(split, n_engines)
        return group_roles(self.groups, split)

    def _why_opening(self, split, n_engines: int) -> str:
        if self._held_on_prior:
            return super()._why_opening(split, n_engines)
        if self.prior is None:
            return "no prior: each group opens in its declared role until the run has shown its workload"
        if split == openings(self.groups):
            return "the prior's steady state scores no split of the groups clearly better than their declared roles"
        return super()._why_opening(split, n_engines)

    def _steady_split(self, hint: WorkloadHint | None, n_engines: int, keep: GroupSplit | None = None) -> GroupSplit:
        """adaptive.Prorsa._steady_split over the groups: keep (default the groups' openings) unless
        the steady state of `hint` scores a split better by min_gain; of ties, the most mixed."""
        keep = keep or openings(self.groups)
        if hint is None or n_engines < 2:
            return keep
        fc = steady_forecast(hint, self.capacity, n_engines, self.forecaster.n_bins, self.forecaster.bin_s)
        cands, costs = self.allocator.priced(lambda c: score_groups(self.groups, fc, c),
                                             starts=(keep, openings(self.groups)))
        kept = costs[(cands == np.array(keep)[None]).all(axis=(1, 2))]
        if len(kept) and kept[0] <= (1 + self.allocator.min_gain) * float(costs.min()):
            return keep
        tied = cands[costs <= (1 + _TIE) * float(costs.min())]
        tot = tied.sum(axis=1)
        return _key(tied[np.lexsort((tot[:, 0], -tot[:, 2]))[0]])

    def _rehearsed(self, specs, n_engines: int, fluid, older=(), resamples: int = 0) -> GroupSplit:
        if self.rehearse is None or not specs or n_engines < 2 or len(specs) > MAX_REHEARSED:
            return fluid
        declared = openings(self.groups)
        cands = [declared, most_mixed(self.groups), fluid, *self._lines(fluid), *self._lines(declared)]
        cands = [c for c in dict.fromkeys(cands) if serves_both(np.array([c]))[0]]
        times = self.rehearsal.over_resamples(self.rehearsal.times(specs, older, cands), declared, specs, older,
                                              resamples)
        best = min(times, key=lambda c: (times[c], cands.index(c)))
        self._held = best if times[best] * (1 + self.calibration.margin(REHEARSAL_GAIN)) < times[declared] else declared
        return self._held

    def _lines(self, base: GroupSplit) -> list[GroupSplit]:
        """Each group's P:D and P:M lines (within its roles) with the other groups at `base`."""
        out = []
        for j, g in enumerate(self.groups):
            n = g.count
            for p in range(n + 1):
                for s in ((p, n - p, 0), (p, 0, n - p)):
                    if all(c == 0 or r in g.roles for c, r in zip(s, ROLES)):
                        out.append(tuple(s if i == j else b for i, b in enumerate(base)))
        return out

    def between_steps(self, snapshot: Snapshot) -> Decision:
        engines, goal, why = self._next_step(snapshot)
        engines = in_order(engines)
        targets, at = {}, 0
        for g, counts in zip(self.groups, goal):  # each group toward its own counts, moving the fewest
            targets |= reassign(engines[at:at + g.count], counts)
            at += g.count
        self._requests.ask(targets, snapshot.time_s)
        return Decision(targets, why)

    def decide(self, snapshot: Snapshot) -> Decision:
        # the allocator reads the engines group by group, in engine order
        return super().decide(replace(snapshot, engines=tuple(in_order(list(snapshot.engines)))))


def in_order(engines: list[EngineLoad]) -> list[EngineLoad]:
    """Engines in engine order (e0, e1, ..., e10): the groups' order."""
    index = {engine_name(i): i for i in range(len(engines))}
    return sorted(engines, key=lambda e: index.get(e.engine_id, len(index)))


def _key(c: np.ndarray) -> GroupSplit:
    return tuple(tuple(int(x) for x in row) for row in c)


@register("prorsa", args=ProrsaArgs)
def prorsa(args: ProrsaArgs | None = None, *, context: PolicyContext | None = None):
    if context is not None and context.groups is not None:
        return ProrsaGroups(args, context=context)
    return Prorsa(args, context=context)


prorsa.__doc__ = Prorsa.__doc__
