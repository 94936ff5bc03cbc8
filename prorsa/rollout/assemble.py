"""One rollout, driven the same way by both bodies; they differ only in transport and clock.

    Body                        what a body brings: its turn runner (transport), its control loop,
                                its clock and how it samples its engines
    await roll_out(run, body, rec, hooks, **options) -> makespan   hooks: rollout/drivers.py Hooks
                                the run's workload driven to its end by the sync or async driver
                                (sync with partial_rollout: rollout/partial.py's steps ended early),
                                with the body's sampler and control loop beside it; then a last
                                sample at the makespan (in the body clock's seconds)
    async with beside(body): ...  the sampler and control loop running around a caller's own
                                driving (the Python API's batches)

live/run.py builds a Body of Dask tasks on the wall clock; sim/run.py one of direct awaits on the
virtual clock. Everything else about a rollout (which driver, which trajectories, when the control
loop and sampler start and stop) is here, once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from prorsa.agent.loop import TrajectoryResult, TurnRunner
from prorsa.agent.workload import Workload
from prorsa.metrics.recorder import RunRecorder
from prorsa.rollout.context import RunContext
from prorsa.rollout.control_loop import ControlLoop
from prorsa.rollout.drivers import Hooks, run_async, run_sync
from prorsa.rollout.partial import Checkpoint, PartialPlan, run_partial

Drive = Callable[..., Awaitable[list[TrajectoryResult]]]  # run_sync's signature


@dataclass
class Body:
    runner: TurnRunner  # carries each turn out
    controller: ControlLoop  # the policy's loop over this body's engines
    now: Callable[[], float]  # the drivers' clock: seconds since the rollout began
    clock_unit: float  # wall seconds per second of `now` (the workload's durations are wall seconds)
    sample: Callable[[float], Awaitable[None]]  # every engine's load into the recorder, stamped t
    sample_interval_s: float  # in `now`'s seconds
    background: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # more loops beside
    # awaits the rollout task (live: a signal cancels it); None: the rollout is awaited as it is
    guard: Callable[[asyncio.Task], Awaitable[None]] | None = None


async def roll_out(run: RunContext, body: Body, rec: RunRecorder, hooks: Hooks, *,
                   on_stop: Callable[[], None] | None = None, workload: Workload | None = None,
                   driver: Drive | None = None, checkpoint: Checkpoint | None = None) -> float:
    """`hooks`: what the drivers call back and are told (rollout/drivers.py); its on_turn,
    before_step and clock_unit are the recorder's and the body's, set here. `on_stop`: called as
    the rollout ends, interrupted or not, before the loops beside it stop; `workload`: the run's,
    when the body has drawn it already; `driver`: what starts the trajectories instead of the
    workload's sync or async driver (prorsa serve: its requests); `checkpoint`: a partial
    rollout's, kept with each commit."""
    cfg = run.cfg
    workload = workload or Workload.from_config(cfg.workload, cfg.seed)
    wcfg = cfg.workload
    if body.clock_unit != 1.0:  # wall seconds, as the pipeline gives them, in the drivers' clock
        wcfg = wcfg.model_copy(update={k: getattr(wcfg, k) / body.clock_unit
                                       for k in ("duration_s", "weight_update_every_s") if getattr(wcfg, k) is not None})
    drive, extra = driver or (run_sync if wcfg.mode == "sync" else run_async), {}
    if driver is None and (plan := PartialPlan.of(cfg)) is not None:  # sync only: the schema says so
        drive, extra = run_partial, {"partial": plan, "checkpoint": checkpoint}
    # a trace's releases (start_s) stay on the specs: the driver converts each with the same unit
    before_step = body.controller.before_step if wcfg.mode == "sync" else None
    hooks = replace(hooks, on_turn=rec.on_turn, before_step=before_step, clock_unit=body.clock_unit)
    rollout = drive(workload, wcfg, body.runner, body.now, hooks, **extra)
    async with beside(body, on_stop):
        if body.guard is None:
            await rollout
        else:
            await body.guard(asyncio.create_task(rollout))
    makespan = body.now()
    await body.sample(makespan)
    return makespan


@contextlib.asynccontextmanager
async def beside(body: Body, on_stop: Callable[[], None] | None = None) -> AsyncIterator[None]:
    """The body's sampler, control loop and background loops running while the block drives
    trajectories; `on_stop` is called as the block ends, however it ends, before they stop."""
    loops = [asyncio.create_task(_every(body.sample, body.now, body.sample_interval_s)),
             asyncio.create_task(body.controller.run()),
             *(asyncio.create_task(loop()) for loop in body.background)]
    ended_well = False
    try:
        yield
        ended_well = True
    finally:
        if on_stop is not None:
            on_stop()
        failed = []
        for task in reversed(loops):  # every loop stopped and its end read, even after one failed:
            task.cancel()             # an end left unread is printed as "never retrieved" at exit
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as e:  # noqa: BLE001  (a loop's own failure, kept for below)
                failed.append(e)
        # a loop that failed says so where the block ended well; where it is ending on an error of
        # its own (a full disk, an interrupt), that error is the one told
        if failed and ended_well:
            raise failed[0]


async def _every(sample: Callable[[float], Awaitable[None]], now: Callable[[], float], interval_s: float) -> None:
    while True:
        await sample(now())
        await asyncio.sleep(interval_s)
