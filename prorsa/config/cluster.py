"""Cluster files (cluster/*.yaml): where a run's or a sweep's Dask workers come from.

    ClusterSpec = LocalSpec | SlurmSpec | PbsSpec | AddressSpec      one per `kind`
    load_cluster(path) -> ClusterSpec      parse and validate, or one ConfigError line
    cluster_option(value) -> ClusterSpec   `--cluster`: a file, or a scheduler address (tcp://, tls://)

    kind: slurm                      # local | slurm | pbs | address
    scheduler: {host: 10.0.0.5, dashboard_address: 127.0.0.1:8787}
    jobs: {walltime: "02:00:00", prologue: [source .venv/bin/activate]}   # shared by every job
    engines: {gpus: 1, cpus: 8, memory: 64GB, queue: gpu}   # one job per engine (GPU or TP group)
    tools: {cpus: 4, memory: 16GB}                          # one job per tool worker
    trainer: {cpus: 16, memory: 64GB}                       # train.placement: worker (one job)
    sweep: {jobs: 4, cpus: 8, memory: 16GB}                 # prorsa sweep: cpus worker processes per job
    tls: {ca_file: certs/ca.pem, cert: certs/node.pem, key: certs/node-key.pem}

Relative paths (certificates, log directories) are relative to the cluster file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from prorsa.config.load import ConfigError, describe, is_file, read_mapping

KINDS = ("local", "slurm", "pbs", "address")


class _Section(BaseModel):
    # inf and nan pass gt/ge bounds, and an infinite timeout is never what was meant
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TlsSettings(_Section):
    """Dask TLS: every connection (scheduler, workers, the driver's client) presents a certificate
    signed by `ca_file` and accepts only peers that do; a client without one is refused."""

    ca_file: str
    cert: str
    key: str | None = None  # None: the key is in the cert file
    require_encryption: bool = True  # refuse plain tcp:// connections

    def resolve(self, base: Path) -> TlsSettings:
        paths = {f: str(base / v) for f in ("ca_file", "cert", "key") if (v := getattr(self, f))}
        return self.model_copy(update=paths)

    def missing(self) -> tuple[str, str] | None:
        return next(((f, v) for f in ("ca_file", "cert", "key") if (v := getattr(self, f)) and not is_file(v)),
                    None)


class JobSettings(_Section):
    """One batch job. In `jobs:` every field is a default for the engine, tool and sweep jobs."""

    cpus: int | None = Field(None, ge=1)  # cores booked (--cpus-per-task / ncpus)
    memory: str | None = None  # e.g. 64GB: booked, and the worker's memory limit
    # engines: None = each engine's tp x dp on cuda, else 0; set, it is a node's GPUs (cluster/nodes.py)
    gpus: int | None = Field(None, ge=0)
    queue: str | None = None
    account: str | None = None
    walltime: str | None = None  # e.g. "02:00:00"
    directives: tuple[str, ...] = ()  # extra header lines without the prefix, e.g. "--constraint=h100"
    prologue: tuple[str, ...] = ()  # shell lines before the worker starts (module load, venv)
    jobs: int | None = Field(None, ge=1)  # sweep: how many jobs

    @field_validator("memory")
    @classmethod
    def _bytes(cls, v: str | None) -> str | None:
        if v is not None:
            from dask.utils import parse_bytes

            try:
                parse_bytes(v)
            except (ValueError, TypeError):
                raise ValueError("a size such as 16GB or 512MiB") from None
        return v

    def over(self, defaults: JobSettings) -> JobSettings:
        """These settings, with `defaults` where unset (lists add up: shared lines first)."""
        mine = self.model_dump(exclude_unset=True)
        merged = defaults.model_dump() | {k: v for k, v in mine.items() if v is not None}
        merged["directives"] = defaults.directives + self.directives
        merged["prologue"] = defaults.prologue + self.prologue
        return JobSettings.model_validate(merged)


class SchedulerSettings(_Section):
    host: str | None = None  # listen here; None: every interface (jobs on other nodes must reach it)
    interface: str | None = None  # e.g. ib0: scheduler and workers talk over this network interface
    port: int = Field(0, ge=0, le=65535)  # 0: any free port
    # None: the pipeline's runtime.dashboard_address (127.0.0.1:0, so only this machine sees it)
    dashboard_address: str | None = None


class LocalSpec(_Section):
    kind: Literal["local"] = "local"
    host: str = "127.0.0.1"  # worker processes and the dashboard listen on this machine only
    workers: int | None = Field(None, ge=1)  # sweep: worker processes (None: one per core)
    tls: TlsSettings | None = None


class _BatchSpec(_Section):
    scheduler: SchedulerSettings = SchedulerSettings()
    jobs: JobSettings = JobSettings()  # unset everywhere: 1 cpu, 4GB, 1 hour, 1 sweep job
    engines: JobSettings = JobSettings()
    tools: JobSettings = JobSettings()
    trainer: JobSettings = JobSettings()
    sweep: JobSettings = JobSettings()
    python: str | None = None  # the workers' interpreter; None: the one running prorsa
    log_directory: str | None = None  # the batch system's job output (relative: to the cluster file)
    local_directory: str | None = None  # workers' scratch (spilling), e.g. $TMPDIR
    death_timeout_s: float = Field(60.0, gt=0)  # a worker that cannot reach the scheduler this long exits
    start_timeout_s: float = Field(1800.0, gt=0)  # how long to wait for queued jobs to join
    tls: TlsSettings | None = None

    def job(self, section: str) -> JobSettings:
        return getattr(self, section).over(self.jobs)


class SlurmSpec(_BatchSpec):
    kind: Literal["slurm"] = "slurm"
    gpu_directive: str = "--gres=gpu:{gpus}"  # some sites want --gpus-per-task={gpus}

    @field_validator("gpu_directive")
    @classmethod
    def _gpus_placeholder(cls, v: str) -> str:
        try:
            v.format(gpus=1)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"unknown placeholder {e}; use {{gpus}}") from None
        return v


class PbsSpec(_BatchSpec):
    kind: Literal["pbs"] = "pbs"
    # the select statement of every job; {gpus} parts are dropped for jobs without GPUs
    resource_spec: str = "select=1:ncpus={cpus}:ngpus={gpus}:mem={memory}"

    @field_validator("resource_spec")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        try:
            v.format(cpus=1, gpus=1, memory="1GB")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"unknown placeholder {e}; use {{cpus}}, {{gpus}} and {{memory}}") from None
        return v


class AddressSpec(_Section):
    """A scheduler already running, its workers started with `dask worker ADDRESS --name engine-<i>`
    (one per engine), `--name tools-<j>` and, under train.placement: worker, `--name trainer`."""

    kind: Literal["address"] = "address"
    address: str = Field(pattern=r"^(tcp|tls)://.+")
    start_timeout_s: float = Field(120.0, gt=0)  # how long to wait for the named workers
    tls: TlsSettings | None = None


ClusterSpec = LocalSpec | SlurmSpec | PbsSpec | AddressSpec
_MODELS = {"local": LocalSpec, "slurm": SlurmSpec, "pbs": PbsSpec, "address": AddressSpec}


def load_cluster(path: str | Path) -> ClusterSpec:
    path = Path(path)
    data = read_mapping(path)
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _MODELS:
        raise ConfigError(f"{path}: kind: got {kind!r}; expected one of {list(KINDS)}")
    try:
        spec = _MODELS[kind].model_validate(data)
    except ValidationError as e:
        errs = e.errors()
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise ConfigError(f"{path}: {describe(errs[0], _MODELS[kind])}{more}") from None
    return _resolve(spec, path)


def _resolve(spec: ClusterSpec, path: Path) -> ClusterSpec:
    base = path.parent.absolute()  # absolute, not resolved: a link farm of certificates stays as given
    update: dict = {}
    if spec.tls is not None:
        tls = spec.tls.resolve(base)
        if (bad := tls.missing()) is not None:
            field, value = bad
            raise ConfigError(f"{path}: tls.{field}: got {value!r}; no such file (test certificates: "
                              f"prorsa certs {Path(value).parent})")
        update["tls"] = tls
    if isinstance(spec, _BatchSpec) and spec.log_directory:
        update["log_directory"] = str(base / spec.log_directory)
    return spec.model_copy(update=update)


def cluster_option(value: str) -> ClusterSpec:
    """`--cluster`: a scheduler address, or a cluster file."""
    if re.fullmatch(r"[\w.-]+:\d+", value) and not Path(value).exists():
        value = f"tcp://{value}"
    if "://" in value:
        try:
            return AddressSpec(address=value)
        except ValidationError:
            raise ConfigError(f"--cluster {value}: expected tcp://HOST:PORT, tls://HOST:PORT or a cluster file") \
                from None
    return load_cluster(value)
