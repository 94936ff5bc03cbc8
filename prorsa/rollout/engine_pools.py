"""The router's books of its engines, which every routing rule reads, and the records they route.

    Route                       a turn's engines: its prefill leg's (None: no separate leg) and its
                                decode leg's; what the router hands out and takes back
    Turn                        what the cost rule prices a move of a turn by
    AS_DECODE / AS_PREFILL / AS_WHOLE   what a leg asks of every engine it may go to
    Pool / Pools                engines in engine order, for one kind of work / for each kind
    EnginePools                 roles, closures, turns in flight (`load`) and slots per engine:
        set_role / close / reopen   a role or a closure changes; the pools follow
        _pool()                 the engines open for each kind of work
        _full(prefillers)       every prefill engine holds its slots: mixed engines take the overflow
        _slots(e) / _fill(e)    an engine's slots / its load as a share of them

router.py composes these books with the rules that read them (stickiness.py, cost_rule.py,
engine_choice.py, migration.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prorsa.roles import Role


@dataclass(frozen=True)
class Route:
    prefill: str | None  # None: no separate prefill leg (colocated or decode-local prefill)
    decode: str
    local_prefill: bool = False  # the decode engine prefills the append itself (disaggregated run)
    kv: int = field(default=0, compare=False)  # KV tokens the cost rule counts on the decode engine


@dataclass(frozen=True)
class Turn:
    """What the cost rule prices a move of this turn by."""
    context: int  # tokens cached before this turn's append
    appended: int
    decode: float | None = None  # tokens it decodes where it goes: None, one mean turn


def _always(kind: str) -> Callable[[str], str]:
    return lambda engine: kind


# what a leg asks of each engine it may go to, for the cost rule (MoveCost.move_s's `leg`)
AS_DECODE, AS_PREFILL, AS_WHOLE = _always("decode"), _always("prefill"), _always("whole")
CONSTANT_KINDS = (AS_DECODE, AS_PREFILL, AS_WHOLE)


class Pool(list):
    """Engines in engine order (ties break by it), with a set of them for the sticky test."""

    def __init__(self, engines: list[str]) -> None:
        super().__init__(engines)
        self.members = frozenset(engines)


@dataclass
class Pools:
    roles: dict[str, Role]
    mixed: Pool
    decoders: Pool
    prefillers: Pool


class EnginePools:
    """The engines' books, one set shared by the router's rules (router.py)."""

    roles: dict[str, Role]
    closed: set[str]
    load: dict[str, int]  # turns in flight on each engine
    slots: int | None
    _slots_of: dict[str, int] | None
    _floor: int
    _pools: Pools | None

    def _init_pools(self, roles: dict[str, Role], slots: int | dict[str, int] | None) -> None:
        self.roles = dict(roles)
        # turns a PREFILL engine takes before MIXED engines take the overflow (per engine, or one for all)
        self.slots = slots if not isinstance(slots, dict) else None
        self._slots_of = slots if isinstance(slots, dict) else None
        self.load = {e: 0 for e in roles}
        self._floor = 0  # at most every engine's load: finished() lowers it, a scan raises it
        self.closed = set()
        self._pools = None

    def set_role(self, engine: str, role: Role) -> None:
        self.roles[engine] = role
        self._pools = None

    def close(self, engine: str) -> None:
        self.closed.add(engine)
        self._pools = None

    def reopen(self, engine: str) -> None:
        self.closed.discard(engine)
        self._pools = None

    def _join_pools(self, engine: str, role: Role, slots: int | None) -> None:
        self.roles[engine] = role
        self.load[engine] = 0
        if self._slots_of is not None:
            self._slots_of[engine] = slots if slots is not None else max(self._slots_of.values())
        self._floor = 0
        self.closed.discard(engine)
        self._pools = None

    def _leave_pools(self, engine: str) -> None:
        # a prefill engine may still count turns whose decode runs elsewhere: _finish_loads skips it
        self.roles.pop(engine, None)
        self.load.pop(engine, None)
        self.closed.discard(engine)
        self._floor = min(self.load.values(), default=0)
        self._pools = None

    def _finish_loads(self, route: Route) -> None:
        for engine in (route.prefill, route.decode):
            if engine is not None and engine in self.load:  # not if it has left (cells)
                self.load[engine] -= 1
                self._floor = min(self._floor, self.load[engine])

    def _slots(self, engine: str) -> int | None:
        return self.slots if self._slots_of is None else self._slots_of[engine]

    def _fill(self, engine: str) -> float:
        return self.load[engine] / self._slots_of[engine]

    def _open(self) -> dict[str, Role]:
        return {e: r for e, r in self.roles.items() if e not in self.closed} if self.closed else self.roles

    def _pool(self) -> Pools:
        """The engines open for each kind of work, rebuilt only when a role or a closure changes
        (a simulated rollout routes ~10^5 turns over dozens of engines)."""
        if self._pools is None:
            roles = self._open()
            self._pools = Pools(
                roles=roles,
                mixed=Pool([e for e, r in roles.items() if r is Role.MIXED]),
                decoders=Pool([e for e, r in roles.items() if r.serves_decode]),
                prefillers=Pool([e for e, r in roles.items() if r is Role.PREFILL]))
        return self._pools

    def _full(self, prefillers: Pool) -> bool:
        if self._slots_of is not None:  # engines of their own sizes: full when each holds its own slots
            return all(self.load[e] >= self._slots_of[e] for e in prefillers)
        return self.slots is not None and min(self.load[e] for e in prefillers) >= self.slots
