"""Cells on either body: the coordinator's loop and the protocol a cell's body gives it.

    CellBody                      one cell, up: its view, and the two halves of a move
      view(now)      -> CellView  every coordinator interval (control/cells.py)
      retire(engine) -> bool      no new work for the engine here, no role switch on it, its legs
                                  drain; then it stops and is no longer this cell's (False: it
                                  stays, the last open engine of a phase once switches ended)
      admit(engine, role) -> None the engine starts here (the restart: a worker and engine up)
                                  and its router sends it work from then on
      done()         -> bool      every trajectory placed on the cell has finished
    await coordinate(coordinator, cells, now, interval_s, moves)
                                  until every cell is done (or the caller cancels it); each move
                                  carried out is appended to `moves` as a MoveRecord
    plan_cells(cfg, cells) -> CellPlan   the step's trajectories placed on cells by GRPO group (both
                                  bodies place alike): each cell's engines, pipeline and trajectories
    plan.describe()  -> str       one line of it, for `prorsa validate` and `prorsa run --dry-run`
    await leave_loop(loop, engine, drained) / join_loop(loop, engine, role)
                                  the router's and control loop's part of retire and admit, shared
                                  by both bodies: hold the cell's engines from role switches, close it,
                                  wait for the body's drain, forget it; or route to it

A move is one awaited retire and admit inside the loop: moves are rare (the coordinator waits its
interval_s after each), and a cell whose demand outgrew its engines gets the next one only once the
last has landed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prorsa.agent.workload import Workload
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.cells import CellView, Coordinator, MoveRecord, place
from prorsa.engine.registry import engine_name
from prorsa.roles import Role
from prorsa.rollout.control_loop import ControlLoop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CellPlan:
    workload: Workload
    configs: list[PipelineConfig]  # each cell's pipeline: its engines, its share of the prompts
    names: list[list[str]]         # each cell's engines, numbered across cells
    placed: list[set[str]]         # each cell's trajectories
    everyone: frozenset[str]

    def describe(self) -> str:
        return (f"{len(self.names)} cells: engines {'+'.join(str(len(n)) for n in self.names)}, "
                f"trajectories {'+'.join(str(len(p)) for p in self.placed)}")


def plan_cells(cfg: PipelineConfig, cells: int) -> CellPlan:
    """One synchronous step's trajectories on `cells` cells: engines split as evenly as they go,
    each GRPO group whole on the cell with the largest share of slots free (a group's trajectories
    share a prompt, so its prefix stays in one cell)."""
    if cfg.workload.mode != "sync" or cfg.workload.steps != 1:
        raise ValueError("cells run one synchronous step (a step is no barrier across cells yet)")
    n = cfg.engines.count
    if not 1 <= cells <= n:
        raise ValueError(f"{cells} cells for {n} engines")
    workload = Workload.from_config(cfg.workload, cfg.seed)
    specs = workload.trajectories_for_step(0)
    sizes = [n // cells + (i < n % cells) for i in range(cells)]
    first = [sum(sizes[:i]) for i in range(cells)]
    g = cfg.workload.group_size
    groups = [specs[i:i + g] for i in range(0, len(specs), g)]
    where = place([len(x) for x in groups], cells, [s * cfg.engines.slots for s in sizes])
    return CellPlan(
        workload,
        [cell_config(cfg, sizes[i], sum(1 for c in where if c == i)) for i in range(cells)],
        [[engine_name(first[i] + k) for k in range(sizes[i])] for i in range(cells)],
        [{s.traj_id for grp, c in zip(groups, where) if c == i for s in grp} for i in range(cells)],
        frozenset(s.traj_id for s in specs))


def cell_config(cfg: PipelineConfig, engines: int, groups: int) -> PipelineConfig:
    return cfg.model_copy(update={
        "engines": cfg.engines.model_copy(update={"count": engines}),
        "workload": cfg.workload.model_copy(update={"prompts": max(groups, 1)})})


class CellBody(Protocol):
    index: int

    def view(self, now: float) -> CellView: ...

    async def retire(self, engine: str) -> bool: ...

    async def admit(self, engine: str, role: Role) -> None: ...

    def done(self) -> bool: ...


async def coordinate(coordinator: Coordinator, cells: Sequence[CellBody], now: Callable[[], float],
                     interval_s: float, moves: list[MoveRecord], role: Role = Role.MIXED) -> None:
    """Every `interval_s` (the bodies' clock), ask the coordinator, and carry out its move: the
    engine joins its new cell as `role` (mixed by default: it serves either leg until that cell's
    controller gives it a role)."""
    while not all(c.done() for c in cells):
        await asyncio.sleep(interval_s)
        t = now()
        move = coordinator.decide(t, [c.view(t) for c in cells])
        if move is None:
            continue
        if not await cells[move.source].retire(move.engine):
            log.info("%s stays in cell %d: it is the last open engine of a phase there", move.engine, move.source)
            continue
        t_drained = now()
        await cells[move.target].admit(move.engine, role)
        moves.append(MoveRecord(t, move.engine, move.source, move.target, move.reason,
                                t_drained - t, now() - t_drained))
        log.info("%s: cell %d -> %d (drain %.1fs, restart %.1fs): %s", move.engine, move.source, move.target,
                 moves[-1].drain_s, moves[-1].restart_s, move.reason)


async def leave_loop(loop: ControlLoop, engine: str, drained: Callable[[str], Awaitable[None]]) -> bool:
    """False, and the engine stays, if once the switches under way have ended it is the last open
    engine of a phase (it was not when the coordinator chose it: seen live, a cell's other decode
    engine was switching to prefill)."""
    # Every engine of the cell is held, not just the one leaving: a switch drains its engine
    # closed, and a switch beside the move could leave no open engine of a role (seen live: both
    # decode engines of a cell closed at once, and the turns meanwhile failed).
    held = sorted(loop.router.roles)
    for e in held:
        await loop.hold(e)  # a switch under way ends first; no new one starts
    try:
        if not loop.spares(engine):
            return False
        loop.router.close(engine)  # no new leg: the trajectories it held go to the cell's others
        await drained(engine)
        loop.router.leave(engine)
        return True
    finally:
        for e in held:
            loop.release(e)


def join_loop(loop: ControlLoop, engine: str, role: Role, slots: int | None = None) -> None:
    loop.router.join(engine, role, slots)
