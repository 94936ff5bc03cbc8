"""The router: which engine runs each leg of a turn.

    route(traj_id, colocated, appended, context)  -> Route (prefill engine, decode engine); counts the
                                turn in flight
    finished(route)             the turn is over: its engines are free of it
    relocate(traj_id, route, context, remaining)   -> an engine to warm with the trajectory's
                                context while its tool runs (its next turn goes there), or None
    set_role(engine, role)      the controller moved an engine; new turns follow the new role
    close(engine) / reopen(engine)   no new work at all meanwhile (an engine draining its decodes)
    pin(traj_id, engine)        the trajectory's next turn goes to `engine` (a wide engine of the
                                tail's layout, control/tail_layout.py); the sticky rule keeps it there
    reserve(homes)              each trajectory of `homes` runs every leg on its engine from its next
                                turn on, and no other trajectory goes there (benchmarks/tail_reserve.py)
    join(engine, role) / leave(engine)   an engine starts or stops being one of this router's (cells:
                                a move between cells; leave once it holds no leg)

Prefills go to PREFILL engines; MIXED engines take the overflow: when every prefill engine holds
`slots` turns, a turn whose decode engine is MIXED runs whole there (colocated: its context is
cached there, only the append is prefilled, nothing shipped). With no PREFILL engine at all, the
MIXED engines prefill for the DECODE engines too. The allocator scores splits the same way
(control/allocator.py: prefill engines first, mixed engines the overflow).

Sticky first: a trajectory's incremental prefill must run where its prefix is cached, or it
recomputes the whole context, so a turn goes back to the engines of its previous turn unless
they no longer serve that leg or are too busy (runtime.sticky_overload):
    a number    they carry more than that many times the least-loaded engine's turns
    None        never for load
    "cost"      the wait the move avoids is more than what it adds, both priced by the cost model
                for this turn (placement.py: the recompute, and the stall it puts on the decodes
                co-batched with it; the queue and the prefill backlog it leaves behind)
Ties break by engine order, so a seeded run routes the same way twice.

Engines of different sizes (engines.groups): `slots` and the cost rule's prices are per engine
(`slots` a dict, `engine_prices` each engine's MoveCost), so a wide decode engine is priced by its
own step times and KV, a 1-GPU prefill engine by its own prefill rate, and a new trajectory goes
to the engine with the least load as a share of its slots.

Decode-local prefill (`local_prefill_tokens` > 0): a later turn that appends at most that many
tokens skips the prefill leg and runs on its sticky decode engine, which holds the whole context
(prompt and generated tokens) in its prefix cache and prefills only the append: no KV shipped, no
second engine touched. A small tool observation costs the decode engine a short prefill instead
of a prefill request elsewhere plus a transfer of the whole context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from prorsa.roles import Role
from prorsa.rollout.placement import MoveCost


@dataclass(frozen=True)
class Route:
    prefill: str | None  # None: no separate prefill leg (colocated or decode-local prefill)
    decode: str
    local_prefill: bool = False  # the decode engine prefills the append itself (disaggregated run)
    kv: int = field(default=0, compare=False)  # KV tokens the cost rule counts on the decode engine


class _Pool(list):
    """Engines in engine order (ties break by it), with a set of them for the sticky test."""

    def __init__(self, engines: list[str]) -> None:
        super().__init__(engines)
        self.members = frozenset(engines)


@dataclass
class _Pools:
    roles: dict[str, Role]
    mixed: _Pool
    decoders: _Pool
    prefillers: _Pool


@dataclass(frozen=True)
class _Turn:
    """What the cost rule prices a move of this turn by."""
    context: int  # tokens cached before this turn's append
    appended: int
    decode: float | None = None  # tokens it decodes where it goes: None, one mean turn


def _always(kind: str) -> Callable[[str], str]:
    return lambda engine: kind


# what a leg asks of each engine it may go to, for the cost rule (MoveCost.move_s's `leg`)
_AS_DECODE, _AS_PREFILL, _AS_WHOLE = _always("decode"), _always("prefill"), _always("whole")
_CONSTANT_KINDS = (_AS_DECODE, _AS_PREFILL, _AS_WHOLE)


class Router:
    def __init__(self, roles: dict[str, Role], overload: float | str | None = 2.0, local_prefill_tokens: int = 0,
                 slots: int | dict[str, int] | None = None, move_cost: MoveCost | None = None,
                 clock: Callable[[], float] | None = None, engine_prices: dict[str, MoveCost] | None = None) -> None:
        self.roles = dict(roles)
        # turns a PREFILL engine takes before MIXED engines take the overflow (per engine, or one for all)
        self.slots = slots if not isinstance(slots, dict) else None
        self._slots_of = slots if isinstance(slots, dict) else None
        self.load = {e: 0 for e in roles}
        self._floor = 0  # at most every engine's load: finished() lowers it, a scan raises it
        if overload == "cost" and (move_cost is None or clock is None):
            raise ValueError("sticky_overload 'cost' needs the engines' cost model (move_cost) and a clock")
        self.move_cost = move_cost if overload == "cost" else None
        self._prices = engine_prices if self.move_cost is not None and engine_prices else None
        # the distinct models, for a floor over every engine and for learning the decode mean
        self._all_prices = ([] if self.move_cost is None else
                            list({id(p): p for p in [self.move_cost, *(self._prices or {}).values()]}.values()))
        # the cost rule's prefill backlog per engine, a fluid queue: tokens routed to the engine,
        # drained at its prefill rate since `_seen` (body seconds; the router never sees a leg end)
        self.clock = clock
        self._backlog = {e: 0.0 for e in roles}
        self._seen = {e: 0.0 for e in roles}
        self._kv = {e: 0 for e in roles}  # KV tokens of the turns in flight on each engine, at their end
        # None: never leave for load ("cost" prices every move instead: the ratio is not used)
        self.overload = math.inf if overload is None or overload == "cost" else float(overload)
        self.local_prefill_tokens = local_prefill_tokens
        self._sticky: dict[str, dict[str, str]] = {"prefill": {}, "decode": {}}  # leg -> traj -> engine
        self.closed: set[str] = set()
        self._pools: _Pools | None = None
        self._homes: dict[str, str] = {}  # reserve(): trajectory -> its engine
        self._reserved: set[str] = set()  # engines reserve() gave away: no other trajectory goes there
        self._shut: dict[int, tuple[_Pool, _Pool]] = {}  # pool's id -> (pool, pool less the reserved)

    def set_role(self, engine: str, role: Role) -> None:
        self.roles[engine] = role
        self._pools = None

    def close(self, engine: str) -> None:
        self.closed.add(engine)
        self._pools = None

    def reopen(self, engine: str) -> None:
        self.closed.discard(engine)
        self._pools = None

    def pin(self, traj_id: str, engine: str) -> None:
        for leg in self._sticky.values():
            leg[traj_id] = engine

    def reserve(self, homes: dict[str, str]) -> None:
        self._homes.update(homes)
        self._reserved.update(homes.values())
        self._shut.clear()

    def _unreserved(self, eligible: _Pool) -> _Pool:
        # a pool lives until a role or a closure changes, so its filtered copy is kept beside it
        kept = self._shut.get(id(eligible))
        if kept is None or kept[0] is not eligible:
            kept = eligible, _Pool([e for e in eligible if e not in self._reserved] or list(eligible))
            self._shut[id(eligible)] = kept
        return kept[1]

    def join(self, engine: str, role: Role, slots: int | None = None) -> None:
        self.roles[engine] = role
        self.load[engine] = 0
        self._backlog[engine], self._seen[engine], self._kv[engine] = 0.0, 0.0, 0
        if self._slots_of is not None:
            self._slots_of[engine] = slots if slots is not None else max(self._slots_of.values())
        self._floor = 0
        self.closed.discard(engine)
        self._pools = None

    def leave(self, engine: str) -> None:
        # a prefill engine may still count turns whose decode runs elsewhere: finished() skips it
        for book in (self.roles, self.load, self._backlog, self._seen, self._kv):
            book.pop(engine, None)
        self.closed.discard(engine)
        # trajectories sticky to it go to the least loaded engine next turn (their prefix is gone)
        for sticky in self._sticky.values():
            for traj in [t for t, e in sticky.items() if e == engine]:
                del sticky[traj]
        self._floor = min(self.load.values(), default=0)
        self._pools = None

    def _slots(self, engine: str) -> int | None:
        return self.slots if self._slots_of is None else self._slots_of[engine]

    def _fill(self, engine: str) -> float:
        return self.load[engine] / self._slots_of[engine]

    def _price(self, engine: str) -> MoveCost:
        return self.move_cost if self._prices is None else self._prices.get(engine, self.move_cost)

    def _open(self) -> dict[str, Role]:
        return {e: r for e, r in self.roles.items() if e not in self.closed} if self.closed else self.roles

    def _pool(self) -> _Pools:
        """The engines open for each kind of work, rebuilt only when a role or a closure changes
        (a simulated rollout routes ~10^5 turns over dozens of engines)."""
        if self._pools is None:
            roles = self._open()
            self._pools = _Pools(
                roles=roles,
                mixed=_Pool([e for e, r in roles.items() if r is Role.MIXED]),
                decoders=_Pool([e for e, r in roles.items() if r.serves_decode]),
                prefillers=_Pool([e for e, r in roles.items() if r is Role.PREFILL]))
        return self._pools

    def _sticky_choice(self, traj_id: str, leg: str, eligible: _Pool, turn: _Turn | None = None,
                       kind: Callable[[str], str] = _AS_DECODE) -> tuple[str, bool]:
        """-> (engine, whether it is the trajectory's previous engine for this leg). `kind`: what
        the leg would ask of each engine, for the cost rule."""
        if not eligible:
            raise RuntimeError(f"no engine serves {leg}; roles are {self.roles}, closed {sorted(self.closed)}")
        prev = self._sticky[leg].get(traj_id)
        if self._reserved:
            home = self._homes.get(traj_id)
            if home in eligible.members:
                return home, home == prev
            eligible = self._unreserved(eligible)
        sticky = prev in eligible.members
        if sticky and self.move_cost is not None and turn is not None:
            return self._cost_choice(prev, eligible, turn, kind)
        if self._slots_of is not None:
            # engines of different sizes: a 256-slot engine holding 32 turns is emptier than a
            # 32-slot one holding 16, so load is compared as a share of each engine's slots
            fill = self._fill
            least = min(eligible, key=fill)
            if sticky and fill(prev) <= self.overload * max(fill(least), 1 / self._slots_of[least]):
                return prev, True
            return least, False
        # A turn usually stays: if its engine is within `overload` of a lower bound of the least
        # load, it is within it of the least load too, and no scan of the engines is needed.
        if sticky and self.load[prev] <= self.overload * max(self._floor, 1):
            return prev, True
        least = min(eligible, key=self.load.__getitem__)
        self._floor = min(self.load.values())
        if sticky and self.load[prev] <= self.overload * max(self.load[least], 1):
            return prev, True
        return least, False

    def _cost_choice(self, prev: str, eligible: _Pool, turn: _Turn, kind: Callable[[str], str]) -> tuple[str, bool]:
        now = self.clock()  # one reading for every engine this choice prices
        stay = self._price(prev).wait_s(kind(prev), self.load[prev], self.backlog(prev, now), self._kv[prev],
                                        turn.decode)
        # the least a move can add (a KV pull, or a recompute onto an engine that co-batches nothing
        # with it): a decode pick may ask either of its engines; engines of other sizes price it their way
        kinds = ("decode", "whole") if kind not in _CONSTANT_KINDS else (kind(prev),)
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

    def _pick(self, traj_id: str, leg: str, eligible: _Pool, turn: _Turn | None = None,
              kind: Callable[[str], str] = _AS_DECODE) -> tuple[str, bool]:
        choice, sticky = self._sticky_choice(traj_id, leg, eligible, turn, kind)
        self._take(traj_id, leg, choice)
        return choice, sticky

    def _take(self, traj_id: str, leg: str, engine: str) -> None:
        self._sticky[leg][traj_id] = engine
        self.load[engine] += 1

    def route(self, traj_id: str, colocated: bool = False, appended: int | None = None,
              context: int = 0, remaining: float | None = None) -> Route:
        """`appended`: tokens this turn adds to the context (None: unknown, never decode-local);
        `context`: tokens before them, cached where the trajectory's last turn ran; `remaining`:
        the decode tokens its trajectory is predicted to have left, the cost rule's price of the
        wait where it goes (control/tail.py, scheduling.spread; None: one mean turn's)."""
        pools = self._pool()
        roles, decoders, mixed = pools.roles, pools.decoders, pools.mixed
        turn = _Turn(context, appended or 0, remaining)
        # with no prefill engine, the mixed engines prefill for the decode engines, which would
        # otherwise idle while the allocator counts them as decoding
        prefillers = pools.prefillers or (mixed if len(decoders) > len(mixed) else None)
        if colocated or not prefillers:
            # no prefill pool: the whole turn runs on one engine that does both phases
            decode, sticky = self._pick(traj_id, "decode", mixed or decoders, turn, _AS_WHOLE)
            return self._prefilled_by(decode, Route(prefill=None, decode=decode), turn, sticky)
        if appended is not None and appended <= self.local_prefill_tokens:
            decode, sticky = self._sticky_choice(traj_id, "decode", decoders, turn, _AS_WHOLE)
            if sticky:  # the decode engine of its last turn still holds the context
                self._take(traj_id, "decode", decode)
                return self._prefilled_by(decode, Route(prefill=None, decode=decode, local_prefill=True), turn, True)
        # a mixed engine takes its own turn whole while no prefill engine has room for it
        whole_on_mixed = prefillers is mixed or self._full(prefillers)
        decode, sticky = self._pick(traj_id, "decode", decoders, turn,
                                    lambda e: "whole" if whole_on_mixed and roles[e] is Role.MIXED else "decode")
        if whole_on_mixed and roles[decode] is Role.MIXED:
            return self._prefilled_by(decode, Route(prefill=None, decode=decode), turn, sticky)
        prefill, sticky = self._pick(traj_id, "prefill", prefillers, turn, _AS_PREFILL)
        return self._prefilled_by(prefill, Route(prefill=prefill, decode=decode), turn, sticky)

    def relocate(self, traj_id: str, route: Route, context: int, remaining: float | None = None) -> str | None:
        """Where the trajectory of `route`'s turn should find its `context` tokens cached at its
        next turn (scheduling.migrate): an engine of the same kind as the one holding them now,
        when waiting there beats staying by more than the warm-up costs the engine's other
        sequences, or None to stay. Called as the turn's decode ends, `route` still counted in
        flight; `remaining`: the decode tokens the trajectory is predicted to have left.

        The warm-up (the context prefilled there while the tool runs) is off the trajectory's own
        path, so unlike a move at routing (_cost_choice) its own recompute is not charged: only
        what it makes the engine's other turns wait, every turn it holds on a mixed engine (the
        decodes co-batched with it and the turns queued behind), on a prefill engine the next
        prefill behind it. An idle engine takes it for free. Decode-local turns and decode legs
        are not moved: their context is pulled or kept where the decode runs."""
        if self.move_cost is None or route.local_prefill or context <= 0:
            return None
        pools = self._pool()
        if route.prefill is None:
            leg, kind, eligible, prev = "decode", "whole", pools.mixed or pools.decoders, route.decode
        else:
            leg, kind, eligible, prev = "prefill", "prefill", pools.prefillers, route.prefill
        if prev not in eligible.members or len(eligible) < 2:
            return None
        now = self.clock()
        # the next turn's wait, not the whole remainder's: the loads it is priced on last about a
        # turn (pricing the remainder moved 5x as often and lost up to 9% on contended cells)
        mean = self.move_cost.decode_tokens
        decode = mean if remaining is None else min(remaining, mean)
        own_kv = route.kv if leg == "decode" else 0

        def wait(e: str, load: int, kv: int) -> float:
            return self._price(e).wait_s(kind, load, self.backlog(e, now), kv, decode)

        stay = wait(prev, self.load[prev] - 1, self._kv[prev] - own_kv)  # this turn will have ended
        best, best_s = None, stay
        extra: dict[int, float] = {}  # the warm-up's price, once per cost model (one for equal engines)
        for e in eligible:
            if e == prev:
                continue
            price = self._price(e)
            if id(price) not in extra:
                extra[id(price)] = price.move_s(kind, context, 0)
            # every turn it holds, admitted or queued, waits out the warm-up's prefill
            stalled = self.load[e] if kind == "whole" else 1
            total = wait(e, self.load[e], self._kv[e]) + extra[id(price)] * stalled
            if total < best_s:
                best, best_s = e, total
        if best is not None:
            self._sticky[leg][traj_id] = best
            self._backlog[best] = self.backlog(best, now) + context
        return best

    def _prefilled_by(self, engine: str, route: Route, turn: _Turn, cached: bool) -> Route:
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

    def _full(self, prefillers: _Pool) -> bool:
        if self._slots_of is not None:  # engines of their own sizes: full when each holds its own slots
            return all(self.load[e] >= self._slots_of[e] for e in prefillers)
        return self.slots is not None and min(self.load[e] for e in prefillers) >= self.slots

    def finished(self, route: Route) -> None:
        for engine in (route.prefill, route.decode):
            if engine is not None and engine in self.load:  # not if it has left (cells)
                self.load[engine] -= 1
                self._floor = min(self._floor, self.load[engine])
        if route.decode in self._kv:
            self._kv[route.decode] -= route.kv

    def decoded(self, tokens: int) -> None:
        """A decode of `tokens` ended somewhere: the cost rule's mean decode learns from it."""
        for price in self._all_prices:
            price.learn(tokens)

    def forget(self, traj_id: str) -> None:
        self._homes.pop(traj_id, None)
        self._sticky["prefill"].pop(traj_id, None)
        self._sticky["decode"].pop(traj_id, None)
