"""One simulated rollout: the live run's brain and emulated engines on a virtual clock.

    simulate(run, policy=None[, workload]) -> SimRun
                                             run a resolved pipeline's workload (`run`: a RunContext,
                                             rollout/context.py resolve; `workload`: these trajectories
                                             instead) under `policy` (a spec or a Policy object;
                                             default the pipeline's) in virtual time
    write_run(sim, run_dir)                  the same files a live run writes (prorsa report reads them)
    await simulate_async(run, policy[, workload])   the same on the caller's virtual clock (a
                                             RunContext; `workload`: replay these instead)

Clock: the simulator counts body seconds, the cost model's own. A pipeline made for a live run
with time-scaled emulated engines gives its wall-clock figures (tool latencies, an async run's
duration, the control interval) in wall seconds, so they are divided by its time unit here, and a
simulated makespan compares with a live one divided by that unit (benchmarks/fidelity.py).

What is the same as live: Workload, drivers, agent loop, Router, EmulatedEngine, the policy and
the ControlLoop. What differs: transport (direct awaits instead of Dask tasks, so no scheduling
overhead) and clock (sim/clock.py: time jumps to the next timer). A vLLM CPU deployment whose
engines share the host's cores is simulated with that sharing (engine/core_share.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from prorsa.agent.trace import TrajectorySpec, workload_means
from prorsa.agent.workload import Workload
from prorsa.config.load import ConfigError
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.policy import Policy, Rehearse, WorkloadHint, make_policy
from prorsa.control.tail_layout import TailLayout
from prorsa.costmodel import load_gpu
from prorsa.costmodel.misfit import ModelScale
from prorsa.engine.core_share import CoreShare
from prorsa.engine.emulated import EmulatedEngine, KvMemory
from prorsa.engine.registry import backend_of
from prorsa.metrics.outputs import summarise
from prorsa.metrics.outputs import write_run as write_run_files
from prorsa.metrics.recorder import RunRecorder
from prorsa.rollout.assemble import Body, roll_out
from prorsa.rollout.context import RunContext, make_router, make_scheduler, prior_checked
from prorsa.rollout.drivers import Hooks
from prorsa.sim.clock import run_virtual
from prorsa.sim.controller import SimController
from prorsa.sim.rehearse import future_run, misfit, rehearser
from prorsa.sim.runner import SimTurnRunner
from prorsa.sim.tail_merge import TailMerge


@dataclass
class SimRun:
    cfg: PipelineConfig
    policy: str
    recorder: RunRecorder
    makespan_s: float  # body seconds
    wall_s: float  # what simulating it took
    summary: dict = field(default_factory=dict)
    events: int = 0  # timers the virtual clock fired: engine steps, transfers, tool calls, intervals


def simulate(run: RunContext, policy: str | Policy | None = None, workload: Workload | None = None,
             model_error: ModelScale | None = None) -> SimRun:
    """The body starts from a pipeline already resolved, as a live run does: the checks and the
    derived values are the command's (or the caller's `resolve(cfg)`), not the simulator's."""
    t0 = time.perf_counter()
    with _rare_collections():
        sim = run_virtual(simulate_async(run, policy, workload, model_error))
    sim.wall_s = time.perf_counter() - t0
    sim.summary["sim_wall_s"] = round(sim.wall_s, 3)
    return sim


_GC_THRESHOLD = (100_000, 50, 1000)
_gc_lock = threading.Lock()
_gc_users = 0  # simulations running in this process (sweeps may run several in threads)
_gc_saved = gc.get_threshold()  # what to put back when the last one ends


@contextlib.contextmanager
def _rare_collections():
    """A simulated rollout allocates millions of short-lived objects (timer handles, futures,
    requests, results) that reference counting frees at once, while the turns it keeps grow the
    heap; at the default thresholds the cyclic collector runs every 700 allocations and now and
    then walks the whole heap, ~10% of the run. Collect rarely while any simulation runs: no
    result depends on when garbage goes."""
    global _gc_users, _gc_saved
    with _gc_lock:
        if _gc_users == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(*_GC_THRESHOLD)
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0:
                gc.set_threshold(*_gc_saved)


async def simulate_async(run: RunContext, policy: str | Policy | None, workload: Workload | None = None,
                         model_error: ModelScale | None = None) -> SimRun:
    """`model_error`: the policy plans (its fluid model, its rehearsals) with the engines' cost
    model wrong by these factors, while the engines keep the true one (sim/rehearse.py misfit)."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    def now() -> float:
        return loop.time() - started

    cfg, unit = run.cfg, run.unit
    workload = workload or Workload.from_config(cfg.workload, cfg.seed)
    run = prior_checked(run, workload)
    seen = misfit(run, model_error)
    context = replace(seen.policy, future=future_of(workload, unit), future_means=future_means(run, workload),
                      rehearse=rehearser(seen, simulate_async), future_run=future_run(run, workload, simulate_async))
    pol = make_policy(policy or cfg.policy, context) if policy is None or isinstance(policy, str) else policy
    roles = pol.initial_roles(cfg.engines.count)
    e = cfg.engines
    names = [spec.name for spec in run.engines]
    cores = host_cores(cfg, names)
    # each engine steps with its own group's layout and slots (engines.groups)
    engines = {spec.name: EmulatedEngine(spec.name, role, spec.costs, slots=spec.slots, time_scale=1.0,
                                         memory=KvMemory(prefix_cache=e.prefix_cache), cores=cores)
               for spec, role in zip(run.engines, roles)}
    for engine in engines.values():
        await engine.start()
    router = make_router(run, {name: eng.role for name, eng in engines.items()}, now)
    runner = SimTurnRunner(engines, router, now, tool_unit=unit, dispatch_s=load_gpu(e.gpu).dispatch_latency_s,
                           scheduler=make_scheduler(run, future=context.future),
                           context_budget=run.context_budget)
    rec = RunRecorder(engines=list(engines), slots={spec.name: spec.slots for spec in run.engines},
                      expected=run.expected)
    controller = SimController(pol, router, runner, engines, rec, context.interval_s, now)
    if cfg.scheduling.tail_layout:
        controller.tail = tail_merge(run, runner, router, engines)

    async def sample(t: float) -> None:
        rec.sample(t, [e.load() for e in engines.values()])

    # a simulated rollout may span an hour of body time: a sample a second is plenty
    body = Body(runner, controller, now, clock_unit=unit, sample=sample,
                sample_interval_s=max(cfg.runtime.metrics_interval_s / unit, 1.0))
    update = _weight_update(engines, run.body_s(run.update_s))
    makespan = await roll_out(run, body, rec, Hooks(rec.on_done, update_weights=update), workload=workload)
    for engine in engines.values():
        await engine.stop()
    summary = summarise(rec, makespan, pol.name, run.digest, cfg.name) | {
        "control": {"intervals": len(controller.step_s)}, "clock": "body", "backend": "emulated",
        "turns_migrated": runner.migrated,
        "tail_merges": [] if controller.tail is None else [
            {"t": round(t, 3), "width": p.width, "wide": p.wide, "predicted_s": [round(p.stay_s, 2), round(p.tail_s, 2)]}
            for t, p in controller.tail.plans]}
    return SimRun(cfg, pol.name, rec, makespan, 0.0, summary, events=getattr(loop, "timers_fired", 0))


def lend(run: RunContext) -> Rehearse | None:
    """The simulator lent to a live run's policy (live/run.py): its rehearsals replay trajectories
    under candidate splits with the run's engines, router and cost model, in virtual time."""
    return rehearser(run, simulate_async)


def tail_merge(run: RunContext, runner: SimTurnRunner, router, engines: dict[str, EmulatedEngine]) -> TailMerge:
    e = run.cfg.engines
    if not run.engines_alike or e.parallelism is not None:
        raise ConfigError("scheduling.tail_layout merges engines alike: not with engines.groups or engines.parallelism")
    return TailMerge(TailLayout(run.costs.mixed, e.count, e.slots), runner.scheduler, router, engines, runner)


def host_cores(cfg: PipelineConfig, names: list[str]) -> CoreShare | None:
    """vLLM CPU engines on one host of the profile's cores (a CPU profile's "GPU" is one core,
    gpus_per_node the host's cores), pinned as a live run pins them; None for GPU engines."""
    e = cfg.engines
    if not backend_of(e).pins_cores:
        return None
    gpu = load_gpu(e.gpu)
    return CoreShare.pinned(names, e.vllm.cores_per_engine, gpu.gpus_per_node, gpu.host_load_per_sequence)


def _weight_update(engines: dict[str, EmulatedEngine], body_s: float):
    if body_s <= 0:
        return None

    async def update() -> None:
        await asyncio.gather(*(e.update_weights(body_s) for e in engines.values()))

    return update


def future_of(workload: Workload, unit: float) -> Callable[[str], TrajectorySpec]:
    """traj_id -> its spec with tool latencies in body seconds: what the oracle reads."""
    specs: dict[str, TrajectorySpec] = {}

    def lookup(traj_id: str) -> TrajectorySpec:
        spec = specs.get(traj_id)
        if spec is None:
            if traj_id.startswith("a"):
                spec = workload.trajectory(int(traj_id[1:]))
            else:  # s{step}-p{prompt}-g{member}: the whole step at once
                step = int(traj_id[1:].split("-")[0])
                for s in workload.trajectories_for_step(step):
                    specs[s.traj_id] = _in_body_seconds(s, unit)
                return specs[traj_id]
            spec = specs[traj_id] = _in_body_seconds(spec, unit)
        return spec

    return lookup


def future_means(run: RunContext, workload: Workload, sample: int = 64) -> WorkloadHint:
    """The run's own means over its first `sample` trajectories: what the oracle opens on. The
    future of the run, so no other policy is given it (they learn it, or start from a prior)."""
    specs = (workload.trajectories_for_step(0, first=sample) if run.cfg.workload.mode == "sync"
             else [workload.trajectory(i) for i in range(sample)])
    means = workload_means(specs)
    return WorkloadHint(concurrency=run.policy.concurrency, **means | {"tool_s": means["tool_s"] / run.unit})


def _in_body_seconds(spec: TrajectorySpec, unit: float) -> TrajectorySpec:
    if unit == 1.0:
        return spec
    return replace(spec, turns=tuple(replace(t, tool_latency_s=t.tool_latency_s / unit) for t in spec.turns),
                   start_s=None if spec.start_s is None else spec.start_s / unit)


def write_run(sim: SimRun, run_dir: Path) -> None:
    write_run_files(run_dir, sim.recorder, sim.summary, sim.makespan_s, simulated=True, trajectories=True)
