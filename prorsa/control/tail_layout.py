"""The tail's own layout: when a step's last trajectories remain, lend idle engines' GPUs to them.

A synchronous step ends with its slowest trajectory, and its last turns decode nearly alone: at
batch 1 a decode step is the weights read over one engine's memory bandwidth, which a wider
tensor-parallel layout divides (Qwen3-8B on H200 at 10k context: 7.3 ms a token at TP1, 5.9 at
TP2, 4.8 at TP4). Once fewer trajectories are left than the engines can keep busy, idle engines
merge into wider ones (f engines of TP t become one of TP f*t) and the remaining trajectories move
there at their next turn.

    Left(tokens, context, turns)            one live trajectory's predicted remainder
    TailLayout(cost, engines, slots)        the engines of a run (one layout for all)
        widths() -> list[int]               engines that may merge into one (1: none), widest last
        price(left, width, wide) -> float   seconds the remaining trajectories take on `wide`
                                            engines of `width` merged ones, charges included
        plan(left, idle) -> TailPlan | None the layout the cost model prices fastest, if it beats
                                            staying by MIN_GAIN; None while many remain

What a plan is priced by (the cost model, costmodel/roofline.py):
  stay        each trajectory's remaining tokens at the batch it shares now (the live
              trajectories over every engine), at half its remaining context added
  widen       reshard_time(narrow -> wide): the weights move into the wider layout (the price the
              cost model has for any layout change, once the engine is empty), plus one re-prefill
              of the trajectory's context on the wide engine (its KV was laid out for the old
              ranks, and a merged engine's prefix cache starts empty), then its tokens at the
              wide layout's batch
  all-decode  the same batch and layout as stay, plus a KV transfer of the context at each turn
              left (prefill on one engine, decode on another); it saves no interference here,
              because with at most one trajectory an engine a decode shares its steps with no
              other trajectory's prefill. Priced beside the others, so the choice is the cost
              model's; on the cells measured it is never the fastest.
The remaining tokens are the lifecycle predictor's (control/tail.py RemainingWork): what the
trajectories in flight are forecast to have left, never the run's future.

Fires only when `idle` engines can give every remaining trajectory at least one more engine's
GPUs (len(left) <= engines // 2): before that the engines batch usefully and a wide engine costs
a narrow one's throughput.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prorsa.costmodel import CostModel

MIN_GAIN = 0.05  # a plan must save this share of the tail as it stands: the prices are forecasts


@dataclass(frozen=True)
class Left:
    tokens: float  # decode tokens it is predicted to have left, this turn's included
    context: int  # tokens in its context now
    turns: float = 1.0  # turns it is predicted to have left


@dataclass(frozen=True)
class TailPlan:
    kind: str  # "widen" or "all-decode"
    width: int  # engines merged into each wide one (1: no merge)
    wide: int  # wide engines formed
    tail_s: float  # the tail so laid out, charges included (predicted)
    stay_s: float  # the tail as it stands (predicted)

    @property
    def reason(self) -> str:
        return (f"tail: {self.kind} x{self.width} on {self.wide} engines, "
                f"{self.stay_s:.1f}s -> {self.tail_s:.1f}s predicted")


class TailLayout:
    def __init__(self, cost: CostModel, engines: int, slots: int) -> None:
        self.cost = cost  # one engine's layout (engines alike; engines.groups are not merged)
        self.engines = engines
        self.slots = slots
        self._wide: dict[int, CostModel] = {}

    def widths(self) -> list[int]:
        """Merges that stay a valid layout: a power of two engines, within one NVLink domain (a
        TP all-reduce across nodes would cost more than it saves) and dividing the KV heads."""
        c, out, f = self.cost, [], 2
        while f <= self.engines and c.tp * f * c.ep <= c.gpu.gpus_per_node and c.model.kv_heads % (c.tp * f) == 0:
            out.append(f)
            f *= 2
        return out

    def wide_cost(self, width: int) -> CostModel:
        if width not in self._wide:
            c = self.cost
            self._wide[width] = CostModel(c.gpu, c.model, tp=c.tp * width, ep=c.ep, mem_fraction=c.mem_fraction,
                                          switch_prefill_tokens=c.switch_prefill_tokens, restart_s=c.restart_s)
        return self._wide[width]

    @staticmethod
    def _decode_s(c: CostModel, t: Left, batch: int) -> float:
        # a sequence gains one token a step: its pace is the whole step of its batch
        # (decode_token_time is one sequence's share of that step)
        return t.tokens * batch * c.decode_token_time(t.context + t.tokens / 2, batch)

    def stay(self, left: Sequence[Left]) -> float:
        batch = max(math.ceil(len(left) / self.engines), 1)
        return max((self._decode_s(self.cost, t, batch) for t in left), default=0.0)

    def price(self, left: Sequence[Left], width: int, wide: int) -> float:
        c = self.wide_cost(width)
        batch = max(math.ceil(len(left) / max(wide, 1)), 1)
        moved = self.cost.reshard_time(c)
        return moved + max((c.prefill_time([(t.context, 0)]) + self._decode_s(c, t, batch) for t in left), default=0.0)

    def all_decode(self, left: Sequence[Left]) -> float:
        batch = max(math.ceil(len(left) / self.engines), 1)
        return max((self._decode_s(self.cost, t, batch) + t.turns * self.cost.kv_transfer_time(t.context)
                    for t in left), default=0.0)

    def plan(self, left: Sequence[Left], idle: int) -> TailPlan | None:
        n = len(left)
        if n == 0 or n > self.engines // 2:
            return None
        stay = self.stay(left)
        best = TailPlan("all-decode", 1, 0, self.all_decode(left), stay)
        for width in self.widths():
            wide = min(n, idle // width)  # a wide engine per trajectory at most: one alone is the fastest
            if wide < 1:
                continue
            p = TailPlan("widen", width, wide, self.price(left, width, wide), stay)
            if p.tail_s < best.tail_s:
                best = p
        return best if best.tail_s < (1.0 - MIN_GAIN) * stay else None
