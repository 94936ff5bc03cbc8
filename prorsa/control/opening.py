"""The opening with nothing known of the run's workload: the split of least worst-case regret over
a declared set of plausible agentic workloads, narrowed by the prompts in hand.

    PLAUSIBLE                       the declared set of agentic workloads an opening must not lose
                                    much on: every built-in task family (agent/families.py)
    plausible(prompts) -> (family, ...)   the families the prompts leave in
    family_trajectories(name, concurrency, n, max_turns) -> FamilyDraw   a fixed draw of a family,
                                    to rehearse, drawn when first read
    every_split(n)                  all mixed, every P:D, every P beside mixed
    rehearsed_opening(replay, n, concurrency, prompts, windows, max_turns) -> Opening
                                    least_regret over the plausible families' draws, each replayed
                                    (the body's simulator) under every split
    least_regret({family: {split: s}}) -> Opening   the split whose largest regret is least
    steady_forecast(hint, cap, n, n_bins, bin_s) -> Forecast   a workload's steady-state demand

A split's regret on a workload is its time over the best split's for that workload, less
one. The opening is the split with the least largest regret: the decision theorist's minimax-regret
rule, the one that holds when there is nothing to weigh the workloads by. The prompts in hand
narrow the set: a family whose mean prompt is more than PRIOR_TOLERANCE off theirs is not this
run's (control/prior_check.py's rule, the same one a prior is held to). The engines, their slots,
their cost model, the run's concurrency, turn cap, context bound and declared weight updates are the
run's: the rehearsal is the run's own simulator replaying each family's fixed draw (nothing of the
run's trajectories) as the pipeline shapes it. The fluid model alone ranks splits coarsely (it
overstates terminal's regret for a second prefill engine, and does not see the prefix caches a weight
update empties), so it decides only where no simulator is lent (docs/notes/allocator-experiments.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from prorsa.agent.families import FAMILIES
from prorsa.agent.trace import TrajectorySpec
from prorsa.agent.workload import Workload
from prorsa.config.workload import WorkloadConfig
from prorsa.control.allocator import Capacity
from prorsa.control.forecast import Forecast
from prorsa.control.policy import WorkloadHint
from prorsa.control.prior_check import opening_contradiction
from prorsa.roles import Role

PLAUSIBLE = tuple(FAMILIES)
_DRAW = 512  # trajectories a family's mean prompt is taken over (fixed seed: the same every run)
# An asynchronous run's opening rehearses each plausible family's draw at this many times the run's
# concurrency (that many in flight; a synchronous run's, one step of it): 2 ranked the splits of SWE
# and math-tir mixed (4 engines of EP8, 3 s updates every 30 s, seed 0: the tuning cell) as the run
# does, at half the cost of 4 (benchmarks/async_updates.py)
ASYNC_OPENING_WINDOWS = 2


@dataclass(frozen=True)
class Opening:
    split: tuple[int, int, int]  # prefill, decode, mixed engines
    regret: dict[str, float]  # family -> the split's regret on it
    considered: tuple[str, ...]  # the families the prompts left in


@lru_cache(maxsize=None)
def _prompt_hint(name: str) -> WorkloadHint:
    """A family's mean prompt over a fixed draw of _DRAW // 8 prompts (a group's members share
    theirs), as a hint stating nothing else: 0 is what a hint leaves unsaid (prior_check.py)."""
    w = WorkloadConfig(family=name, mode="sync", prompts=_DRAW // 8, group_size=1)
    prompts = [s.turns[0].appended_tokens for s in Workload.from_config(w, seed=0).trajectories_for_step(0)]
    return WorkloadHint(concurrency=0, prompt_tokens=sum(prompts) / len(prompts), observation_tokens=0.0,
                        decode_tokens=0.0, tool_s=0.0, turns=0.0)


def plausible(prompts: Sequence[int] = ()) -> tuple[str, ...]:
    """The families of PLAUSIBLE the prompts in hand leave in: a family whose mean prompt they
    contradict, as they would contradict it as a prior, is not this run's; prompts like no
    family's leave every family in."""
    return tuple(f for f in PLAUSIBLE if not opening_contradiction(_prompt_hint(f), prompts)) or PLAUSIBLE


def family_trajectories(name: str, concurrency: int, n: int, max_turns: int | None = None) -> FamilyDraw:
    """`n` trajectories of a built-in family (a fixed draw: the same every run), to rehearse;
    `max_turns`: the pipeline's cap on turns (SWE's draw runs to 40 turns where a pipeline caps 12)."""
    return FamilyDraw(name, concurrency, n, max_turns)


class FamilyDraw(Sequence[TrajectorySpec]):
    """A family's fixed draw, drawn when first read. `key` names it: a rehearsal kept across runs
    (sim/rehearsal_cache.py) is found by the name, with nothing drawn."""

    def __init__(self, name: str, concurrency: int, n: int, max_turns: int | None) -> None:
        self.key = ("family", name, concurrency, n, max_turns)
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return self._specs[i]

    @cached_property
    def _specs(self) -> list[TrajectorySpec]:
        _, name, concurrency, n, max_turns = self.key
        w = WorkloadConfig(family=name, mode="async", concurrency=concurrency, trajectories=n, max_turns=max_turns)
        draw = Workload.from_config(w, seed=0)
        return [draw.trajectory(i) for i in range(n)]


def every_split(n_engines: int) -> list[tuple[int, int, int]]:
    """All mixed, every P:D and every P prefill beside mixed ones: the fixed splits a rehearsal ranks."""
    return [(0, 0, n_engines), *((p, n_engines - p, 0) for p in range(1, n_engines)),
            *((p, 0, n_engines - p) for p in range(1, n_engines))]


def rehearsed_opening(replay: Callable[[Sequence[TrajectorySpec], list[tuple[int, int, int]]], dict],
                      n_engines: int, concurrency: int, prompts: Sequence[int] = (), windows: int = 1,
                      max_turns: int | None = None) -> Opening:
    """Of every_split, the one of least worst-case regret over the families the prompts leave in,
    each family's fixed draw (`windows` x `concurrency` trajectories, turns capped at `max_turns`)
    timed by `replay` (trajectories, splits) -> {split: seconds}: the body's simulator, which runs
    them as the pipeline does (its concurrency, context bound and weight updates).
    Where it replaced a quarter of the engines prefill beside mixed (chosen on the paper and drivers
    tables), no no-prior MoE cell lost and the held-out ones gained: SWE MoE sync on 4 engines
    0.930 -> 1.000 of the best fixed split, SWE MoE async 0.991-0.994 -> 1.000; with weight updates
    on a clock the fluid model priced all mixed 20x P1 beside mixed on SWE and math-tir mixed where
    the engines ran it 17% faster (opened on P1 beside mixed, 0.91 of the best fixed split)."""
    cands = every_split(n_engines)
    return least_regret({f: replay(family_trajectories(f, concurrency, windows * concurrency, max_turns), cands)
                         for f in plausible(prompts)})


def least_regret(times: dict[str, dict[tuple[int, int, int], float]]) -> Opening:
    """Of the splits every family in `times` was timed under (family -> split -> seconds), the one
    whose largest regret is least; of ties, the most mixed."""
    cands = list(next(iter(times.values())))
    regret = {f: {c: t[c] / max(min(t.values()), 1e-12) - 1.0 for c in cands} for f, t in times.items()}
    split = min(cands, key=lambda c: (round(max(r[c] for r in regret.values()), 9), -c[2], c[0]))
    return Opening(split, {f: round(r[split], 4) for f, r in regret.items()}, tuple(times))


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
