"""The opening with nothing known of the run's workload: the engines' own (unprimed_opening), and
whether to open all mixed instead, by least worst-case regret over the plausible workloads
(regret_opening; control/adaptive.py _unprimed asks it that one thing).

    PLAUSIBLE                       the declared set of agentic workloads an opening must not lose
                                    much on: every built-in task family (agent/families.py)
    family_hint(name, concurrency)  one family as a WorkloadHint (the means of a fixed draw)
    unprimed_opening(ranks, n) -> (p, d, m)   the engines' own opening: all mixed, or on engines of
                                    several DP-attention ranks UNPRIMED_PREFILL_SHARE prefill beside mixed
    steady_forecast(hint, cap, n, n_bins, bin_s) -> Forecast   a workload's steady-state demand
    regret_opening(cap, n, concurrency, n_bins, bin_s, prompts) -> Opening
                                    the split whose largest regret over the plausible workloads is
                                    least, and what it is on each
    plausible(concurrency, prompts) -> {family: hint}   the families the prompts leave in
    family_trajectories(name, concurrency, n)   a fixed draw of a family, to rehearse
    least_regret({family: {split: s}}) -> Opening   the same rule over rehearsed times
    every_split(n)                  all mixed, every P:D, every P beside mixed
    rehearsed_opening(replay, n, concurrency, prompts) -> Opening   least_regret over the
                                    plausible families' draws, each replayed under every split

A split's regret on a workload is its steady-state cost (allocator.score over steady_forecast, the
fluid model the allocator plans with) over the best split's for that workload, less one. The
opening is the split with the least largest regret: the decision theorist's minimax-regret rule,
the one that holds when there is nothing to weigh the workloads by. The prompts in hand narrow the
set: a family whose mean prompt is more than PRIOR_TOLERANCE off theirs is not this run's
(control/prior_check.py's rule, the same one a prior is held to). The engines, their slots and
their cost model are the run's. The fluid model ranks splits coarsely (it overstates terminal's
regret for a second prefill engine), so prorsa takes from it only whether all mixed is the answer
for every plausible workload, not how many prefill engines (docs/notes/allocator-experiments.md).

The fluid model does not see prefix caches, so an asynchronous run whose pipeline declares weight
updates (each empties every cache) asks the simulator instead: each plausible family's fixed draw
is rehearsed with the updates under every fixed split, and least_regret picks one
(rehearsed_opening; control/adaptive.py _unprimed holds it through the run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from prorsa.agent.families import FAMILIES
from prorsa.agent.trace import TrajectorySpec, workload_means
from prorsa.agent.workload import Workload
from prorsa.config.workload import WorkloadConfig
from prorsa.control.allocator import Capacity, score, splits
from prorsa.control.forecast import Forecast
from prorsa.control.policy import WorkloadHint
from prorsa.control.prior_check import opening_contradiction
from prorsa.roles import Role

# With no prior, engines of several DP-attention ranks open with this share prefill beside mixed
# ones (at least one of each). Chosen on the 32 single-step cells of benchmarks/priors.py's paper
# and drivers tables whose engines have several ranks, of the shares 0, 1/4, 3/8 and 1/2: a quarter
# lost least (lowest 0.937 of the best fixed split, 2 cells below 0.97; all mixed: 0.820 and 13).
UNPRIMED_PREFILL_SHARE = 0.25
PLAUSIBLE = tuple(FAMILIES)
_DRAW = 512  # trajectories a family's means are taken over (fixed seed: the same hint every run)
# With declared weight updates, each plausible family's draw is rehearsed at this many times the
# run's concurrency (that many in flight): 2 ranked the splits of SWE and math-tir mixed (4 engines
# of EP8, 3 s updates every 30 s, seed 0: the tuning cell) as the run does, at half the cost of 4
# (benchmarks/async_updates.py)
UPDATES_OPENING_WINDOWS = 2


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


def plausible(concurrency: int, prompts: Sequence[int] = ()) -> dict[str, WorkloadHint]:
    """The families of PLAUSIBLE the prompts in hand leave in, as hints: a family the prompts
    contradict, as they would contradict it as a prior, is not this run's; prompts like no
    family's leave every family in."""
    hints = {f: family_hint(f, concurrency) for f in PLAUSIBLE}
    near = {f: h for f, h in hints.items() if not opening_contradiction(h, prompts)}
    return near or hints


def family_trajectories(name: str, concurrency: int, n: int) -> list[TrajectorySpec]:
    """`n` trajectories of a built-in family (a fixed draw: the same every run), to rehearse."""
    w = WorkloadConfig(family=name, mode="async", concurrency=concurrency, trajectories=n)
    draw = Workload.from_config(w, seed=0)
    return [draw.trajectory(i) for i in range(n)]


def every_split(n_engines: int) -> list[tuple[int, int, int]]:
    """All mixed, every P:D and every P prefill beside mixed ones: the fixed splits a rehearsal ranks."""
    return [(0, 0, n_engines), *((p, n_engines - p, 0) for p in range(1, n_engines)),
            *((p, 0, n_engines - p) for p in range(1, n_engines))]


def rehearsed_opening(replay: Callable[[list[TrajectorySpec], list[tuple[int, int, int]]], dict],
                      n_engines: int, concurrency: int, prompts: Sequence[int] = ()) -> Opening:
    """Of every_split, the one of least worst-case regret over the families the
    prompts leave in, each family's fixed draw (UPDATES_OPENING_WINDOWS x `concurrency`)
    timed by `replay` (trajectories, splits) -> {split: seconds}, which replays the run's
    declared weight updates. The fluid model, blind to the prefix caches every update empties,
    priced all mixed 20x P1 beside mixed on SWE and math-tir mixed (3 s updates every 30 s, 4
    engines of EP8) where the engines ran it 17% faster: opened on P1 beside mixed, prorsa gave
    it back at 442 s, 0.91 of the best fixed split."""
    cands = every_split(n_engines)
    return least_regret({f: replay(family_trajectories(f, concurrency, UPDATES_OPENING_WINDOWS * concurrency), cands)
                         for f in plausible(concurrency, prompts)})


def least_regret(times: dict[str, dict[tuple[int, int, int], float]]) -> Opening:
    """Of the splits every family in `times` was timed under (family -> split -> seconds), the one
    whose largest regret is least; of ties, the most mixed."""
    cands = list(next(iter(times.values())))
    regret = {f: {c: t[c] / max(min(t.values()), 1e-12) - 1.0 for c in cands} for f, t in times.items()}
    split = min(cands, key=lambda c: (round(max(r[c] for r in regret.values()), 9), -c[2], c[0]))
    return Opening(split, {f: round(r[split], 4) for f, r in regret.items()}, tuple(times))


def regret_opening(cap: Capacity, n_engines: int, concurrency: int, n_bins: int, bin_s: float,
                   prompts: Sequence[int] = ()) -> Opening:
    hints = plausible(concurrency, prompts)
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


def unprimed_opening(ranks: int, n_engines: int) -> tuple[int, int, int]:
    """The opening split with nothing known of the workload: all mixed on engines of one rank;
    on engines of several DP-attention ranks, UNPRIMED_PREFILL_SHARE of them prefill beside mixed
    ones. There a mixed engine steps at its slowest rank, so a prefill chunk on one rank stalls
    every rank's decodes, and the splits that pay are made in the run's first seconds, before
    any decode has ended for the forecast to learn from (opened all mixed on drivers.py's turns-8
    cell, the allocator reached its best split between 6 and 24 s, through drains of 11-23 s, and
    ended at 0.820 of it). The error is made on the side that is cheap to undo: a prefill
    engine holds no decodes, so turning it mixed or decode drains nothing, while a mixed engine
    turned prefill drains its decodes first."""
    if ranks <= 1 or n_engines < 2:
        return 0, 0, n_engines
    p = min(max(round(n_engines * UNPRIMED_PREFILL_SHARE), 1), n_engines - 1)
    return p, 0, n_engines - p


def steady_forecast(hint: WorkloadHint, cap: Capacity, n_engines: int, n_bins: int, bin_s: float) -> Forecast:
    """The demand of `hint.concurrency` trajectories cycling prefill -> decode -> tool at their
    means, the engines half-way through the trajectories' contexts."""
    context = hint.prompt_tokens + (hint.observation_tokens + hint.decode_tokens) * max(hint.turns - 1, 0) / 2
    batch = min(hint.concurrency / n_engines, cap.slots)
    dec, pre = cap.for_role(Role.DECODE), cap.for_role(Role.PREFILL)
    for _ in range(3):  # the decode rate depends on the batch, the batch on the time spent decoding
        tps = 1.0 / max(dec.decode_step(max(batch, 1.0), context), 1e-9)
        decode_s = hint.decode_tokens / tps
        cycle = decode_s + hint.tool_s + pre.prefill_latency(hint.observation_tokens, context)
        seqs = min(hint.concurrency * decode_s / cycle, n_engines * cap.slots)
        batch = min(seqs / n_engines, cap.slots)
    turns_per_s = hint.concurrency / cycle * (1 - 1 / max(hint.turns, 1.0))
    return Forecast(
        start_s=0.0, bin_s=bin_s, prefill_tokens_per_s=np.full(n_bins, turns_per_s * hint.observation_tokens),
        prefill_turns_per_s=np.full(n_bins, turns_per_s), decode_seqs=np.full(n_bins, seqs),
        kv_tokens=np.full(n_bins, seqs * context), prefill_prefix_tokens=context,
        decode_tokens_per_turn=hint.decode_tokens, decode_tps_per_seq=tps,
        decode_remaining_tokens=hint.decode_tokens / 2, live=hint.concurrency)
