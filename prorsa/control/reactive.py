"""The reactive policy: thresholds on what the engines hold, no forecast (the Dynamo-planner style).

    reactive[:queue_tokens[:kv_util[:cooldown_s[:prefill_share]]]]
        a deep prefill queue takes a decode engine, a full decode KV takes a prefill engine; one
        engine at a time, then a cooldown
"""

from __future__ import annotations

from prorsa.control.allocator import cheapest_first
from prorsa.control.policy import Decision, PolicyContext, Snapshot, register
from prorsa.control.requests import Requests, policy_name
from prorsa.loads import EngineLoad
from prorsa.roles import Role


@register("reactive")
class Reactive:
    """reactive[:queue_tokens[:kv_util[:cooldown_s[:prefill_share]]]] (defaults 4096:0.8:5:0.5)."""

    def __init__(self, *args: str, context: PolicyContext | None = None) -> None:
        if len(args) > 4:
            raise ValueError("reactive takes at most 4 arguments")
        q, kv, cool, share = (list(args) + ["4096", "0.8", "5", "0.5"][len(args):])
        self.queue_tokens = float(q)  # prefill tokens waiting per prefill-serving engine
        self.kv_util = float(kv)  # share of decode engines' KV in use
        self.cooldown_s = float(cool)
        self.prefill_share = float(share)  # of the engines that start as prefill
        if self.queue_tokens <= 0 or not 0 < self.kv_util <= 1 or self.cooldown_s < 0 \
                or not 0 <= self.prefill_share <= 1:
            raise ValueError("reactive thresholds out of range")
        self.name = policy_name("reactive", args)
        self._requests = Requests()
        self._last_move = float("-inf")

    def initial_roles(self, n_engines: int) -> list[Role]:
        if n_engines < 2:
            return [Role.MIXED] * n_engines
        p = min(max(round(n_engines * self.prefill_share), 1), n_engines - 1)
        return [Role.PREFILL] * p + [Role.DECODE] * (n_engines - p)

    def decide(self, snapshot: Snapshot) -> Decision:
        engines = self._requests.engines(snapshot)
        prefill = [e for e in engines if e.role.serves_prefill]
        decode = [e for e in engines if e.role.serves_decode]
        queue = sum(e.queued_prefill_tokens for e in prefill) / max(len(prefill), 1)
        cap = sum(e.kv_capacity for e in decode)
        kv = sum(e.kv_tokens for e in decode) / cap if cap else 0.0
        state = f"prefill queue {queue:.0f} tok/engine, decode KV {kv:.0%}"
        if snapshot.time_s - self._last_move < self.cooldown_s:
            return Decision({}, f"cooldown; {state}")
        move = None
        if queue > self.queue_tokens and kv < self.kv_util:
            move = self._pick(engines, Role.DECODE, Role.PREFILL)
        elif kv > self.kv_util and queue < self.queue_tokens:
            move = self._pick(engines, Role.PREFILL, Role.DECODE)
        if move is None:
            return Decision({}, f"hold; {state}")
        self._last_move = snapshot.time_s
        self._requests.ask(move, snapshot.time_s)
        (engine_id, role), = move.items()
        return Decision(move, f"{engine_id} -> {role.value}; {state}")

    @staticmethod
    def _pick(engines: list[EngineLoad], from_role: Role, to_role: Role) -> dict[str, Role] | None:
        pool = [e for e in engines if e.role is from_role]
        if len(pool) < 2:  # keep one engine in every role the split uses
            return None
        return {cheapest_first(pool)[0].engine_id: to_role}
