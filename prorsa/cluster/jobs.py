"""Batch jobs through dask-jobqueue: one job per engine, one per tool worker, or sweep jobs.

    run_jobs(spec, cfg, roles) -> {worker name: job options}   engine-<i>, node-<k>-of-engine-<i> per
                                                                further node of an engine spanning
                                                                nodes, tools-<j>, and trainer under
                                                                train.placement: worker
    sweep_job_options(spec) -> job options                     `sweep.cpus` single-threaded workers
    job_scripts(spec, jobs, address) -> {name: script}         the scripts as they are submitted
    job_cluster(spec, name, security, dashboard, job) -> JobQueueCluster   the scheduler here, no jobs
    start_job_cluster(...)                                      the same, started, for a run
    submit(cluster, jobs) -> {name: job id}                    submit and return once queued

A job is one Dask worker (nanny + worker process) named after what it hosts, started with its
role resources (`--resources prefill=..,decode=..,env=..`) and, for engines, its GPU request; the
engine itself is set up by a plugin once the worker joins (cluster/hosts.py). Each job cd's to
the directory prorsa was started in, so relative paths in the pipeline mean the same there.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading

import dask

# dask_jobqueue.runner, imported with the package, sets SIGINT to sys.exit() (exit code 0, no
# KeyboardInterrupt): Ctrl-C must stay an interrupt, which cancels the jobs and exits 2
_sigint = signal.getsignal(signal.SIGINT)
from dask_jobqueue import PBSCluster, SLURMCluster  # noqa: E402
from dask_jobqueue.core import JobQueueCluster  # noqa: E402
from dask_jobqueue.pbs import PBSJob  # noqa: E402
from dask_jobqueue.slurm import SLURMJob  # noqa: E402

if threading.current_thread() is threading.main_thread() and _sigint is not None:
    signal.signal(signal.SIGINT, _sigint)


def ctrl_c_interrupts() -> None:
    """Undo dask_jobqueue's SIGINT handler if it is still the one set (when the package was
    imported before this module, the restore above put back its handler, not Python's): a sweep
    interrupted under it ends with exit 0 and its jobs running. Called in the main thread once a
    sweep's job cluster is up."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is threading.main_thread() \
            and getattr(handler, "__module__", None) == "dask_jobqueue.runner":
        signal.signal(signal.SIGINT, signal.default_int_handler)

from prorsa.config.cluster import JobSettings, PbsSpec, SlurmSpec
from prorsa.config.engines import EnginesConfig
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.registry import backend_of, engine_name, hosted_engines
from prorsa.roles import Role
from prorsa.cluster.local import (SCHEDULER_CONFIG, TRAINER_NAME, engine_resources, follower_resources, tool_name,
                                    tool_resources, trainer_resources, wants_trainer_worker)
from prorsa.cluster.nodes import follower_name, spanning_engines

BatchSpec = SlurmSpec | PbsSpec
_CLUSTERS = {"slurm": SLURMCluster, "pbs": PBSCluster}
_JOBS = {"slurm": SLURMJob, "pbs": PBSJob}
DEFAULTS = JobSettings(cpus=1, memory="4GB", walltime="01:00:00", jobs=1)


def engine_gpus(settings: JobSettings, engines: EnginesConfig, index: int = 0) -> int:
    """GPUs the job of engine `index` books: its group's layout (engines.groups), unless set."""
    if settings.gpus is not None:
        return settings.gpus
    return engines.engine_vllm(index).layout.gpus if backend_of(engines).on_gpus else 0


def _resources(resources: dict[str, float]) -> str:
    # commas, not spaces: the job script joins the command line unquoted
    return ",".join(f"{k}={v:g}" for k, v in resources.items())


def job_options(spec: BatchSpec, settings: JobSettings, *, threads: int, processes: int = 1,
                resources: dict[str, float] | None = None, gpus: int = 0, job_name: str = "prorsa") -> dict:
    """dask-jobqueue Job keywords. `threads` per worker process; the job books `settings.cpus`."""
    s = settings.over(DEFAULTS)
    directives = list(s.directives)
    opts: dict = {
        "cores": threads * processes, "processes": processes, "memory": s.memory,
        "queue": s.queue, "account": s.account, "walltime": s.walltime, "job_name": job_name,
        "python": spec.python or sys.executable, "nanny": True,
        "death_timeout": spec.death_timeout_s, "local_directory": spec.local_directory,
        "log_directory": spec.log_directory,
        "job_script_prologue": [f"cd {shlex.quote(os.getcwd())}", *s.prologue],
        "worker_extra_args": ["--resources", _resources(resources)] if resources else [],
    }
    if spec.kind == "slurm":
        opts["job_cpu"] = s.cpus
        if gpus:
            directives.append(spec.gpu_directive.format(gpus=gpus))
    else:
        opts["resource_spec"] = _pbs_select(spec.resource_spec, s.cpus, gpus, s.memory)
    opts["job_extra_directives"] = directives
    return opts


def _pbs_select(template: str, cpus: int, gpus: int, memory: str) -> str:
    from dask.utils import parse_bytes
    from dask_jobqueue.pbs import pbs_format_bytes_ceil

    if not gpus:  # a GPU-less job asks for none rather than ngpus=0, which some sites reject
        template = ":".join(part for part in template.split(":") if "{gpus}" not in part)
    return template.format(cpus=cpus, gpus=gpus, memory=pbs_format_bytes_ceil(parse_bytes(memory)))


def run_jobs(spec: BatchSpec, cfg: PipelineConfig, roles: list[Role]) -> dict[str, dict]:
    engines, tools = spec.job("engines"), spec.job("tools")
    jobs = {}
    for i, role in enumerate(roles):
        name = engine_name(i)
        # engine legs are coroutines; threads only bound how many the worker runs at once (as locally)
        slots = cfg.engines.slots_of(i)  # engine groups: each engine's own
        jobs[name] = job_options(spec, engines, threads=slots, gpus=engine_gpus(engines, cfg.engines, i),
                                 job_name=f"prorsa-{name}", resources=engine_resources(role, slots))
    for i, span in spanning_engines(hosted_engines(cfg), engines.gpus).items():
        for k in range(1, span.nodes):  # a job per further node: a headless server, no legs
            name = follower_name(i, k)
            jobs[name] = job_options(spec, engines, threads=1, gpus=engine_gpus(engines, cfg.engines, i),
                                     job_name=f"prorsa-{name}", resources=follower_resources())
    for j in range(cfg.runtime.tool_workers):
        name = tool_name(j)
        jobs[name] = job_options(spec, tools, threads=cfg.runtime.tool_threads, job_name=f"prorsa-{name}",
                                 resources=tool_resources(cfg.runtime.tool_threads))
    if wants_trainer_worker(cfg):
        trainer = spec.job("trainer")
        # the worker's threads are the cores booked, and torch's follow them (rl/remote_trainer.py)
        jobs[TRAINER_NAME] = job_options(spec, trainer, threads=trainer.over(DEFAULTS).cpus,
                                         job_name=f"prorsa-{TRAINER_NAME}", resources=trainer_resources())
    return jobs


def sweep_job_options(spec: BatchSpec) -> dict:
    """simulate() is pure Python: one single-threaded worker process per booked cpu."""
    s = spec.job("sweep").over(DEFAULTS)
    return job_options(spec, s, threads=1, processes=s.cpus, job_name="prorsa-sweep")


def job_scripts(spec: BatchSpec, jobs: dict[str, dict], address: str, security=None) -> dict[str, str]:
    cls = _JOBS[spec.kind]
    return {name: cls(address, name=name, security=security, interface=spec.scheduler.interface,
                      protocol="tls://" if security else None, **opts).job_script()
            for name, opts in jobs.items()}


def job_cluster(spec: BatchSpec, name: str, security, dashboard_address: str | None, job: dict | None = None,
                asynchronous: bool = True) -> JobQueueCluster:
    """The scheduler runs here (on the login node), with no jobs yet; `job` is the template that
    cluster.scale() submits. Synchronous clusters start here, asynchronous ones when awaited."""
    sched = spec.scheduler
    options: dict = {"port": sched.port, "dashboard": dashboard_address is not None,
                     "dashboard_address": dashboard_address or ":0"}
    if sched.host:
        options["host"] = sched.host
    template = job or job_options(spec, spec.job("tools"), threads=1)
    return _CLUSTERS[spec.kind](asynchronous=asynchronous, name=name, security=security,
                                interface=sched.interface, scheduler_options=options, **template)


async def start_job_cluster(spec: BatchSpec, name: str, security, dashboard_address: str | None) -> JobQueueCluster:
    """A run's: work stealing off, as on a LocalCluster."""
    with dask.config.set(SCHEDULER_CONFIG):  # read when the scheduler starts
        return await job_cluster(spec, name, security, dashboard_address)


async def submit(cluster: JobQueueCluster, jobs: dict[str, dict]) -> dict[str, str]:
    # dask-jobqueue's public scaling makes identical jobs; named jobs with their own resources and
    # GPUs are SpecCluster worker specs, which the cluster submits when it corrects its state
    for name, opts in jobs.items():
        spec = {"cls": cluster.job_cls, "options": _with_cluster_settings(cluster, opts)}
        if opts.get("processes", 1) > 1:  # the worker names the job's processes take, as jobqueue's scale() says
            spec["group"] = [f"-{i}" for i in range(opts["processes"])]
        cluster.worker_spec[name] = spec
    await cluster._correct_state()
    return {name: cluster.workers[name].job_id for name in jobs}


def _with_cluster_settings(cluster: JobQueueCluster, opts: dict) -> dict:
    # what JobQueueCluster adds to its own template: the scheduler's protocol, TLS files, interface
    shared = {k: cluster._job_kwargs[k] for k in ("config_name", "interface", "protocol", "security")}
    return shared | opts
