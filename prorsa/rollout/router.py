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
MIXED engines prefill for the DECODE engines too, unless engines switch by restart
(`mixed_exports_kv` False: a mixed engine pulls KV and exports none, roles.py); then every engine
that decodes runs its turns whole. The allocator scores splits the same way
(control/allocator.py: prefill engines first, mixed engines the overflow).

Decode-local prefill (`local_prefill_tokens` > 0): a later turn that appends at most that many
tokens skips the prefill leg and runs on its sticky decode engine, which holds the whole context
(prompt and generated tokens) in its prefix cache and prefills only the append: no KV shipped, no
second engine touched. A small tool observation costs the decode engine a short prefill instead
of a prefill request elsewhere plus a transfer of the whole context.

The Router is composed of its parts, one job each:
    engine_pools.py     Route; the engines' roles, closures, turns in flight and slots; the pools
    stickiness.py       which engine holds each trajectory's context; pin, reserve, forget
    cost_rule.py        the cost rule's prices and books: each engine's prefill backlog and KV
    engine_choice.py    stay on the trajectory's engine or move: the overload and cost rules
    migration.py        relocate: a context warmed on another engine while the tool runs
"""

from __future__ import annotations

import math
from collections.abc import Callable

from prorsa.roles import Role
from prorsa.rollout.engine_choice import EngineChoice
from prorsa.rollout.engine_pools import AS_PREFILL, AS_WHOLE, Route, Turn
from prorsa.rollout.migration import Migration
from prorsa.rollout.placement import MoveCost

__all__ = ["Route", "Router"]  # Route is defined beside the books, and imported from here by its users


class Router(EngineChoice, Migration):
    """The parts are mixins over one set of books rather than collaborators: every rule reads the
    loads, the cost rule's backlogs and the sticky map alike, and a simulated rollout routes ~10^5
    turns, so the books stay plain attributes of the one router."""

    def __init__(self, roles: dict[str, Role], overload: float | str | None = 2.0, local_prefill_tokens: int = 0,
                 slots: int | dict[str, int] | None = None, move_cost: MoveCost | None = None,
                 clock: Callable[[], float] | None = None, engine_prices: dict[str, MoveCost] | None = None,
                 mixed_exports_kv: bool = True) -> None:
        self._init_pools(roles, slots)
        self.mixed_exports_kv = mixed_exports_kv
        self._init_prices(overload, move_cost, clock, engine_prices)
        # None: never leave for load ("cost" prices every move instead: the ratio is not used)
        self.overload = math.inf if overload is None or overload == "cost" else float(overload)
        self.local_prefill_tokens = local_prefill_tokens
        self._init_sticky()

    def join(self, engine: str, role: Role, slots: int | None = None) -> None:
        self._join_pools(engine, role, slots)
        self._join_prices(engine)

    def leave(self, engine: str) -> None:
        self._leave_pools(engine)
        self._leave_prices(engine)
        self._leave_sticky(engine)

    def route(self, traj_id: str, colocated: bool = False, appended: int | None = None,
              context: int = 0, remaining: float | None = None) -> Route:
        """`appended`: tokens this turn adds to the context (None: unknown, never decode-local);
        `context`: tokens before them, cached where the trajectory's last turn ran; `remaining`:
        the decode tokens its trajectory is predicted to have left, the cost rule's price of the
        wait where it goes (control/tail.py, scheduling.spread; None: one mean turn's)."""
        pools = self._pool()
        roles, decoders, mixed = pools.roles, pools.decoders, pools.mixed
        turn = Turn(context, appended or 0, remaining)
        # with no prefill engine, the mixed engines prefill for the decode engines, which would
        # otherwise idle while the allocator counts them as decoding
        exporting = self.mixed_exports_kv and len(decoders) > len(mixed)
        prefillers = pools.prefillers or (mixed if exporting else None)
        if colocated or not prefillers:
            # no prefill pool: the whole turn runs on one engine that does both phases
            whole = mixed if mixed and (colocated or self.mixed_exports_kv) else decoders
            decode, sticky = self._pick(traj_id, "decode", whole, turn, AS_WHOLE)
            return self._prefilled_by(decode, Route(prefill=None, decode=decode), turn, sticky)
        if appended is not None and appended <= self.local_prefill_tokens:
            decode, sticky = self._sticky_choice(traj_id, "decode", decoders, turn, AS_WHOLE)
            if sticky:  # the decode engine of its last turn still holds the context
                self._take(traj_id, "decode", decode)
                return self._prefilled_by(decode, Route(prefill=None, decode=decode, local_prefill=True), turn, True)
        # a mixed engine takes its own turn whole while no prefill engine has room for it
        whole_on_mixed = prefillers is mixed or self._full(prefillers)
        decode, sticky = self._pick(traj_id, "decode", decoders, turn,
                                    lambda e: "whole" if whole_on_mixed and roles[e] is Role.MIXED else "decode")
        if whole_on_mixed and roles[decode] is Role.MIXED:
            return self._prefilled_by(decode, Route(prefill=None, decode=decode), turn, sticky)
        prefill, sticky = self._pick(traj_id, "prefill", prefillers, turn, AS_PREFILL)
        return self._prefilled_by(prefill, Route(prefill=prefill, decode=decode), turn, sticky)

    def finished(self, route: Route) -> None:
        self._finish_loads(route)
        self._finish_kv(route)
