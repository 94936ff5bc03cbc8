"""RoleCosts: the cost model of one engine in each role, when roles lay its GPUs out differently.

Stage-specific parallelism (engines.parallelism): an engine is a fixed group of tp x ep GPUs, and
each role may shard the model over them its own way, e.g. prefill as one TP8 rank (no all-to-all
barrier, 8x the compute on one prompt) and decode as eight DP-attention ranks of EP8 (KV and
batch spread over ranks). An engine prices its steps with the model of its current layout.

    RoleCosts.uniform(cost)        every role alike: today's engines, no reshard ever
    of(role) -> CostModel          the model an engine in `role` steps with
    reshards(a, b)                 whether a switch a -> b changes the layout
    switch_time(a, b, ...)         drain (in a's layout) + reshard into b's (CostModel.switch_time)
"""

from __future__ import annotations

from dataclasses import dataclass

from prorsa.costmodel.roofline import CostModel
from prorsa.roles import Role


@dataclass(frozen=True)
class RoleCosts:
    prefill: CostModel
    decode: CostModel
    mixed: CostModel  # also the layout of a uniform engine (engines.tp, engines.ep)

    def __post_init__(self) -> None:
        gpus = {r: c.tp * c.ep for r, c in (("prefill", self.prefill), ("decode", self.decode),
                                            ("mixed", self.mixed))}
        if len(set(gpus.values())) > 1:  # a switch cannot take GPUs from or give them to an engine
            raise ValueError(f"every role of an engine runs on its GPUs: tp x ep differs by role {gpus}")

    @classmethod
    def uniform(cls, cost: CostModel) -> RoleCosts:
        return cls(cost, cost, cost)

    @property
    def is_uniform(self) -> bool:
        return self.prefill.layout == self.decode.layout == self.mixed.layout

    def of(self, role: Role) -> CostModel:
        if role is Role.PREFILL:
            return self.prefill
        return self.decode if role is Role.DECODE else self.mixed

    def reshards(self, from_role: Role, to_role: Role) -> bool:
        return self.of(from_role).layout != self.of(to_role).layout

    def switch_time(self, from_role: Role, to_role: Role, inflight_decode_tokens: int = 0, batch: int = 0,
                    *, context_tokens: int = 0) -> float:
        return self.of(from_role).switch_time(from_role, to_role, inflight_decode_tokens, batch,
                                              context_tokens=context_tokens, to_cost=self.of(to_role))
