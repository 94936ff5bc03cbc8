"""Where prorsa opens a run told nothing, and what it rehearses of an earlier run (control/adaptive.py).

    Opener(context, capacity, rehearsal)
    unprimed(n) -> (split, held)   the no-prior opening: rehearsed least regret where it pays, else all mixed
    base(n) -> split | None        the split a prior's rehearsal must beat to be held
    specs() -> [TrajectorySpec]    the earlier run's trajectories the opening rehearses
    why(split, n, prior, on_prior) -> str   the opening in words, for the run's console

The choice between a prior's rehearsal, its steady state and the no-prior opening is the policy's
(Prorsa.initial_roles); this holds what a run told nothing would do and why.
"""

from __future__ import annotations

from functools import partial

from prorsa.agent.trace import TrajectorySpec
from prorsa.control.allocator import Capacity
from prorsa.control.opening import ASYNC_OPENING_WINDOWS, Opening, rehearsed_opening
from prorsa.control.policy import PolicyContext, WorkloadHint
from prorsa.control.rehearsal import Rehearsal
from prorsa.control.rehearsal import split_name as _split_name
from prorsa.control.replayed import fill

# an asynchronous run's opening rehearses this many `concurrency` of an earlier run: the first alone
# is the opening burst (priors.py --table phases at EP16, held all mixed, 0.963 of 4:0:4); chosen on
# the tuning set, as control/adaptive.py's constants are
OPENING_WINDOWS = 4
# the most engines whose opening is rehearsed: every split of n engines replayed for each plausible
# family costs ~n^2 (2n - 1 splits of n engines' trajectories); 32 is the most any measured cell
# rehearsed (the held-out 32-engine SWE MoE cell, 1,050 s of simulation). A cost bound, not a figure
# tuned: past it a run opens all mixed, not held, as engines of one rank did before
OPENING_MAX_ENGINES = 32


class Opener:
    def __init__(self, ctx: PolicyContext, capacity: Capacity, rehearsal: Rehearsal) -> None:
        self.capacity = capacity
        self.rehearsal = rehearsal
        self.concurrency = ctx.concurrency
        self.asynchronous = ctx.asynchronous
        self.prior_trajectories = ctx.prior_trajectories
        self.opening_prompts = ctx.opening_prompts
        self.updates = ctx.updates
        self.max_turns = ctx.max_turns
        self.told_prior = ctx.prior is not None  # the router prices moves by it, dropped or not
        self.opening: Opening | None = None  # the no-prior opening's choice and its regrets

    def unprimed(self, n_engines: int) -> tuple[tuple[int, int, int], bool]:
        """With nothing known of the workload, and whether it is held: where the body lends the
        simulator, the split of least worst-case regret over the workloads the opening prompts
        leave plausible, each rehearsed on the run's engines (control/opening.py), held as a prior's
        rehearsed split is (a sync step, an async run). One rule for every engine: the splits that
        pay are made before any decode has ended for the forecast to learn from (opened all mixed
        on drivers.py's turns-8 cell, the allocator ended at 0.820 of its best split; left to the
        fluid model and to replays of the first trajectories to complete, a rehearsed all mixed
        went back to P1 beside mixed under weight updates, 0.90 of best), and which split pays is
        the engines' and cost model's to say, not their width's. On the paper table's H200 dense
        cells it is all mixed, as the rule for engines of one rank (all mixed, not held) was
        before it: every figure the same. On the quickstart's vLLM CPU engines it is P1 beside 2
        mixed, and prorsa went from 0.951 of the best fixed split (all mixed for the first step)
        to 1.013 simulated; live, on engines the profile fits less well, 0.906 -> 0.850 of 2:1,
        two runs each (benchmarks/README.md, live-vllm-cell). With no simulator lent, all
        mixed, not held: the fluid model's steady states put every split at least 45% behind the
        best on some plausible family (P1 D7 on 8 EP4 engines, 45% on math-tir), and all mixed
        is colocated, the baseline; so past OPENING_MAX_ENGINES, where the rehearsal costs too much.
        Rehearsed once, as a run told no prior: a prior dropped later reopens on it (rehearsed
        under the wrong prior's move prices, a terminal run's dropped 3 s into SWE MoE sync reopened
        on P1 D7: 0.906 of the best fixed split; as told none, 0.962)."""
        mixed = (0, 0, n_engines)
        if n_engines < 2 or n_engines > OPENING_MAX_ENGINES or self.rehearsal.rehearse is None:
            return mixed, False
        if self.opening is None or sum(self.opening.split) != n_engines:
            c = self.concurrency or self.capacity.slots * n_engines
            told = not self.told_prior  # never told one: the world is already a no-prior run's
            self.opening = rehearsed_opening(partial(self.rehearsal.replay, told=told), n_engines, c,
                                             self.opening_prompts,
                                             ASYNC_OPENING_WINDOWS if self.asynchronous else 1, self.max_turns)
        return self.opening.split, True

    def base(self, n_engines: int) -> tuple[int, int, int] | None:
        """The split a prior's rehearsal must beat to be held: where a run told nothing would open
        (unprimed). A prior that passed the opening check has matched the prompts alone; its tool
        time and turns are checked only as the run shows them, and a prior found wrong then reopens
        there, draining the decodes on every engine that moves. Where the prior's rehearsal ranks
        every split alike, the no-prior opening costs it nothing: a terminal run's prior put all 15
        splits of drivers.py's turns-8 sync cell within 0.4%, held all mixed, and when it was
        dropped at 4 s three engines drained 11-23 s into P3 M5 (0.844 of the best fixed split;
        opened there, as with no prior, 0.998). None where no rehearsal can run."""
        if not self.prior_trajectories or self.rehearsal.rehearse is None or n_engines < 2:
            return None
        return self.unprimed(n_engines)[0]

    def specs(self) -> list[TrajectorySpec]:
        """What the opening rehearses of an earlier run: its first `concurrency` trajectories (a
        step's worth), or in an asynchronous run its first OPENING_WINDOWS x `concurrency`, which
        the rehearsal keeps `concurrency` in flight as the run will. A held split stays for the
        whole of an asynchronous run, and its first window alone is the opening burst: on the
        phases trace at EP16 with decodes spread 10%, the first 64 (one block's kind) rehearsed
        all mixed first and 4:0:4 1% behind, held all mixed (0.963 of 4:0:4); the first 256 at 64
        in flight put 4:0:4 5% ahead of all mixed."""
        if self.asynchronous and self.concurrency and len(self.prior_trajectories) > self.concurrency:
            return list(self.prior_trajectories[:OPENING_WINDOWS * self.concurrency])
        return fill(self.prior_trajectories, self.concurrency)

    def why(self, split: tuple[int, int, int], n_engines: int, prior: WorkloadHint | None, on_prior: bool) -> str:
        """The opening in words, for the run's console."""
        if on_prior:
            return (f"of the splits rehearsed on {len(self.prior_trajectories)} earlier trajectories, the one that "
                    "ended soonest (where none beat it by 1%, the split a run told nothing opens on); held through "
                    "the first step")
        later = " (an earlier run as --prior picks a split from the start)"
        if prior is None and self.opening is not None:
            fit = (f"of the workloads the {len(self.opening_prompts)} prompts in hand fit" if self.opening_prompts
                   else "of the plausible workloads (no prompts counted)")
            worst = max(self.opening.regret.values(), default=0.0)
            updates = ", with the declared weight updates" if self.updates is not None else ""
            return (f"no prior; {fit} ({', '.join(self.opening.considered)}), each rehearsed under every split"
                    f"{updates}: {_split_name(split)} has the least worst-case regret ({worst:.1%}); held "
                    f"through the {'run' if self.asynchronous else 'first step'}{later}")
        if prior is None:
            return f"no prior: every engine serves both phases until the run has shown its workload{later}"
        if split == (0, 0, n_engines):
            return "the prior's steady state scores no split clearly better than all mixed"
        return (f"the steady state of the prior's means ({prior.turns:.1f} turns of "
                f"{prior.decode_tokens:.0f} decoded tokens)")
