"""One place turns a pipeline into a running Dask cluster.

    start_local_cluster(cfg, roles, run_dir[, host, security])   SpecCluster: one worker per engine
                                               (and per further node of one spanning nodes),
                                               tool workers, the trainer worker under
                                               train.placement: worker (batch jobs and running
                                               schedulers: cluster/)
    engine_addresses(client)                   engine id -> worker address, read from the scheduler
    engine_resources(role, slots), tool_resources(threads), trainer_resources(), follower_resources()
                                               what each kind of worker declares

Every engine worker declares both role resources (0 where absent) and hosts its engine through
an EngineHost plugin; tool workers declare {"env": 1} per thread so tools never land on engines,
and host the pipeline's tools through a ToolHost plugin when it has an environment. The trainer
worker declares {"trainer": 1} and hosts nothing until the RL loop puts its Trainer there
(rl/remote_trainer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import dask
from distributed import Nanny, Scheduler, SpecCluster, Worker

from prorsa.cluster.engine_host import EngineHost
from prorsa.cluster.nodes import follower_name, spanning_engines
from prorsa.cluster.span_host import FollowerHost
from prorsa.cluster.tool_host import ToolHost
from prorsa.cluster.worker_logs import quiet_survived_faults
from prorsa.cluster.worker_setup import PRELOAD, deaf_worker_processes
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.registry import backend_of, engine_name, hosted_engines, resolve_model_dir
from prorsa.engine.vllm.errors import EngineUnavailable
from prorsa.roles import Role, role_resources


def engine_resources(role: Role, slots: int) -> dict[str, float]:
    return {**role_resources(role, slots), "env": 0}


def tool_resources(threads: int) -> dict[str, float]:
    return {"prefill": 0, "decode": 0, "env": threads}


def follower_resources() -> dict[str, float]:
    """A further node of an engine spanning nodes: no role, so no leg or tool call lands there."""
    return {"prefill": 0, "decode": 0, "env": 0}


def tool_name(index: int) -> str:
    return f"tools-{index}"


TRAINER_NAME = "trainer"
TRAINER_RESOURCE = "trainer"


def trainer_resources() -> dict[str, float]:
    return {"prefill": 0, "decode": 0, "env": 0, TRAINER_RESOURCE: 1}


def wants_trainer_worker(cfg: PipelineConfig) -> bool:
    return cfg.train is not None and cfg.train.placement == "worker"


def listen_options(processes: bool, host: str = "127.0.0.1") -> dict:
    """Where a worker listens: every worker runs an HTTP server (health, metrics) even without a
    dashboard, on every interface unless told; a worker process also listens for the Dask protocol
    (its Nanny too). A local run keeps both on `host`."""
    return {"dashboard_address": f"{host}:0", **({"host": host} if processes else {})}


def trainer_worker_spec(processes: bool, security=None, host: str = "127.0.0.1") -> dict:
    return {
        "cls": Nanny if processes else Worker,
        "options": {
            "name": TRAINER_NAME,
            # one thread: the Trainer is an actor (its calls run in the worker's actor thread), and
            # the one task this worker runs is the actor's construction; torch's threads follow it
            "nthreads": 1,
            "resources": trainer_resources(),
            "dashboard": False,
            "preload": PRELOAD,
            **listen_options(processes, host),
            **({"security": security} if security is not None else {}),
        },
    }


def worker_specs(cfg: PipelineConfig, roles: list[Role], run_dir: Path, security=None,
                 host: str = "127.0.0.1") -> dict[str, dict]:
    cls = Nanny if cfg.runtime.processes else Worker
    common = {"dashboard": False, "preload": PRELOAD,
              **listen_options(cfg.runtime.processes or security is not None, host),
              **({"security": security} if security is not None else {})}
    specs: dict[str, dict] = {}
    engines = hosted_engines(cfg)
    for i, role in enumerate(roles):
        name = engine_name(i)
        # engine legs are coroutines; threads only bound how many the worker runs at once
        specs[name] = {"cls": cls, "options": {
            "name": name, "nthreads": cfg.engines.slots_of(i), "resources": engine_resources(role, cfg.engines.slots_of(i)),
            "plugins": {EngineHost(i, role, engines, str(run_dir))}, **common}}
    for i, span in spanning_engines(engines, None).items():
        for k in range(1, span.nodes):  # one worker per further node: no legs, a headless server
            name = follower_name(i, k)
            specs[name] = {"cls": cls, "options": {
                "name": name, "nthreads": 1, "resources": follower_resources(),
                "plugins": {FollowerHost(i, k, engines, str(run_dir))}, **common}}
    for j in range(cfg.runtime.tool_workers):
        name = tool_name(j)
        specs[name] = {"cls": cls, "options": {
            "name": name, "nthreads": cfg.runtime.tool_threads, "resources": tool_resources(cfg.runtime.tool_threads),
            "plugins": {_tool_host(cfg, run_dir)} if cfg.environment else set(), **common}}
    if wants_trainer_worker(cfg):
        specs[TRAINER_NAME] = trainer_worker_spec(cfg.runtime.processes, security, host)
    return specs


def _tool_host(cfg: PipelineConfig, run_dir: Path) -> ToolHost:
    live = cfg.environment.mode == "live"  # the tool workers read and write the model's tokens
    return ToolHost(cfg.environment, cfg.seed, str(resolve_model_dir(cfg.engines)) if live else None, str(run_dir))


# The router places every leg (sticky to the engine holding the prefix); work stealing would move
# legs away from their prefix and, across role switches, onto workers that can no longer run them.
SCHEDULER_CONFIG = {"distributed.scheduler.work-stealing": False}


def lost_worker_timeout_s(cfg: PipelineConfig) -> float:
    """How long a SpecCluster waits for a dead worker to come back before it closes its Nanny for
    good (dask's default: 15 s). A Nanny restarts a killed engine worker, and the new one joins the
    scheduler only once its engine is up: a vLLM server takes minutes on a loaded machine, and an
    engine closed for good would leave its role's legs waiting for ever."""
    return 60.0 + 2 * backend_of(cfg.engines).start_timeout_s


async def start_local_cluster(cfg: PipelineConfig, roles: list[Role], run_dir: Path, host: str = "127.0.0.1",
                              security=None, on_scheduler: Callable[[SpecCluster], None] | None = None) -> SpecCluster:
    """`security` (TLS) puts even in-process workers on tls:// sockets, so every connection to the
    scheduler, the driver's own included, must show a certificate. `on_scheduler` is called once
    the scheduler (and its dashboard) is up, before the workers start their engines."""
    # read when a worker is lost, long after start: set for the process, not for this block
    dask.config.set({"distributed.deploy.lost-worker-timeout": f"{lost_worker_timeout_s(cfg)}s"})
    quiet_survived_faults()  # the scheduler here sees workers die too
    dashboard = cfg.runtime.dashboard_address
    if security is not None:
        where = {"protocol": "tls", "host": host, "security": security}
    elif cfg.runtime.processes:
        where = {"host": host}
    else:  # workers in this process talk to the scheduler without sockets or serialisation
        where = {"protocol": "inproc"}
    scheduler = {
        "cls": Scheduler,
        "options": {
            **where,
            "dashboard": dashboard is not None,
            # the HTTP server runs without a dashboard too: on this machine only, unless asked
            "dashboard_address": dashboard or f"{host}:0",
        },
    }
    batches = _batches(worker_specs(cfg, roles, run_dir, security, host), WORKERS_AT_ONCE)
    if cfg.runtime.processes:
        deaf_worker_processes()
    with dask.config.set(SCHEDULER_CONFIG), _engine_failures_unlogged():  # config read at scheduler start
        cluster = SpecCluster(
            workers={},  # the scheduler first, so its dashboard is there while the engines start
            scheduler=scheduler,
            asynchronous=True,
            name=f"prorsa-{cfg.name}",
            security=security,
        )
        try:
            await cluster
            if on_scheduler is not None:
                on_scheduler(cluster)
            # SpecCluster builds every worker of a batch in one go without yielding to the event
            # loop (milliseconds each), so thousands in one batch would hold off a Ctrl-C for minutes
            for batch in batches:
                cluster.worker_spec.update(batch)
                await cluster
            return cluster
        except RuntimeError as e:  # "Worker failed to start.": the engine's own error says why
            await cluster.close()  # the scheduler and the workers that did start
            cause = _root(e)
            if cause is e:
                raise
            raise EngineStartFailed(str(cause).splitlines()[0].rstrip(":")) from None
        except asyncio.CancelledError:  # interrupted while starting: the run ends here
            # workers cut off mid-start log their own cancellation, one traceback each; the run's
            # error line says what happened
            logging.getLogger("distributed").setLevel(logging.CRITICAL)
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(cluster.close(), CLOSE_ON_INTERRUPT_S)
            raise


WORKERS_AT_ONCE = 32  # engines first: they come in the first batch, in order
CLOSE_ON_INTERRUPT_S = 5.0  # in-process workers end with the process; Nannies' with theirs


def _batches(specs: dict[str, dict], size: int) -> Iterator[dict[str, dict]]:
    items = list(specs.items())
    for i in range(0, max(len(items), 1), size):
        yield dict(items[i:i + size])


class EngineStartFailed(Exception):
    """An engine worker could not start its engine; the message is one line."""


def _root(e: BaseException) -> BaseException:
    while e.__cause__ is not None:
        e = e.__cause__
    return e


class _EngineFailure(logging.Filter):
    """distributed logs an engine that fails to start with its traceback, twice; the run says it
    in one line (EngineStartFailed) and the engine's log has the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and isinstance(_root(exc), EngineUnavailable))


@contextlib.contextmanager
def _engine_failures_unlogged():
    handlers = logging.getLogger("distributed").handlers + logging.getLogger().handlers
    quiet = _EngineFailure()
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)


async def engine_addresses(client) -> dict[str, str]:
    info = await client.scheduler.identity(n_workers=-1)
    return {
        w["name"]: addr
        for addr, w in info["workers"].items()
        if isinstance(w.get("name"), str) and w["name"].startswith("engine-")
    }
