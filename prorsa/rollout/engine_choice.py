"""Which engine a leg of a turn goes to: its trajectory's engine for that leg, or another.

    _sticky_choice(traj_id, leg, eligible, turn, kind)  -> (engine, whether it is the
                                trajectory's previous engine for this leg); books nothing
    _pick(traj_id, leg, eligible, turn, kind)   the same, and the leg taken there

Sticky first: a trajectory's incremental prefill must run where its prefix is cached, or it
recomputes the whole context, so a turn goes back to the engines of its previous turn unless
they no longer serve that leg or are too busy (runtime.sticky_overload):
    a number    they carry more than that many times the least-loaded engine's turns
    None        never for load
    "cost"      the wait the move avoids is more than what it adds, both priced by the cost model
                for this turn (cost_rule.py, placement.py: the recompute, and the stall it puts on
                the decodes co-batched with it; the queue and the prefill backlog it leaves behind)
A trajectory reserve() gave a home goes there whenever it serves the leg, and no other goes there
while another engine serves it.
Ties break by engine order, so a seeded run routes the same way twice.

Engines of different sizes (engines.groups): `slots` and the cost rule's prices are per engine
(`slots` a dict, `engine_prices` each engine's MoveCost), so a wide decode engine is priced by its
own step times and KV, a 1-GPU prefill engine by its own prefill rate, and a new trajectory goes
to the engine with the least load as a share of its slots.
"""

from __future__ import annotations

from collections.abc import Callable

from prorsa.rollout.cost_rule import CostRule
from prorsa.rollout.engine_pools import AS_DECODE, Pool, Turn
from prorsa.rollout.stickiness import Stickiness


class EngineChoice(CostRule, Stickiness):
    # None: never leave for load ("cost" prices every move instead: the ratio is not used)
    overload: float

    def _sticky_choice(self, traj_id: str, leg: str, eligible: Pool, turn: Turn | None = None,
                       kind: Callable[[str], str] = AS_DECODE) -> tuple[str, bool]:
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

    def _pick(self, traj_id: str, leg: str, eligible: Pool, turn: Turn | None = None,
              kind: Callable[[str], str] = AS_DECODE) -> tuple[str, bool]:
        choice, sticky = self._sticky_choice(traj_id, leg, eligible, turn, kind)
        self._take(traj_id, leg, choice)
        return choice, sticky
