"""What moving a turn off its trajectory's engine costs and what it saves, priced by the cost model.

    MoveCost(cost, slots, decode_tokens)     one engine's step times, its slots, a turn's mean decode
    move_s(leg, context, appended, stalled)  what the move adds: the whole context prefilled again
                                             (or, for a decode leg, pulled whole), and the stall that
                                             recompute puts on the `stalled` sequences co-batched
                                             with it
    wait_s(leg, load, backlog, kv, decode)   what a new leg waits on an engine holding `load` turns,
                                             `kv` tokens of their KV and `backlog` prefill tokens,
                                             beyond what an idle engine would make it wait, for a
                                             decode of `decode` tokens (None: the mean turn's)

The router (runtime.sticky_overload: cost) moves a turn when the wait it avoids is more than what
the move adds. Both sides are turn-seconds of the body clock (seconds summed over the turns the
choice touches), from the same roofline the emulated engine steps with, so the rule needs nothing
measured and runs alike live and simulated.

What a move adds: a recomputed context runs in chunked-prefill steps, and on an engine that also
decodes (mixed, or one DP-attention group under expert parallelism) each of those steps is one in
which every co-batched decode waits for the prefill, so the recompute is counted once for the turn
and once for each sequence it stalls. At 16k-64k-token contexts that stall, not the turn's own
recompute, is most of the price (benchmarks/phases.py).

What it avoids: a queue. On a prefill engine, the backlog ahead over the engine's prefill rate.
On an engine that decodes, the turns it cannot admit yet (past its slots, or past its KV at the
mean context it holds) wait for whole decodes to end, one wave of admitted turns at a time; a
turn the engine admits meets only a bigger batch, whose steps are slower. Pricing more than that
(what its KV reads add to its neighbours' steps, or the prefill interference a busier mixed
engine suffers) made the rule move more and lose: up to 4% of colocated's throughput on SWE and
7% on the phase workloads, against never moving for load.
A turn's decode length is not known when it is routed (a live turn decodes to EOS): the mean of
the decodes seen so far stands for it (`learn`), starting from the prior's mean, or the
forecaster's default prior where the run has none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

from prorsa.costmodel import CostModel


@dataclass(eq=False)
class MoveCost:
    cost: CostModel
    slots: int
    decode_tokens: float  # a turn's mean decode: the prior's until decodes are seen, then theirs
    budget: int = 8192  # prefill tokens a rank computes in one step (the engines' max_batched_tokens)
    prior_weight: float = 8.0  # decodes the starting mean is worth against observed ones

    def __post_init__(self) -> None:
        self._prior = float(self.decode_tokens)
        self._total, self._n = 0.0, 0  # the decodes observed
        # The router prices every engine for a turn that may move, and between two turns most
        # engines hold the same load and KV: remember their step-time factor (not the wait, which
        # scales with the decode mean that `learn` updates at every decode).
        self._decode_steps = lru_cache(maxsize=1 << 14)(self._decode_steps_uncached)

    def learn(self, tokens: int) -> None:
        self._total += tokens
        self._n += 1
        w = self.prior_weight
        self.decode_tokens = (w * self._prior + self._total) / (w + self._n)

    @cached_property
    def prefill_rate(self) -> float:
        """Prefill tokens a second the engine clears at full steps (every rank's budget)."""
        return self.budget * self.cost.ep / self.cost.prefill_time([(self.budget, 0)])

    @cached_property
    def _kv_capacity(self) -> int:  # KV tokens the engine can hold, every rank's (not what it holds now)
        return self.cost.kv_capacity_tokens() * self.cost.ep

    def turn_kv(self, context: int, appended: int) -> int:
        """KV tokens a turn holds on its decode engine by the end of its decode, that decode
        counted at the mean learned so far: its own length is known only once it has ended."""
        return context + appended + int(self.decode_tokens)

    def move_s(self, leg: str, context: int, appended: int, stalled: int = 0) -> float:
        """`leg`: "prefill" (a prefill leg), "decode" (a decode leg, its KV shipped to it) or
        "whole" (a turn run whole on one engine)."""
        if context <= 0:
            return 0.0
        if leg == "decode":  # the decode engine pulls the whole context instead of the delta
            return self.cost.kv_transfer_time(context + appended) - self.cost.kv_transfer_time(appended)
        extra = self.cost.prefill_time([(context + appended, 0)]) - self.cost.prefill_time([(appended, context)])
        return extra * (1 + stalled) if leg == "whole" else extra

    def wait_s(self, leg: str, load: int, backlog: float, kv: int, decode: float | None = None) -> float:
        wait = backlog / self.prefill_rate if leg != "decode" else 0.0
        if leg != "prefill" and load > 0:
            wait += (self.decode_tokens if decode is None else decode) * self._decode_steps(load, kv)
        return wait

    def _decode_steps_uncached(self, load: int, kv: int) -> float:
        """Seconds a new turn's decode takes per token beside `load` turns holding `kv` tokens,
        beyond an idle engine's."""
        mean_kv = max(kv / load, 1.0)
        admits = max(1, min(self.slots, int(self._kv_capacity // mean_kv)))
        waves = max(0, load + 1 - admits) / admits  # each as long as a decode of a full batch
        batch = min(load + 1, admits)
        return (1 + waves) * self._step(batch, mean_kv) - self._step(1, mean_kv)

    def _step(self, batch: int, context: float) -> float:
        per_rank = math.ceil(batch / self.cost.ep)
        return self.cost.step_time(per_rank, per_rank, per_rank * (context + 0.5), per_rank * context)
