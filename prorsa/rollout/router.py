"""The router: which engine runs each leg of a turn.

    route(traj_id, colocated, appended)  -> Route (prefill engine, decode engine); counts the turn in flight
    finished(route)             the turn is over: its engines are free of it
    set_role(engine, role)      the controller moved an engine; new turns follow the new role
    close(engine) / reopen(engine)   no new work at all meanwhile (an engine draining its decodes)

Prefills go to PREFILL engines; MIXED engines take the overflow: when every prefill engine holds
`slots` turns, a turn whose decode engine is MIXED runs whole there (colocated: its context is
cached there, only the append is prefilled, nothing shipped). With no PREFILL engine at all, the
MIXED engines prefill for the DECODE engines too. The allocator scores splits the same way
(control/allocator.py: prefill engines first, mixed engines the overflow).

Sticky first: a trajectory's incremental prefill must run where its prefix is cached, or it
recomputes the whole context, so a turn goes back to the engines of its previous turn unless
they no longer serve that leg or carry more than `overload` times the least-loaded engine's
load (runtime.sticky_overload; None: never for load). Ties break by engine order, so a seeded
run routes the same way twice.

Decode-local prefill (`local_prefill_tokens` > 0): a later turn that appends at most that many
tokens skips the prefill leg and runs on its sticky decode engine, which holds the whole context
(prompt and generated tokens) in its prefix cache and prefills only the append: no KV shipped, no
second engine touched. A small tool observation costs the decode engine a short prefill instead
of a prefill request elsewhere plus a transfer of the whole context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prorsa.roles import Role


@dataclass(frozen=True)
class Route:
    prefill: str | None  # None: no separate prefill leg (colocated or decode-local prefill)
    decode: str
    local_prefill: bool = False  # the decode engine prefills the append itself (disaggregated run)


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


class Router:
    def __init__(self, roles: dict[str, Role], overload: float | None = 2.0, local_prefill_tokens: int = 0,
                 slots: int | None = None) -> None:
        self.roles = dict(roles)
        self.slots = slots  # turns a PREFILL engine takes before MIXED engines take the overflow
        self.load = {e: 0 for e in roles}
        self._floor = 0  # at most every engine's load: finished() lowers it, a scan raises it
        self.overload = math.inf if overload is None else overload  # None: never leave for load
        self.local_prefill_tokens = local_prefill_tokens
        self._sticky: dict[str, dict[str, str]] = {"prefill": {}, "decode": {}}  # leg -> traj -> engine
        self.closed: set[str] = set()
        self._pools: _Pools | None = None

    def set_role(self, engine: str, role: Role) -> None:
        self.roles[engine] = role
        self._pools = None

    def close(self, engine: str) -> None:
        self.closed.add(engine)
        self._pools = None

    def reopen(self, engine: str) -> None:
        self.closed.discard(engine)
        self._pools = None

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

    def _sticky_choice(self, traj_id: str, leg: str, eligible: _Pool) -> tuple[str, bool]:
        """-> (engine, whether it is the trajectory's previous engine for this leg)."""
        if not eligible:
            raise RuntimeError(f"no engine serves {leg}; roles are {self.roles}, closed {sorted(self.closed)}")
        prev = self._sticky[leg].get(traj_id)
        sticky = prev in eligible.members
        # A turn usually stays: if its engine is within `overload` of a lower bound of the least
        # load, it is within it of the least load too, and no scan of the engines is needed.
        if sticky and self.load[prev] <= self.overload * max(self._floor, 1):
            return prev, True
        least = min(eligible, key=self.load.__getitem__)
        self._floor = min(self.load.values())
        if sticky and self.load[prev] <= self.overload * max(self.load[least], 1):
            return prev, True
        return least, False

    def _pick(self, traj_id: str, leg: str, eligible: _Pool) -> str:
        choice, _ = self._sticky_choice(traj_id, leg, eligible)
        self._sticky[leg][traj_id] = choice
        self.load[choice] += 1
        return choice

    def route(self, traj_id: str, colocated: bool = False, appended: int | None = None) -> Route:
        """`appended`: tokens this turn adds to the context (None: unknown, never decode-local)."""
        pools = self._pool()
        roles, decoders, mixed = pools.roles, pools.decoders, pools.mixed
        # with no prefill engine, the mixed engines prefill for the decode engines, which would
        # otherwise idle while the allocator counts them as decoding
        prefillers = pools.prefillers or (mixed if len(decoders) > len(mixed) else None)
        if colocated or not prefillers:
            # no prefill pool: the whole turn runs on one engine that does both phases
            return Route(prefill=None, decode=self._pick(traj_id, "decode", mixed or decoders))
        if appended is not None and appended <= self.local_prefill_tokens:
            _, sticky = self._sticky_choice(traj_id, "decode", decoders)
            if sticky:  # the decode engine of its last turn still holds the context
                return Route(prefill=None, decode=self._pick(traj_id, "decode", decoders), local_prefill=True)
        decode = self._pick(traj_id, "decode", decoders)
        if roles[decode] is Role.MIXED and (prefillers is mixed or self._full(prefillers)):
            return Route(prefill=None, decode=decode)  # the mixed engine takes its own turn whole
        prefill = self._pick(traj_id, "prefill", prefillers)
        return Route(prefill=prefill, decode=decode)

    def _full(self, prefillers: _Pool) -> bool:
        return self.slots is not None and min(self.load[e] for e in prefillers) >= self.slots

    def finished(self, route: Route) -> None:
        for engine in (route.prefill, route.decode):
            if engine is not None:
                self.load[engine] -= 1
                self._floor = min(self._floor, self.load[engine])

    def forget(self, traj_id: str) -> None:
        self._sticky["prefill"].pop(traj_id, None)
        self._sticky["decode"].pop(traj_id, None)
