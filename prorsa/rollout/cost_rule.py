"""The cost rule's books and prices (runtime.sticky_overload: cost): what each engine has queued,
and whether a turn is worth moving off its trajectory's engine.

    backlog(engine, now)        prefill tokens the rule takes `engine` to have ahead of a new turn
    decoded(tokens)             a decode ended: the rule's mean decode learns from it
    _price(engine)              the engine's MoveCost (engines of different sizes price their own way)
    _cost_choice(prev, eligible, turn, kind)   -> (engine, stayed): staying on `prev`, or the engine
                                whose wait plus the move's price is least
    _prefilled_by(engine, route, turn, cached) -> `route` with its prefill and KV booked

The prices themselves are placement.py's (MoveCost.move_s, wait_s); engine_choice.py asks this
rule only for a turn whose previous engine still serves the leg.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from prorsa.rollout.engine_pools import CONSTANT_KINDS, EnginePools, Pool, Route, Turn
from prorsa.rollout.placement import MoveCost


class CostRule(EnginePools):
    move_cost: MoveCost | None  # None: the rule is off (sticky_overload a number, or None)
    clock: Callable[[], float] | None
    _prices: dict[str, MoveCost] | None
    _all_prices: list[MoveCost]
    _backlog: dict[str, float]
    _seen: dict[str, float]
    _kv: dict[str, int]

    def _init_prices(self, overload: float | str | None, move_cost: MoveCost | None,
                     clock: Callable[[], float] | None, engine_prices: dict[str, MoveCost] | None) -> None:
        if overload == "cost" and (move_cost is None or clock is None):
            raise ValueError("sticky_overload 'cost' needs the engines' cost model (move_cost) and a clock")
        self.move_cost = move_cost if overload == "cost" else None
        self._prices = engine_prices if self.move_cost is not None and engine_prices else None
        # the distinct models, for a floor over every engine and for learning the decode mean
        self._all_prices = ([] if self.move_cost is None else
                            list({id(p): p for p in [self.move_cost, *(self._prices or {}).values()]}.values()))
        # the prefill backlog per engine, a fluid queue: tokens routed to the engine, drained at
        # its prefill rate since `_seen` (body seconds; the router never sees a leg end)
        self.clock = clock
        self._backlog = {e: 0.0 for e in self.roles}
        self._seen = {e: 0.0 for e in self.roles}
        self._kv = {e: 0 for e in self.roles}  # KV tokens of the turns in flight on each engine, at their end

    def _join_prices(self, engine: str) -> None:
        self._backlog[engine], self._seen[engine], self._kv[engine] = 0.0, 0.0, 0

    def _leave_prices(self, engine: str) -> None:
        for book in (self._backlog, self._seen, self._kv):
            book.pop(engine, None)

    def _finish_kv(self, route: Route) -> None:
        if route.decode in self._kv:
            self._kv[route.decode] -= route.kv

    def _price(self, engine: str) -> MoveCost:
        return self.move_cost if self._prices is None else self._prices.get(engine, self.move_cost)

    def _cost_choice(self, prev: str, eligible: Pool, turn: Turn, kind: Callable[[str], str]) -> tuple[str, bool]:
        now = self.clock()  # one reading for every engine this choice prices
        stay = self._price(prev).wait_s(kind(prev), self.load[prev], self.backlog(prev, now), self._kv[prev],
                                        turn.decode)
        # the least a move can add (a KV pull, or a recompute onto an engine that co-batches nothing
        # with it): a decode pick may ask either of its engines; engines of other sizes price it their way
        kinds = ("decode", "whole") if kind not in CONSTANT_KINDS else (kind(prev),)
        if stay <= min(p.move_s(k, turn.context, turn.appended) for k in kinds for p in self._all_prices):
            return prev, True  # no scan: no engine can be worth the move

        # min(eligible, key=total) with the engines whose move alone costs more skipped: a move's
        # price grows only with the sequences it stalls, so its floor is priced once per kind and model
        base: dict[tuple[str, int], float] = {}
        best, best_s = prev, math.inf
        for e in eligible:
            if e == prev:
                total = stay
            else:
                k, price = kind(e), self._price(e)
                if (k, id(price)) not in base:
                    base[k, id(price)] = price.move_s(k, turn.context, turn.appended)
                floor = base[k, id(price)]
                stalled = min(self.load[e], self._slots(e) or self.load[e])
                move = floor * (1 + stalled) if k == "whole" else floor
                if move > stay or move >= best_s:
                    continue  # it cannot beat staying, nor an engine before it
                backlog = self.backlog(e, now) if k != "decode" else 0.0  # a decode leg waits on no prefill
                total = price.wait_s(k, self.load[e], backlog, self._kv[e], turn.decode) + move
            if total < best_s:
                best, best_s = e, total
        return best, best == prev

    def _prefilled_by(self, engine: str, route: Route, turn: Turn, cached: bool) -> Route:
        """`route`, booked for the cost rule: the prefill it gives `engine` (the append on the
        context the engine caches, or the whole context where it caches none of it) added to the
        engine's backlog, and its KV to the decode engine's."""
        if self.move_cost is None:
            return route
        self._backlog[engine] = self.backlog(engine) + turn.appended + (0 if cached else turn.context)
        kv = self._price(route.decode).turn_kv(turn.context, turn.appended)
        self._kv[route.decode] += kv
        return replace(route, kv=kv)

    def backlog(self, engine: str, now: float | None = None) -> float:
        """Prefill tokens the cost rule takes `engine` to have ahead of a new turn, `now` (default:
        the clock's reading)."""
        now = self.clock() if now is None else now
        left = self._backlog[engine] - self._price(engine).prefill_rate * (now - self._seen[engine])
        self._seen[engine] = now
        self._backlog[engine] = left = max(left, 0.0)
        return left

    def decoded(self, tokens: int) -> None:
        """A decode of `tokens` ended somewhere: the cost rule's mean decode learns from it."""
        for price in self._all_prices:
            price.learn(tokens)
