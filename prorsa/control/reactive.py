"""The reactive policy: thresholds on what the engines hold, no forecast (the Dynamo-planner style).

    reactive[:queue_tokens[:kv_util[:cooldown_s[:prefill_share]]]]
        a deep prefill queue takes a decode engine, a full decode KV takes a prefill engine; one
        engine at a time, then a cooldown
"""

from __future__ import annotations

from prorsa.config.policies import ReactiveArgs, shorthand
from prorsa.control.allocator import cheapest_first
from prorsa.control.policy import Decision, PolicyContext, Snapshot, register
from prorsa.control.requests import Requests
from prorsa.loads import EngineLoad
from prorsa.roles import Role


@register("reactive", args=ReactiveArgs)
class Reactive:
    """reactive[:queue_tokens[:kv_util[:cooldown_s[:prefill_share]]]] (defaults 4096:0.8:5:0.5)."""

    def __init__(self, args: ReactiveArgs | None = None, *, context: PolicyContext | None = None) -> None:
        args = args or ReactiveArgs()
        self.queue_tokens = args.queue_tokens  # prefill tokens waiting per prefill-serving engine
        self.kv_util = args.kv_util  # share of decode engines' KV in use
        self.cooldown_s = args.cooldown_s
        self.prefill_share = args.prefill_share  # of the engines that start as prefill
        self.name = shorthand("reactive", args)
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
