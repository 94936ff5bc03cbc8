"""A live run, top to bottom: cluster up, engines up, drive the workload, sample, write, tear down.

    run_live(run, run_dir, console, lend=) -> summary dict   run: a RunContext (rollout/context.py
                                                      resolve: the caller checks the pipeline)
    async with open_live(run, run_dir, console, lend=) as live   the same assembly, kept up for a
                                                      caller that drives it (the Python API, prorsa/api/)

`lend`: the simulator the caller lends the run's policy for its rehearsals, as a function of the
run (sim/run.py `lend`); None: the policy plans with its fluid model alone. The live body does not
import the simulator: the caller, above both, hands it over.

Finished trajectories go to the run's journal (metrics/journal.py) as they land; a journal that
holds some from an earlier session (--resume) makes the drivers skip those.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from distributed import Client
from rich.console import Console

from prorsa.agent.workload import Workload
from prorsa.cluster.engine_host import engine_here
from prorsa.cluster.launch import open_run_cluster
from prorsa.cluster.lifecycle_plugin import LifecyclePlugin, hook_cost
from prorsa.cluster.local import engine_addresses
from prorsa.cluster.recovery import LegRescue, live_addresses, rescued
from prorsa.cluster.security import dashboard_exposure
from prorsa.cluster.tool_host import driver_environment
from prorsa.config.cluster import ClusterSpec
from prorsa.config.pipeline import PipelineConfig
from prorsa.console.clocked import plain
from prorsa.console.decisions import DecisionTeller
from prorsa.console.progress import Progress
from prorsa.console.start_progress import start_log, start_progress
from prorsa.control.policy import Policy, PolicyContext, Rehearse, make_policy
from prorsa.dashboard.disconnects import quiet_disconnects
from prorsa.dashboard.plugin import add_to_run, dashboard_links
from prorsa.engine.base import ModelsWeightUpdates
from prorsa.engine.registry import backend_of
from prorsa.live.controller import ControlPace, EngineCapacity, LiveController
from prorsa.live.interrupt import guarded
from prorsa.live.resume import open_journal
from prorsa.live.runtime import DaskTurnRunner, turn_options
from prorsa.metrics.journal import RunJournal, flush_every
from prorsa.metrics.outputs import resumed_figures, summarise
from prorsa.metrics.outputs import write_run as write_run_files
from prorsa.metrics.recorder import RunRecorder
from prorsa.rl.training import open_learner, push_weights, warm_start
from prorsa.rollout.assemble import Body, Drive, roll_out
from prorsa.rollout.context import RunContext, make_router, prior_checked
from prorsa.rollout.drivers import Hooks
from prorsa.rollout.partial import Checkpoint
from prorsa.train.learner import Learner


log = logging.getLogger(__name__)


def _engine_stats(dask_worker):
    return engine_here(dask_worker).stats()


def _engine_info(dask_worker) -> tuple[bool, int]:
    engine = engine_here(dask_worker)
    return engine.needs_token_ids, getattr(engine, "vocab_size", 0)


def _sampler(client: Client, addresses: dict[str, str], rec: RunRecorder, progress: Progress):
    async def sample(t: float) -> None:
        try:
            stats = await client.run(_engine_stats, workers=await live_addresses(client, addresses))
        except Exception as e:  # an engine's worker died since the last look: sample next time
            log.warning("engine sample failed (%s: %s)", type(e).__name__, e)
        else:
            rec.sample(t, sorted(stats.values(), key=lambda s: s.engine_id))
        progress.refresh()

    return sample


async def _update_weights_here(body_s: float, dask_worker=None) -> None:
    engine = engine_here(dask_worker)
    if isinstance(engine, ModelsWeightUpdates):  # emulated: stall and forget prefixes
        await engine.update_weights(body_s)
    else:  # real engines: new weights invalidate every cached prefix (loading them is issue 10's)
        await engine.reset_prefix_cache()


def _weight_update(client: Client, addresses: dict[str, str], run: RunContext):
    wall_s = run.update_s
    if wall_s <= 0:
        return None
    body_s = run.body_s(wall_s)

    async def update() -> None:
        await client.run(_update_weights_here, body_s, workers=await live_addresses(client, addresses))

    return update


def _both(*callbacks):
    def call(result) -> None:
        for cb in callbacks:
            cb(result)
    return call


def _median(xs: list[float]) -> float | None:
    return round(sorted(xs)[len(xs) // 2], 5) if xs else None


Lend = Callable[[RunContext], Rehearse | None]


async def run_live(run: RunContext, run_dir: Path, console: Console, policy: Policy | None = None,
                   journal: RunJournal | None = None, cluster: ClusterSpec | None = None,
                   driver: Drive | None = None, *, lend: Lend | None) -> dict:
    """`run`: the pipeline resolved (rollout/context.py resolve: its checks are the caller's);
    `policy`: an object to run instead of the pipeline's (the simulator takes the same);
    `journal`: the run directory's, already open (default: opened here);
    `cluster`: where the workers come from (default: a LocalCluster; cluster/launch.py);
    `driver`: what starts the trajectories instead of the workload's driver (prorsa serve)."""
    if journal is None:
        journal = open_journal(run.cfg, run_dir)
    try:
        return await _run_live(run, run_dir, console, policy, journal, cluster, driver, lend)
    finally:
        journal.close()


@dataclass
class LiveSession:
    """A live body, up: what `open_live` yields to whoever drives it (`prorsa run`, the Python API)."""

    run: RunContext  # after the warm start (the engines' model may be its weights)
    client: Client
    addresses: dict[str, str]  # engine name -> worker address
    policy: Policy
    rec: RunRecorder
    runner: DaskTurnRunner
    controller: LiveController
    body: Body
    t0: float  # wall time the rollout's clock starts from

    def now(self) -> float:
        return time.time() - self.t0


async def _run_live(run: RunContext, run_dir: Path, console: Console, policy: Policy | None,
                    journal: RunJournal, cluster: ClusterSpec | None, driver: Drive | None, lend: Lend | None) -> dict:
    async with open_live(run, run_dir, console, policy, cluster, journal, open_ended=driver is not None,
                         lend=lend) as live:
        cfg, client, rec, runner, controller = live.run.cfg, live.client, live.rec, live.runner, live.controller
        environment = driver_environment(cfg, client)
        learner = None if cfg.train is None else await open_learner(
            cfg, run_dir, client, live.addresses, live.now, journal)
        point = None
        if cfg.partial_rollout is not None:  # kept with each commit, for a resume (rollout/partial.py)
            point = Checkpoint(saved=journal.saved_state)
            journal.driver_state = lambda: point.current() if point.current is not None else None
        try:
            makespan = await roll_out(live.run, live.body, rec, _hooks(live, journal, learner, environment),
                                      on_stop=journal.flush,  # interrupted or not, what finished is kept
                                      driver=driver, checkpoint=point)
            plane = await control_plane(client, runner, controller)
        finally:
            if learner is not None:
                learner.close()

    saved = journal.finish()
    resumed = journal.saved_before
    summary = write_live_run(run_dir, live.run, rec, makespan, live.policy.name, plane, resumed,
                             ({"train": learner.summary()} if learner else {}) | (
                                 # every figure over all sessions, not this one's alone
                                 resumed_figures(saved, journal.elapsed_before + makespan) if resumed else {}))
    journal.seal()  # last: killed before it, the run is resumed, and writes these files again
    return summary


def _hooks(live: LiveSession, journal: RunJournal, learner: Learner | None, environment) -> Hooks:
    """What the drivers call back: the journal, the recorder, the controller and the learner (RL:
    its updates, its version on every turn, and the staleness gate of an async run)."""
    cfg, client = live.run.cfg, live.client
    done = _both(journal.add, live.rec.on_done, live.controller.trajectory_done,
                 *([learner.on_done] if learner else []))
    return Hooks(done, episodes=environment.episode if environment else None,
                 update_weights=learner.update if learner else _weight_update(client, live.addresses, live.run),
                 skip=frozenset(journal.done_ids), load_weights=push_weights(client, live.addresses),
                 version=None if learner is None else (lambda: learner.version),
                 gate=learner.may_start if learner is not None and cfg.workload.mode == "async" else None)


@dataclass(frozen=True)
class ControlPlane:
    """A live body's control-plane figures, read before its cluster goes (cells: one a cell)."""

    turns_retried: int
    turns_migrated: int
    legs_rescued: int
    step_s: list[float]  # the controller's wall time, each interval
    step_cpu_s: list[float]  # and its CPU
    plugin_s: float  # the lifecycle plugin's own time on the scheduler
    plugin_calls: int

    @classmethod
    def summed(cls, planes: list[ControlPlane]) -> ControlPlane:
        return cls(*(sum(getattr(p, k) for p in planes) for k in ("turns_retried", "turns_migrated", "legs_rescued")),
                   [s for p in planes for s in p.step_s], [s for p in planes for s in p.step_cpu_s],
                   sum(p.plugin_s for p in planes), sum(p.plugin_calls for p in planes))


async def control_plane(client: Client, runner: DaskTurnRunner, controller: LiveController) -> ControlPlane:
    plugin_s, plugin_calls = await client.run_on_scheduler(hook_cost)
    return ControlPlane(runner.retried, runner.migrated, await client.run_on_scheduler(rescued),
                        list(controller.step_s), list(controller.step_cpu_s), plugin_s, plugin_calls)


def write_live_run(run_dir: Path, run: RunContext, rec: RunRecorder, makespan: float, policy: str,
                   plane: ControlPlane, resumed: int, extra: dict) -> dict:
    """summary.json and metrics.nc of a finished live run (the journal has written its
    trajectories); the summary, `extra` last."""
    cfg, unit = run.cfg, run.unit
    digest = run.digest
    summary = summarise(rec, makespan, policy, digest, cfg.name) | {
        "turns_retried": plane.turns_retried,
        "turns_migrated": plane.turns_migrated,
        "legs_rescued": plane.legs_rescued,
        "trajectories_resumed": resumed,
        "backend": cfg.engines.backend, "clock": "wall", "time_scale": unit,
        "control": {"intervals": len(plane.step_s), "step_s_median": _median(plane.step_s),
                    "step_cpu_s_median": _median(plane.step_cpu_s),
                    "step_cpu_s": round(sum(plane.step_cpu_s), 4),
                    "plugin_s": round(plane.plugin_s, 4), "plugin_calls": plane.plugin_calls},
    } | extra
    write_run_files(run_dir, rec, summary, makespan, time_scale=unit)
    return summary


def _opening_policy(run: RunContext, policy: Policy | None, open_ended: bool,
                    lend: Lend | None) -> tuple[RunContext, PolicyContext, Policy]:
    """The run told its opening batch, and the policy it runs with."""
    cfg = run.cfg
    if not open_ended and (cfg.environment is None or cfg.environment.mode == "replay"):
        # the batch the run opens with is in hand, its prompts counted: a prior they contradict goes
        run = prior_checked(run, Workload.from_config(cfg.workload, cfg.seed))
    # between synchronous steps prorsa may rehearse candidate splits in the simulator (seconds of CPU
    # in the policy's thread, while the weights update)
    context = replace(run.policy, rehearse=lend(run) if lend is not None else None)
    return run, context, policy or make_policy(cfg.policy, context)


def _engine_capacity(run: RunContext) -> EngineCapacity:
    """Each engine's slots and KV tokens: its group's (an MoE engine's KV is every DP rank's)."""
    return EngineCapacity({e.name: e.slots for e in run.engines}, {e.name: e.kv_tokens for e in run.engines},
                          restarts=run.switch == "restart")


def _dashboard_shower(console: Console, cfg: PipelineConfig, links: list[str]):
    def show_dashboard(cluster) -> None:  # before the wait for the engines: the status page shows it
        if cfg.runtime.dashboard_address is not None:
            quiet_disconnects()  # the scheduler's process, unless it runs elsewhere (then the plugin's)
            links[:] = dashboard_links(cluster)
            console.print(f"dashboard: {links[0]}", soft_wrap=True)
            if wide := dashboard_exposure(cfg.runtime.dashboard_address):
                console.print(wide, soft_wrap=True, markup=False, highlight=False)

    return show_dashboard


def _recorder(engines: list[str], slots: int | dict[str, int], run: RunContext, open_ended: bool,
              journal: RunJournal | None) -> RunRecorder:
    """Seeded with an earlier session's counts when the journal holds some."""
    return RunRecorder(engines=engines, slots=slots,
                       expected=None if open_ended else run.expected,
                       completed=journal.completed_before if journal is not None else 0,
                       failed=journal.failed_before if journal is not None else 0,
                       dropped=journal.dropped_before if journal is not None else 0)


async def _plugins(client: Client, rec: RunRecorder, run: RunContext, policy: Policy, engines: list[str],
                   kv_capacity: int, t0: float):
    """The scheduler's lifecycle and rescue plugins, and the dashboard's feed (None without one)."""
    cfg, unit = run.cfg, run.unit
    await client.register_plugin(LifecyclePlugin(t0, unit))
    await client.register_plugin(LegRescue())
    if cfg.runtime.dashboard_address is None:
        return None
    return await add_to_run(
        client, rec, {"name": cfg.name, "policy": policy.name, "engines": engines, "slots": cfg.engines.slots,
                      "kv_capacity": kv_capacity, "time_unit": unit, "expected": rec.expected}, t0, unit)


async def _warm_start(run: RunContext, run_dir: Path, console: Console, say: Callable[[str], None]):
    """The run on the weights its engines start from (RL: the warmed-up ones), and its engine backend."""
    run = replace(run, cfg=await warm_start(run.cfg, run_dir, console))
    backend = backend_of(run.cfg.engines)
    if backend.launches_servers:  # the model made once here, not once per engine worker
        model_dir = await asyncio.to_thread(backend.model_dir)
        say(f"model: {model_dir}")
        say(f"engine logs: {run_dir / 'engines'}/engine-<i>.log")
    return run, backend


@asynccontextmanager
async def open_live(run: RunContext, run_dir: Path, console: Console, policy: Policy | None = None,
                    cluster: ClusterSpec | None = None, journal: RunJournal | None = None,
                    open_ended: bool = False, *, lend: Lend | None) -> AsyncIterator[LiveSession]:
    """Cluster, engines, plugins, router, runner and control loop up, torn down on exit: the one
    assembly of a live run. `journal`: a run's (its counts seed the recorder and it is flushed on a
    timer beside the rollout); None: nothing is written as trajectories finish (the Python API).
    `open_ended`: a driver of its own (prorsa serve) starts as many trajectories as its clients ask for."""
    run, context, policy = _opening_policy(run, policy, open_ended, lend)
    cfg, unit = run.cfg, run.unit
    roles = policy.initial_roles(cfg.engines.count)
    engines = [spec.name for spec in run.engines]

    def say(line: str) -> None:  # a line as it is: engine and policy words hold brackets
        plain(console, line)

    def tell_start(line: str) -> None:  # the start-up, for a host application's logging too
        start_log.info(line)
        say(line)

    tell_start(f"starting {cfg.engines.count} {cfg.engines.backend} engines "
               f"({', '.join(r.value for r in roles)}) and {cfg.runtime.tool_workers} tool worker(s)")
    teller = DecisionTeller(say, policy)
    teller.opening(roles)
    t_boot = time.time()
    run, backend = await _warm_start(run, run_dir, console, say)
    cfg = run.cfg

    links: list[str] = []
    async with start_progress(run_dir / "engines", engines if backend.launches_servers else [], say) as watch, \
            open_run_cluster(cluster, cfg, roles, run_dir, console, _dashboard_shower(console, cfg, links)) as started:
        watch.stop()
        client = started.client
        addresses = await engine_addresses(client)
        needs_ids, vocab = next(iter((await client.run(_engine_info, workers=[addresses[engines[0]]])).values()))
        tell_start(f"engines ready in {time.time() - t_boot:.1f} s")

        capacity = _engine_capacity(run)
        rec = _recorder(engines, capacity.slots, run, open_ended, journal)
        t0 = time.time()
        if journal is not None:
            journal.clock = lambda: time.time() - t0  # each manifest says how long this session has run
        feed = await _plugins(client, rec, run, policy, engines, context.kv_capacity_tokens, t0)
        if links:  # the page and its data exist from here on
            console.print(f"prorsa page: {links[1]}  data: {links[2]}", soft_wrap=True)
        router = make_router(run, dict(zip(engines, roles)), lambda: (time.time() - t0) / unit)
        runner = DaskTurnRunner(client, router, addresses, cfg.runtime.turn_shape, needs_ids, vocab, t0,
                                turn_options(run, backend.start_timeout_s))
        controller = LiveController(client, policy, router, addresses, rec, capacity,
                                    ControlPace(t0, cfg.runtime.control_interval_s, unit,
                                                max_cpu_share=cfg.runtime.control_cpu_share), feed)
        controller.on_decision = teller.told
        flush = [] if journal is None else [lambda: flush_every(journal, cfg.runtime.output_flush_s)]
        with Progress(rec, console) as progress:
            body = Body(runner, controller, now=lambda: time.time() - t0, clock_unit=1.0,
                        sample=_sampler(client, addresses, rec, progress),
                        sample_interval_s=cfg.runtime.metrics_interval_s,
                        background=flush,
                        guard=guarded)  # a signal stops the rollout there (live/interrupt.py)
            yield LiveSession(run, client, addresses, policy, rec, runner, controller, body, t0)
