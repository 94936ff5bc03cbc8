"""Which engine holds each trajectory's context, so that its next turn goes back there.

    pin(traj_id, engine)        the trajectory's next turn goes to `engine` for every leg
    reserve(homes)              each trajectory of `homes` keeps its engine; no other goes there
    forget(traj_id)             the trajectory is over: nothing of it is kept
    _take(traj_id, leg, engine) the leg runs on `engine`: the trajectory's engine for that leg from
                                now on, one more turn in flight there
    _unreserved(eligible)       `eligible` less the engines reserve() gave away
    _leave_sticky(engine)       the engine has left: its trajectories go elsewhere next turn

A trajectory's incremental prefill must run where its prefix is cached, or it recomputes the whole
context; engine_choice.py decides when a turn leaves anyway.
"""

from __future__ import annotations

from prorsa.rollout.engine_pools import EnginePools, Pool


class Stickiness(EnginePools):
    _sticky: dict[str, dict[str, str]]  # leg -> traj -> engine
    _homes: dict[str, str]  # reserve(): trajectory -> its engine
    _reserved: set[str]  # engines reserve() gave away: no other trajectory goes there
    _shut: dict[int, tuple[Pool, Pool]]  # pool's id -> (pool, pool less the reserved)

    def _init_sticky(self) -> None:
        self._sticky = {"prefill": {}, "decode": {}}
        self._homes = {}
        self._reserved = set()
        self._shut = {}

    def pin(self, traj_id: str, engine: str) -> None:
        for leg in self._sticky.values():
            leg[traj_id] = engine

    def reserve(self, homes: dict[str, str]) -> None:
        self._homes.update(homes)
        self._reserved.update(homes.values())
        self._shut.clear()

    def _unreserved(self, eligible: Pool) -> Pool:
        # a pool lives until a role or a closure changes, so its filtered copy is kept beside it
        kept = self._shut.get(id(eligible))
        if kept is None or kept[0] is not eligible:
            kept = eligible, Pool([e for e in eligible if e not in self._reserved] or list(eligible))
            self._shut[id(eligible)] = kept
        return kept[1]

    def _take(self, traj_id: str, leg: str, engine: str) -> None:
        self._sticky[leg][traj_id] = engine
        self.load[engine] += 1

    def _leave_sticky(self, engine: str) -> None:
        # trajectories sticky to it go to the least loaded engine next turn (their prefix is gone)
        for sticky in self._sticky.values():
            for traj in [t for t, e in sticky.items() if e == engine]:
                del sticky[traj]

    def forget(self, traj_id: str) -> None:
        self._homes.pop(traj_id, None)
        self._sticky["prefill"].pop(traj_id, None)
        self._sticky["decode"].pop(traj_id, None)
