"""With nothing known of the run's workload: the split of least worst-case regret over the plausible
workloads. prorsa asks it one thing, whether to open all mixed (control/adaptive.py _unprimed).

    PLAUSIBLE                       the declared set of agentic workloads an opening must not lose
                                    much on: every built-in task family (agent/families.py)
    family_hint(name, concurrency)  one family as a WorkloadHint (the means of a fixed draw)
    regret_opening(cap, n, concurrency, n_bins, bin_s, prompts) -> Opening
                                    the split whose largest regret over the plausible workloads is
                                    least, and what it is on each

A split's regret on a workload is its steady-state cost (allocator.score over steady_forecast, the
fluid model the allocator plans with) over the best split's for that workload, less one. The
opening is the split with the least largest regret: the decision theorist's minimax-regret rule,
the one that holds when there is nothing to weigh the workloads by. The prompts in hand narrow the
set: a family whose mean prompt is more than PRIOR_TOLERANCE off theirs is not this run's
(control/prior_check.py's rule, the same one a prior is held to). The engines, their slots and
their cost model are the run's. The fluid model ranks splits coarsely (it overstates terminal's
regret for a second prefill engine), so prorsa takes from it only whether all mixed is the answer
for every plausible workload, not how many prefill engines (docs/notes/allocator-experiments.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from prorsa.agent.families import FAMILIES
from prorsa.agent.trace import workload_means
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import WorkloadConfig
from prorsa.control.allocator import Capacity, score, splits
from prorsa.control.policy import WorkloadHint
from prorsa.control.prior_check import PRIOR_SAMPLES, PRIOR_TOLERANCE

PLAUSIBLE = tuple(FAMILIES)
_DRAW = 512  # trajectories a family's means are taken over (fixed seed: the same hint every run)


@dataclass(frozen=True)
class Opening:
    split: tuple[int, int, int]  # prefill, decode, mixed engines
    regret: dict[str, float]  # family -> the split's regret on it
    considered: tuple[str, ...]  # the families the prompts left in


@lru_cache(maxsize=None)
def _means(name: str) -> tuple[tuple[str, float], ...]:
    w = WorkloadConfig(family=name, mode="sync", prompts=_DRAW // 8, group_size=8)
    return tuple(workload_means(Workload.from_config(w, seed=0).trajectories_for_step(0)).items())


def family_hint(name: str, concurrency: int) -> WorkloadHint:
    return WorkloadHint(concurrency=concurrency, **dict(_means(name)))


def regret_opening(cap: Capacity, n_engines: int, concurrency: int, n_bins: int, bin_s: float,
                   prompts: Sequence[int] = ()) -> Opening:
    from prorsa.control.adaptive import steady_forecast  # the steady state the allocator plans a prior's

    hints = {f: family_hint(f, concurrency) for f in PLAUSIBLE}
    if len(prompts) >= PRIOR_SAMPLES:
        mean = sum(prompts) / len(prompts)
        near = {f: h for f, h in hints.items() if 1 / PRIOR_TOLERANCE <= mean / h.prompt_tokens <= PRIOR_TOLERANCE}
        hints = near or hints  # prompts like no family's: every family stays plausible
    cands = splits(n_engines)
    worst = np.zeros(len(cands))
    regret = {}
    for name, hint in hints.items():
        fc = steady_forecast(hint, cap, n_engines, n_bins, bin_s)
        costs = score(cap, fc, cands[:, 0], cands[:, 1], cands[:, 2])
        r = costs / max(float(costs.min()), 1e-12) - 1.0
        regret[name] = r
        worst = np.maximum(worst, r)
    # of splits tied on their worst regret, the most mixed: it serves either phase at once
    tied = np.flatnonzero(worst <= worst.min() + 1e-9)
    k = int(tied[np.lexsort((cands[tied, 0], -cands[tied, 2]))[0]])
    p, d, m = (int(x) for x in cands[k])
    return Opening((p, d, m), {f: round(float(r[k]), 4) for f, r in regret.items()}, tuple(hints))
