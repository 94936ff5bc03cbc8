"""A simulated rollout over cells: N cells, each its own router, control loop and policy over its
group of engines, one coordinator moving engines between them (control/cells.py), all on one
virtual clock.

    simulate_cells(cfg, cells, policy=None, ...) -> CellsRun   cfg's synchronous workload, its
                                     GRPO groups placed on the cells by free slots (control/cells.py
                                     place), the engines split evenly (engine-<i> keep their names)

Each cell is the one-cell simulator's assembly (sim/run.py) with its own RunContext, so a cell's
policy plans for its engines and its trajectories; the cells share one Workload, each driving the
trajectories placed on it (the others are its `skip`). A move (rollout/cells.py): the engine is
retired in its cell (held from role switches, closed to new legs, drained), stopped, and after
`restart_s` a fresh emulated engine of the same name starts in the other cell, its prefix cache
empty. restart_s stands for a server's start on its new cell's scheduler (weights loaded, CUDA
graphs captured); the default, 60 s, is an assumption, not a measurement.

Limits: synchronous runs only, and each cell's steps run on their own (a step is not a barrier
across cells): run one step per call (benchmarks/cells.py does).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from prorsa.agent.workload import Workload, context_budget
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.cells import CellView, Coordinator, MoveRecord
from prorsa.control.policy import make_policy
from prorsa.costmodel import load_gpu
from prorsa.engine.emulated import EmulatedEngine, KvMemory
from prorsa.metrics.recorder import RunRecorder
from prorsa.roles import Role
from prorsa.rollout.assemble import Body, roll_out
from prorsa.rollout.cells import coordinate, join_loop, leave_loop, plan_cells
from prorsa.rollout.context import RunContext, make_router, make_scheduler, resolve
from prorsa.rollout.drivers import Hooks
from prorsa.rollout.legs import DECODE_LEGS, PREFILL_LEGS, WARM_LEGS
from prorsa.sim.clock import run_virtual
from prorsa.sim.controller import SimController
from prorsa.sim.rehearse import rehearser
from prorsa.sim.run import _rare_collections, simulate_async
from prorsa.sim.runner import SimTurnRunner

ALL_LEGS = PREFILL_LEGS + DECODE_LEGS + WARM_LEGS


@dataclass
class CellsRun:
    cfg: PipelineConfig
    cells: int
    makespan_s: float  # body seconds: the last cell's end
    recorders: list[RunRecorder]  # each cell's
    moves: list[MoveRecord]
    wall_s: float = 0.0
    cell_makespans: list[float] = field(default_factory=list)

    def trajectory_ids(self) -> list[str]:
        return [r.spec.traj_id for rec in self.recorders for r in rec.trajectories]


class SimCell:
    """One cell on the virtual clock: the CellBody of rollout/cells.py."""

    def __init__(self, index: int, run: RunContext, names: list[str], policy, placed: set[str],
                 now, restart_s: float) -> None:
        cfg, e = run.cfg, run.cfg.engines
        self.index, self.run, self.now, self.restart_s = index, run, now, restart_s
        self.placed = placed
        context = replace(run.policy, rehearse=rehearser(run, simulate_async))
        self.policy = make_policy(policy or cfg.policy, context) if policy is None or isinstance(policy, str) else policy
        roles = self.policy.initial_roles(len(names))
        self.engines = {n: EmulatedEngine(n, r, run.costs, slots=e.slots, time_scale=1.0,
                                       memory=KvMemory(prefix_cache=e.prefix_cache))
                        for n, r in zip(names, roles)}
        self.router = make_router(run, {n: eng.role for n, eng in self.engines.items()}, now)
        self.runner = SimTurnRunner(self.engines, self.router, now, tool_unit=run.unit,
                                    dispatch_s=load_gpu(e.gpu).dispatch_latency_s, scheduler=make_scheduler(run),
                                    context_budget=context_budget(cfg.workload))
        self.rec = RunRecorder(engines=list(names), slots=e.slots, expected=len(placed))
        self.controller = SimController(self.policy, self.router, self.runner, self.engines, self.rec,
                                        run.policy.interval_s, now)
        self.leaving: set[str] = set()
        self.makespan = 0.0
        self.finished = False

    # ------------------------------------------------------------------------------ CellBody
    def view(self, now: float) -> CellView:
        done = self.rec.trajectories
        in_flight = len(self.placed) - len(done)
        recent = [r.end_s for r in done if r.end_s >= now - 60.0]  # the last minute's finishing rate
        left = in_flight / (len(recent) / 60.0) if recent else None
        names = tuple(sorted(self.engines))
        busy = self.leaving | self.controller.switching
        movable = tuple(n for n in names if n not in busy and self.controller.spares(n))
        return CellView(self.index, names, movable, self.run.cfg.engines.slots, in_flight,
                        {n: self.runner.legs_on(n, ALL_LEGS) for n in names}, left)

    async def retire(self, engine: str) -> bool:
        self.leaving.add(engine)
        try:
            if not await leave_loop(self.controller, engine, lambda e: self.runner.drained(e, ALL_LEGS)):
                return False
        finally:
            self.leaving.discard(engine)
        gone = self.engines.pop(engine)  # the runner and the controller hold this same dict
        self.controller.engines_changed()
        await gone.stop()
        return True

    async def admit(self, engine: str, role: Role) -> None:
        await asyncio.sleep(self.restart_s)
        e = self.run.cfg.engines
        fresh = EmulatedEngine(engine, role, self.run.costs, slots=e.slots, time_scale=1.0,
                               memory=KvMemory(prefix_cache=e.prefix_cache))
        await fresh.start()
        self.runner.add_engine(engine, fresh)
        self.controller.engines_changed()
        self.rec.engines.append(engine)
        join_loop(self.controller, engine, role)

    def done(self) -> bool:
        return self.finished

    # ------------------------------------------------------------------------------ the rollout
    async def roll(self, workload: Workload, skip: frozenset[str]) -> None:
        for engine in self.engines.values():
            await engine.start()

        async def sample(t: float) -> None:
            self.rec.sample(t, [e.load() for e in self.engines.values()])

        body = Body(self.runner, self.controller, self.now, clock_unit=self.run.unit, sample=sample,
                    sample_interval_s=max(self.run.cfg.runtime.metrics_interval_s / self.run.unit, 1.0))
        try:
            self.makespan = await roll_out(self.run, body, self.rec, Hooks(self.rec.on_done, skip=skip),
                                           workload=workload)
        finally:
            self.finished = True
        for engine in list(self.engines.values()):
            await engine.stop()


async def simulate_cells_async(cfg: PipelineConfig, cells: int, policy=None, coordinator: Coordinator | None = None,
                               interval_s: float = 10.0, restart_s: float = 60.0) -> CellsRun:
    plan = plan_cells(cfg, cells)
    loop = asyncio.get_running_loop()
    started = loop.time()

    def now() -> float:
        return loop.time() - started

    body = []
    for i in range(cells):
        body.append(SimCell(i, resolve(plan.configs[i]), plan.names[i], policy, plan.placed[i], now, restart_s))
    coordinator = coordinator or Coordinator(interval_s=3 * interval_s, move_s=restart_s + interval_s)
    moves: list[MoveRecord] = []
    moving = asyncio.ensure_future(coordinate(coordinator, body, now, interval_s, moves))
    try:
        await asyncio.gather(*(c.roll(plan.workload, plan.everyone - plan.placed[c.index]) for c in body))
    finally:
        moving.cancel()  # a move under way when the last cell ends is not recorded
        await asyncio.gather(moving, return_exceptions=True)
    return CellsRun(cfg, cells, max(c.makespan for c in body), [c.rec for c in body], moves,
                    cell_makespans=[c.makespan for c in body])


def simulate_cells(cfg: PipelineConfig, cells: int, policy=None, **kw) -> CellsRun:
    t0 = time.perf_counter()
    with _rare_collections():
        out = run_virtual(simulate_cells_async(cfg, cells, policy, **kw))
    out.wall_s = time.perf_counter() - t0
    return out
