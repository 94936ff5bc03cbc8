"""The one place a cluster file becomes a running Dask cluster.

    open_run_cluster(spec, cfg, roles, run_dir, console, on_scheduler) -> RunCluster
                                                     async context manager (prorsa run); on_scheduler
                                                     gets what dashboard_links reads as soon as the
                                                     scheduler answers, before the engines are waited for
    open_sweep_client(spec, workers, console) -> Client                 context manager (prorsa sweep)

    local     SpecCluster in this process (cluster/local.py), bound to localhost; TLS if the file says so
    slurm/pbs the scheduler here (a login node), one job per engine (its GPUs, its initial role's
              resources), per further node of an engine spanning nodes (node-<k>-of-engine-<i>: its
              GPUs, no role), per tool worker and for the trainer (train.placement: worker); waits
              until each has joined; cancels every job on the way out, whether the run finished,
              failed or was interrupted
    address   a running scheduler whose workers are named engine-<i>, tools-<j> (and trainer under
              train.placement: worker); each is given its initial role's (or the trainer's)
              resources, its engine or toolbox (plugins), and work stealing is paused

A cluster that cannot be had (no sbatch, jobs that never start, an address that does not answer)
raises ClusterError with one line saying so; an engine that does not start on a worker that joined
by itself, EngineStartFailed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from distributed import Client
from distributed.core import Status
from rich.console import Console

from prorsa.cluster.hosts import WorkerEngineHost, WorkerFollowerHost, WorkerToolHost
from prorsa.cluster.nodes import spanning_engines
from prorsa.cluster.security import exposure, make_security
from prorsa.config.cluster import AddressSpec, ClusterSpec, LocalSpec
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.registry import backend_of, engine_name, hosted_engines, resolve_model_dir
from prorsa.roles import Role
from prorsa.cluster.local import (TRAINER_NAME, EngineStartFailed, engine_resources, start_local_cluster, tool_name,
                                    tool_resources, trainer_resources, wants_trainer_worker)
from prorsa.engine.vllm.errors import EngineUnavailable


class ClusterError(Exception):
    """The cluster could not be started or reached; the message is one line."""


@dataclass
class RunCluster:
    client: Client
    dashboard: object  # what dashboard/plugin.py's dashboard_links reads: a cluster, or its link
    jobs: dict[str, str] = field(default_factory=dict)  # worker name -> batch job id


def _teller(console: Console | None) -> Callable[[str], None]:
    if console is None:
        return lambda line: None
    return lambda line: console.print(line, soft_wrap=True, markup=False, highlight=False)


class _TeardownNoise(logging.Filter):
    """Once a run or sweep unwinds, work still in flight is cancelled under the scheduler's feet: a
    broadcast from the sampler's client.run reaches a worker being stopped, or a gather asks for a
    point just forgotten. The scheduler logs both as errors, but they are the teardown, not a fault."""

    armed = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.armed and record.getMessage().startswith(("broadcast to ", "Couldn't gather keys")))


class _SyncCancelRace(logging.Filter):
    """distributed's sync() answers Ctrl-C by cancelling its future on the loop thread; when the
    signal lands before that future exists, the cancel callback dies of a NameError and tornado logs
    the traceback. There was nothing to cancel, so it is dropped whenever it comes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, NameError) and "sync.<locals>.cancel" in record.getMessage())


@contextlib.contextmanager
def _teardown_noise_filtered() -> Iterator[_TeardownNoise]:
    """The caller arms the filter once its work is done, before the cluster goes."""
    noise, log = _TeardownNoise(), logging.getLogger("distributed.scheduler")
    race, tornado_log = _SyncCancelRace(), logging.getLogger("tornado.application")
    log.addFilter(noise)
    tornado_log.addFilter(race)
    try:
        yield noise
    finally:
        log.removeFilter(noise)
        tornado_log.removeFilter(race)


@contextlib.asynccontextmanager
async def open_run_cluster(spec: ClusterSpec | None, cfg: PipelineConfig, roles: list[Role], run_dir: Path,
                           console: Console | None = None,
                           on_scheduler: Callable[[object], None] = lambda cluster: None) -> AsyncIterator[RunCluster]:
    with _teardown_noise_filtered() as noise:
        async with _open_run_cluster(spec, cfg, roles, run_dir, console, on_scheduler, noise) as run:
            try:
                yield run
            finally:
                noise.armed = True


@contextlib.asynccontextmanager
async def _open_run_cluster(spec: ClusterSpec | None, cfg: PipelineConfig, roles: list[Role], run_dir: Path,
                            console: Console | None, on_scheduler: Callable[[object], None],
                            noise: _TeardownNoise) -> AsyncIterator[RunCluster]:
    spec, say = spec or LocalSpec(), _teller(console)
    security = make_security(spec.tls)
    if (warning := _exposure(spec, security)) is not None:
        say(warning)
    if spec.kind == "local":
        async with await start_local_cluster(cfg, roles, run_dir, spec.host, security, on_scheduler) as cluster, \
                Client(cluster, asynchronous=True, security=security) as client:
            if security is not None or cfg.runtime.processes:
                say(f"scheduler: {cluster.scheduler_address}")
            yield RunCluster(client, cluster)
    elif spec.kind == "address":
        async with _connect(spec, security) as client:
            say(f"scheduler: {spec.address}")
            dashboard = SimpleNamespace(dashboard_link=client.dashboard_link, scheduler=None)
            on_scheduler(dashboard)
            async with _adopt_workers(client, spec, cfg, roles, run_dir):
                yield RunCluster(client, dashboard)
    else:
        async with _batch_cluster(spec, cfg, roles, run_dir, security, say, on_scheduler, noise) as run:
            yield run


def _exposure(spec: ClusterSpec, security) -> str | None:
    """The warning for a scheduler this spec starts beyond this machine without TLS (a running
    scheduler's address is not ours to judge)."""
    if spec.kind == "address":
        return None
    return exposure(spec.host if spec.kind == "local" else spec.scheduler.host, security)


# --- batch systems -------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def _batch_cluster(spec, cfg, roles, run_dir, security, say, on_scheduler, noise) -> AsyncIterator[RunCluster]:
    from prorsa.cluster.jobs import run_jobs, start_job_cluster, submit

    _check_commands(spec)
    cluster = await start_job_cluster(spec, f"prorsa-{cfg.name}", security,
                                      spec.scheduler.dashboard_address or cfg.runtime.dashboard_address)
    try:
        say(f"scheduler: {cluster.scheduler_address}")
        on_scheduler(cluster)
        async with Client(cluster, asynchronous=True, security=security) as client:
            try:
                jobs = await submit(cluster, run_jobs(spec, cfg, roles))
            except RuntimeError as e:  # dask-jobqueue's failed submit command: its stderr is the news
                raise ClusterError(f"{spec.kind} job submission failed: {_last_line(e)}") from None
            say(f"submitted {len(jobs)} {spec.kind} jobs: "
                + ", ".join(f"{name} ({job})" for name, job in jobs.items()))
            await wait_for_named(client, list(jobs), spec.start_timeout_s, jobs)
            await _host(client, cfg, roles, run_dir, spec.job("engines").gpus)
            yield RunCluster(client, cluster, jobs)
    finally:
        # a start that failed goes as a finished run does: a leader's plugin broadcast still in
        # flight when its follower's failed is cut off by the close
        noise.armed = True
        await _close_batch(cluster, say)


async def _close_batch(cluster, say) -> None:
    # close() cancels the jobs of the cluster's workers; a job submitted while an interrupt landed
    # may not be one of them yet
    strays = [j for j in list(cluster._created) if getattr(j, "job_id", None) and j not in cluster.workers.values()]
    ids = [w.job_id for w in cluster.workers.values() if getattr(w, "job_id", None)]
    _forget_failed_submissions(cluster)
    await asyncio.shield(cluster.close())
    for job in strays:
        await job.close()
    if ids or strays:
        say(f"cancelled jobs {', '.join(ids + [j.job_id for j in strays])}")


def _forget_failed_submissions(cluster) -> None:
    for job in list(cluster._created):
        if getattr(job, "job_id", None) is None and job.status == Status.created:
            # its submit command failed: nothing to cancel, and SpecCluster's close insists that
            # every worker it created has stopped or failed
            job.status = Status.failed


def _check_commands(spec) -> None:
    import shutil

    from prorsa.cluster.jobs import _JOBS

    job = _JOBS[spec.kind]
    for cmd in (job.submit_command, job.cancel_command):
        if shutil.which(cmd) is None:
            raise ClusterError(f"kind {spec.kind}: {cmd} not found on PATH (run prorsa where jobs can be submitted)")


def _last_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__


# --- a running scheduler -------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def _connect(spec: AddressSpec, security) -> AsyncIterator[Client]:
    try:
        client = await Client(spec.address, asynchronous=True, security=security, timeout="10s")
    except (OSError, TimeoutError, ValueError) as e:
        raise ClusterError(f"cannot connect to {spec.address} ({_last_line(e)})") from None
    async with client:
        yield client


@contextlib.asynccontextmanager
async def _adopt_workers(client: Client, spec: AddressSpec, cfg: PipelineConfig, roles: list[Role],
                         run_dir: Path) -> AsyncIterator[None]:
    engines = [engine_name(i) for i in range(len(roles))]
    tools = [tool_name(j) for j in range(cfg.runtime.tool_workers)]
    trainer = [TRAINER_NAME] if wants_trainer_worker(cfg) else []
    addresses = await wait_for_named(client, engines + tools + trainer, spec.start_timeout_s)
    # whatever the workers were started with, the run begins from its policy's initial roles
    for i, (name, role) in enumerate(zip(engines, roles)):
        await client.run(_set_resources, engine_resources(role, cfg.engines.slots_of(i)), workers=[addresses[name]])
    for name in tools:
        await client.run(_set_tool_resources, workers=[addresses[name]])
    for name in trainer:
        await client.run(_set_resources, trainer_resources(), workers=[addresses[name]])
    await client.run_on_scheduler(_stealing, False)
    try:
        await _host(client, cfg, roles, run_dir)
        yield
    finally:
        # the workers outlive the run: stop their engines and give the scheduler back as it was
        with contextlib.suppress(Exception):
            await client.unregister_worker_plugin(WorkerEngineHost.name)
        if cfg.environment is not None:
            with contextlib.suppress(Exception):
                await client.unregister_worker_plugin(WorkerToolHost.name)
        with contextlib.suppress(Exception):
            await client.run_on_scheduler(_stealing, True)


async def _set_resources(resources: dict[str, float], dask_worker=None) -> None:
    await dask_worker.set_resources(**resources)


async def _set_tool_resources(dask_worker=None) -> None:
    await dask_worker.set_resources(**tool_resources(dask_worker.state.nthreads))


async def _stealing(on: bool, dask_scheduler=None) -> None:
    # the router places every leg; a stolen leg loses its prefix (cluster/local.py SCHEDULER_CONFIG)
    ext = dask_scheduler.extensions.get("stealing")
    if ext is not None:
        await (ext.start() if on else ext.stop())


# --- shared --------------------------------------------------------------------------------------

async def wait_for_named(client: Client, names: list[str], timeout_s: float,
                         jobs: dict[str, str] | None = None) -> dict[str, str]:
    """Worker name -> address once every one of `names` has joined, or ClusterError."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = await client.scheduler.identity(n_workers=-1)
        present = {str(w.get("name")): addr for addr, w in info["workers"].items()}
        missing = [n for n in names if n not in present]
        if not missing:
            return {n: present[n] for n in names}
        if time.monotonic() > deadline:
            which = ", ".join(f"{n} (job {jobs[n]})" if jobs else n for n in missing)
            raise ClusterError(f"{len(missing)} worker(s) did not join within {timeout_s:g} s: {which}")
        await asyncio.sleep(0.25)


async def _host(client: Client, cfg: PipelineConfig, roles: list[Role], run_dir: Path,
                node_gpus: int | None = None) -> None:
    """Engines (and the toolbox) on workers that joined by themselves; returns once all are up.
    The further nodes of engines spanning nodes of `node_gpus` GPUs (batch jobs) start with their
    leaders, which wait for them: both plugins at once. A failed start: EngineStartFailed."""
    # absolute paths: a job may start in another directory (PBS starts in $HOME)
    engines, where = backend_of(hosted_engines(cfg)).portable(), str(run_dir.resolve())
    hosts = [WorkerEngineHost(roles, engines, where, node_gpus)]
    if spanning_engines(engines, node_gpus):
        hosts.append(WorkerFollowerHost(engines, where, node_gpus))
    try:
        await asyncio.gather(*(client.register_plugin(host) for host in hosts))
    except EngineUnavailable as e:
        raise EngineStartFailed(str(e).splitlines()[0]) from None
    if cfg.environment is not None:
        live = cfg.environment.mode == "live"
        model_dir = str(resolve_model_dir(cfg.engines).resolve()) if live else None
        await client.register_plugin(WorkerToolHost(cfg.environment, cfg.seed, model_dir, where))


# --- sweeps --------------------------------------------------------------------------------------

@contextlib.contextmanager
def open_sweep_client(spec: ClusterSpec | None, workers: int | None,
                      console: Console | None = None) -> Iterator[Client]:
    """Single-threaded worker processes (simulate() is pure Python) wherever the file says."""
    with _teardown_noise_filtered() as noise, _sweep_client(spec, workers, console) as client:
        try:
            yield client
        finally:
            noise.armed = True


@contextlib.contextmanager
def _sweep_client(spec: ClusterSpec | None, workers: int | None, console: Console | None) -> Iterator[Client]:
    spec, say = spec or LocalSpec(), _teller(console)
    security = make_security(spec.tls)
    if (warning := _exposure(spec, security)) is not None:
        say(warning)
    if spec.kind == "local":
        from distributed import LocalCluster

        n = workers or spec.workers or os.cpu_count() or 1
        # silence_logs: the workers' own warnings (tasks cancelled on Ctrl-C, a scheduler gone at
        # close) say nothing a sweep's user acts on; a point that fails is reported by the sweep
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host=spec.host,
                          silence_logs=logging.ERROR,
                          dashboard_address=f"{spec.host}:0", security=security,
                          protocol="tls" if security else None) as cluster, \
                Client(cluster, security=security) as client:
            yield client
    elif spec.kind == "address":
        try:
            client = Client(spec.address, security=security, timeout="10s")
        except (OSError, TimeoutError, ValueError) as e:
            raise ClusterError(f"cannot connect to {spec.address} ({_last_line(e)})") from None
        with client:
            yield client
    else:
        yield from _sweep_jobs(spec, security, say)


def _sweep_jobs(spec, security, say) -> Iterator[Client]:
    from prorsa.cluster.jobs import ctrl_c_interrupts, job_cluster, submit, sweep_job_options

    _check_commands(spec)
    job = sweep_job_options(spec)
    n_jobs = spec.job("sweep").jobs or 1
    with job_cluster(spec, "prorsa-sweep", security, spec.scheduler.dashboard_address, job,
                     asynchronous=False) as cluster:
        ctrl_c_interrupts()
        say(f"scheduler: {cluster.scheduler_address}")
        try:  # as a run's jobs rather than cluster.scale(), whose refused submissions go unreported
            ids = cluster.sync(submit, cluster, {f"prorsa-sweep-{i}": job for i in range(n_jobs)})
        except RuntimeError as e:
            _forget_failed_submissions(cluster)
            raise ClusterError(f"{spec.kind} job submission failed: {_last_line(e)}") from None
        say(f"submitted {n_jobs} {spec.kind} job(s) of {job['processes']} worker processes: "
            + ", ".join(ids.values()))
        with Client(cluster, security=security) as client:
            try:
                client.wait_for_workers(1, timeout=spec.start_timeout_s)
            except TimeoutError:
                raise ClusterError(f"no {spec.kind} sweep job started within {spec.start_timeout_s:g} s") from None
            yield client
