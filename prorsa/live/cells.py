"""A live rollout over cells: each cell its own Dask cluster (scheduler, engine and tool workers),
driver share, router and LiveController; one coordinator moving engines between them.

    await run_cells(cfg, cells, run_dir, coordinator, interval_s) -> CellsLive
                          cfg's synchronous step, its GRPO groups placed on the cells by free slots
                          (control/cells.py place), the engines split evenly; every cell rolls out
                          its share beside the others, in this process's event loop
    LiveCell              one cell up: the CellBody of rollout/cells.py
    await run_cells_dir(run, run_dir, console, journal) -> summary dict
                          `prorsa run` with runtime.cells > 1: run_cells, written as a one-cell
                          run is (trajectories, metrics.nc, summary.json with the cells and moves)

Inside a cell nothing differs from a one-cell run: a turn is keyed tasks on the cell's scheduler,
its legs go to the cell's role-tagged engine workers, and its LiveController switches roles. A
move between cells (rollout/cells.py coordinate):
  1. retire: the engine is held from role switches and closed to new legs in its cell's router;
     once no leg is on its worker or bound for it (the scheduler's view, as a role switch's drain)
     the worker leaves that cell's SpecCluster, and its EngineHost stops the engine
  2. admit: a worker of the same name joins the other cell's SpecCluster (an EngineHost starts a
     fresh engine, prefix cache empty) and that cell's router sends it work

With runtime.processes each cell's scheduler runs in a process of its own (distributed's
SubprocessScheduler; cluster/cell_scheduler.py gives it the driver's scheduler config), as do its
workers (Nannies), so cells share this process's event loop only for their drivers, routers and
controllers; without it, each cell's scheduler and workers run in this process. Synchronous runs
of one step only, as in the simulator's cells (sim/cells.py); config/pipeline.py refuses the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dask
from distributed import Client, Scheduler, SpecCluster
from distributed.deploy.subprocess import SubprocessScheduler
from rich.console import Console

from prorsa.agent.loop import TrajectoryResult
from prorsa.agent.workload import Workload
from prorsa.cluster.engine_host import engine_here
from prorsa.cluster.lifecycle_plugin import LifecyclePlugin
from prorsa.cluster.local import SCHEDULER_CONFIG, engine_addresses, tool_name, worker_specs
from prorsa.cluster.recovery import LegRescue
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.cells import CellView, Coordinator, MoveRecord
from prorsa.control.policy import make_policy
from prorsa.engine.registry import engine_name
from prorsa.live.controller import ControlPace, EngineCapacity, LiveController, _legs_on
from prorsa.live.run import ControlPlane, _both, control_plane, write_live_run
from prorsa.live.runtime import DaskTurnRunner, turn_options
from prorsa.metrics.journal import RunJournal
from prorsa.metrics.recorder import RunRecorder, merged
from prorsa.roles import Role
from prorsa.rollout.assemble import Body, roll_out
from prorsa.rollout.cells import coordinate, join_loop, leave_loop, plan_cells
from prorsa.rollout.context import RunContext, make_router, resolve
from prorsa.rollout.drivers import Hooks
from prorsa.rollout.legs import DECODE_LEGS, PREFILL_LEGS, WARM_LEGS

log = logging.getLogger(__name__)
ALL_LEGS = PREFILL_LEGS + DECODE_LEGS + WARM_LEGS


def _engine_stats(dask_worker):
    return engine_here(dask_worker).stats()


class LiveCell:
    def __init__(self, index: int, cfg: PipelineConfig, run: RunContext, names: list[str], placed: set[str],
                 run_dir: Path, t0: float) -> None:
        self.index, self.cfg, self.run, self.placed, self.run_dir, self.t0 = index, cfg, run, placed, run_dir, t0
        self.policy = make_policy(run.cfg.policy, run.policy)
        self.roles = dict(zip(names, self.policy.initial_roles(len(names))))
        self.rec = RunRecorder(engines=list(names), slots=cfg.engines.slots, expected=len(placed))
        self.leaving: set[str] = set()
        self.finished = False
        self.makespan = 0.0
        self.cluster: SpecCluster | None = None

    def _specs(self, roles: dict[str, Role]) -> dict[str, dict]:
        """Worker specs of these engines (their global names and indices, so an engine keeps its
        name in every cell) and of this cell's tool workers."""
        n = self.cfg.engines.count
        every = [roles.get(engine_name(i), Role.MIXED) for i in range(n)]
        specs = worker_specs(self.cfg, every, self.run_dir)
        keep = set(roles) | {tool_name(j) for j in range(self.cfg.runtime.tool_workers)}
        return {k: v for k, v in specs.items() if k in keep}

    def now(self) -> float:
        return time.time() - self.t0

    @contextlib.asynccontextmanager
    async def up(self):
        if self.cfg.runtime.processes:  # the scheduler in a process of its own, off the driver's event loop
            scheduler = {"cls": SubprocessScheduler, "options": {"scheduler_kwargs": {
                "host": "127.0.0.1", "dashboard": False, "preload": ["prorsa.cluster.cell_scheduler"]}}}
        else:  # workers in this process too: all of it in memory
            scheduler = {"cls": Scheduler, "options": {"protocol": "inproc", "dashboard": False}}
        cluster = SpecCluster(workers=self._specs(self.roles), scheduler=scheduler, asynchronous=True,
                              name=f"prorsa-{self.cfg.name}-cell{self.index}")
        with dask.config.set(SCHEDULER_CONFIG):  # read as the scheduler starts, not as the cluster is made
            try:
                await cluster
            except BaseException:  # a start that fails leaves nothing running
                await cluster.close()
                raise
        async with cluster, Client(cluster, asynchronous=True) as client:
            self.cluster, self.client = cluster, client
            self.addresses = await engine_addresses(client)
            yield self

    async def wire(self, t0: float) -> None:
        """The cell's lifecycle plugin, router, runner and control loop, on the run's clock `t0`
        (set once every cell's cluster is up)."""
        self.t0, client = t0, self.client
        await client.register_plugin(LifecyclePlugin(self.t0, self.run.unit))
        await client.register_plugin(LegRescue())
        run, cfg = self.run, self.run.cfg
        self.router = make_router(run, dict(self.roles), lambda: self.now() / run.unit)
        self.runner = DaskTurnRunner(client, self.router, self.addresses, cfg.runtime.turn_shape, False, 0, self.t0,
                                     turn_options(run))
        self.controller = LiveController(client, self.policy, self.router, self.addresses, self.rec,
                                         EngineCapacity(cfg.engines.slots, run.policy.kv_capacity_tokens,
                                                        restarts=run.switch == "restart"),
                                         ControlPace(self.t0, cfg.runtime.control_interval_s, run.unit,
                                                     max_cpu_share=cfg.runtime.control_cpu_share))

    async def _sample(self, t: float) -> None:
        try:
            stats = await self.client.run(_engine_stats, workers=list(self.addresses.values()))
        except Exception as e:  # an engine left or joined since the addresses were read: next time
            log.debug("cell %d: sample skipped (%s)", self.index, e)
        else:
            self.rec.sample(t, sorted(stats.values(), key=lambda s: s.engine_id))

    async def roll(self, workload: Workload, skip: frozenset[str],
                   on_done: Callable[[TrajectoryResult], None] | None = None) -> None:
        body = Body(self.runner, self.controller, now=self.now, clock_unit=1.0, sample=self._sample,
                    sample_interval_s=self.cfg.runtime.metrics_interval_s)
        done = self.rec.on_done if on_done is None else _both(self.rec.on_done, on_done)
        try:
            self.makespan = await roll_out(self.run, body, self.rec, Hooks(done, skip=skip), workload=workload)
        finally:
            self.finished = True

    # ------------------------------------------------------------------------------ CellBody
    def view(self, now: float) -> CellView:
        done = self.rec.trajectories
        in_flight = len(self.placed) - len(done)
        recent = [r.end_s for r in done if r.end_s >= now - 30.0]
        left = in_flight / (len(recent) / 30.0) if recent else None
        names = tuple(sorted(self.router.roles))
        busy = self.leaving | self.controller.switching
        movable = tuple(n for n in names if n not in busy and self.controller.spares(n))
        legs = {n: self.router.load.get(n, 0) for n in names}  # turns routed there and not yet back
        return CellView(self.index, names, movable, self.cfg.engines.slots, in_flight, legs, left)

    async def _drained(self, engine: str) -> None:
        # A turn routed before the close may not have reached the scheduler yet (the driver batches
        # its graph): the scheduler alone would call the engine drained, the worker would leave,
        # and that turn's legs, bound to it, would wait for it forever. The router's count ends
        # only as each routed turn is over.
        address = self.addresses[engine]
        while self.router.load.get(engine, 0) > 0 or await self.client.run_on_scheduler(_legs_on, address, ALL_LEGS):
            await asyncio.sleep(0.05)

    async def retire(self, engine: str) -> bool:
        self.leaving.add(engine)
        try:
            if not await leave_loop(self.controller, engine, self._drained):
                return False
            self.addresses.pop(engine)  # the runner and controller hold this same dict
            self.roles.pop(engine, None)
            self.cluster.worker_spec.pop(engine)
            await self.cluster  # the worker closes; its EngineHost stops the engine
            return True
        finally:
            self.leaving.discard(engine)

    async def admit(self, engine: str, role: Role) -> None:
        self.roles[engine] = role
        self.cluster.worker_spec.update(self._specs({engine: role}))
        await self.cluster  # the worker starts and its EngineHost starts a fresh engine
        self.addresses.update(await engine_addresses(self.client))
        self.rec.engines.append(engine)
        join_loop(self.controller, engine, role)

    def done(self) -> bool:
        return self.finished


@dataclass
class CellsLive:
    makespan_s: float  # wall seconds, the last cell's end
    recorders: list[RunRecorder]
    moves: list[MoveRecord]
    cell_makespans: list[float] = field(default_factory=list)
    engines_at_end: list[list[str]] = field(default_factory=list)
    policy: str = ""  # the cells' policy's name
    planes: list[ControlPlane] = field(default_factory=list)  # each cell's
    engines_at_start: list[list[str]] = field(default_factory=list)

    def trajectory_ids(self) -> list[str]:
        return [r.spec.traj_id for rec in self.recorders for r in rec.trajectories]


async def run_cells(cfg: PipelineConfig, cells: int, run_dir: Path, coordinator: Coordinator | None = None,
                    interval_s: float = 1.0, on_done: Callable[[TrajectoryResult], None] | None = None) -> CellsLive:
    """`interval_s`: the coordinator's, wall seconds (a live run's clock); `on_done`: called with
    each finished trajectory of every cell, as it lands (`prorsa run`: the run's journal)."""
    plan = plan_cells(cfg, cells)
    body = [LiveCell(i, cfg, resolve(plan.configs[i]), plan.names[i], plan.placed[i], run_dir, time.time())
            for i in range(cells)]
    coordinator = coordinator or Coordinator(interval_s=5 * interval_s, move_s=2 * interval_s)
    moves: list[MoveRecord] = []
    async with contextlib.AsyncExitStack() as stack:
        for c in body:
            await stack.enter_async_context(c.up())
        t0 = time.time()  # the clock starts once every cell is up
        for c in body:
            await c.wire(t0)
        moving = asyncio.ensure_future(coordinate(coordinator, body, lambda: time.time() - t0, interval_s, moves))
        try:
            await asyncio.gather(*(c.roll(plan.workload, plan.everyone - plan.placed[c.index], on_done)
                                   for c in body))
        except BaseException:
            moving.cancel()
            raise
        finally:
            # A move under way as the last cell ends is carried to its end (the coordinator stops
            # within interval_s of it): cancelled halfway, it left a Nanny half started or half
            # retired, and its SpecCluster's close failed on it (seen with runtime.processes).
            await asyncio.gather(moving, return_exceptions=True)
        ends = [sorted(c.router.roles) for c in body]
        planes = [await control_plane(c.client, c.runner, c.controller) for c in body]
    return CellsLive(max(c.makespan for c in body), [c.rec for c in body], moves,
                     [c.makespan for c in body], ends, body[0].policy.name, planes, plan.names)


async def run_cells_dir(run: RunContext, run_dir: Path, console: Console, journal: RunJournal) -> dict:
    """`prorsa run` of a pipeline with runtime.cells > 1: run_cells, its trajectories into the run's
    journal as they land, then the files a one-cell run writes (live/run.py write_live_run) from the
    cells' recorders merged, the summary adding each cell's share and the moves between them."""
    cfg = run.cfg
    plan = plan_cells(cfg, cfg.runtime.cells)
    console.print(f"starting {plan.describe()}")
    if cfg.runtime.dashboard_address is not None:  # said, so no one waits for a page that never comes
        console.print("no dashboard: a cell's scheduler serves none (runtime.dashboard_address is not used)")
    try:
        out = await run_cells(cfg, cfg.runtime.cells, run_dir, on_done=journal.add)
        journal.finish()
        rec = merged(out.recorders, len(plan.everyone))
        cells = {"count": len(out.recorders), "engines": out.engines_at_start, "engines_at_end": out.engines_at_end,
                 "trajectories": [len(r.trajectories) for r in out.recorders],
                 "makespan_s": [round(m, 4) for m in out.cell_makespans],
                 "role_switches": [len(r.role_changes) for r in out.recorders]}
        summary = write_live_run(run_dir, run, rec, out.makespan_s, out.policy, ControlPlane.summed(out.planes), 0,
                                 {"cells": cells, "moves": [asdict(m) for m in out.moves]})
        journal.seal()
        return summary
    finally:
        journal.close()
