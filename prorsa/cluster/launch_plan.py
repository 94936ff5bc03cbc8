"""What `prorsa run --dry-run` (and `prorsa validate --plan`) prints: every engine as it would start.

    launch_plan(cfg, roles, local, environ, count_gpus, node_gpus) -> [EngineLaunch]
                    the engines of a run, their GPUs or cores, role, layout and exact server command
                    line (an engine larger than a batch job's node_gpus: one per node, nodes.py);
                    DevicePlanError when the engines do not fit the node's GPUs
    plan_table(plans) -> rich Table                 engines, roles, where they run, layouts, ports
    print_plan(plans, console)                       the table, then every server command line whole

Nothing is started, no model is made or read. The command line is the one engine_host.py launches
(engine/vllm/server.py build_command and build_env), with the two things only a start knows left
as placeholders: the HTTP port (a free local port, picked at start) and, where engines join from
batch jobs, the GPUs the batch system gives each job; an engine spanning nodes also leaves its
leader's host and DP RPC port to be filled in.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prorsa.cluster.devices import node_plan, nvml_gpu_count
from prorsa.cluster.nodes import node_args, spanning_engines
from prorsa.config.engines import EnginesConfig
from prorsa.engine.core_share import engine_cores, node_share
from prorsa.engine.registry import backend_of, engine_name
from prorsa.roles import Role

PORT = "<port>"  # picked at start: a free local port
LEADER_HOST = "<leader-host>"  # an engine spanning nodes: the host of its first node's job
RPC_PORT = "<dp-rpc-port>"  # ... and a port free there, where its DP ranks meet


@dataclass(frozen=True)
class EngineLaunch:
    engine: str  # engine-<i>
    role: Role  # its initial role
    layout: str  # "tp2 x dp4 ep" (vLLM), "tp1 ep8" (an emulated engine's cost-model layout)
    runs_on: str  # "GPU 0,1", "cores 2,3", "2 GPUs of its job", "any core", "emulated"
    gpus: tuple[str, ...] | None  # CUDA engines on this node; None: CPU, or its job's GPUs
    command: tuple[str, ...]  # the server's argv; () for an emulated engine (no process)
    env: tuple[tuple[str, str], ...]  # what the launch sets that says where (and how) the engine runs
    # an engine spanning nodes: the headless server of each node after the first (`command` is the
    # first node's, with the API server); () for an engine on one node
    followers: tuple[tuple[str, ...], ...] = ()
    # ... and their placement variables where they differ from the first node's (CPU: their cores)
    follower_env: tuple[tuple[tuple[str, str], ...], ...] = ()

    def shell(self, node: int = 0) -> str:
        """Node `node`'s command line as a shell would take it, its placement variables in front."""
        command = self.command if node == 0 else self.followers[node - 1]
        env = self.follower_env[node - 1] if node and self.follower_env else self.env
        return shlex.join([f"{k}={v}" for k, v in env] + list(command))


def _model_dir(cfg: EnginesConfig) -> Path:
    if cfg.vllm.model == "tiny":
        from prorsa.engine.tiny_model import tiny_model_dir

        return tiny_model_dir(cfg.vllm.cache_dir)
    if cfg.vllm.model == "tiny-moe":
        from prorsa.engine.tiny_model import tiny_moe_dir

        return tiny_moe_dir(cfg.vllm.cache_dir)
    return Path(cfg.vllm.model)


def launch_plan(cfg: EnginesConfig, roles: list[Role], local: bool = True,
                environ: Mapping[str, str] | None = None,
                count_gpus: Callable[[], int] = nvml_gpu_count, node_gpus: int | None = None) -> list[EngineLaunch]:
    """`local`: every engine on this machine (a LocalCluster); else each engine
    joins from a job of its own, whose GPUs only the batch system knows; `node_gpus`: the GPUs
    such a job books (the cluster file's engines.gpus), None: as many as its engine needs."""
    if not backend_of(cfg).launches_servers:
        groups = cfg.engine_groups
        at = cfg.group_of_engine()
        return [EngineLaunch(engine_name(i), role, f"tp{groups[at[i]].tp} ep{groups[at[i]].ep}", "emulated", None, (), ())
                for i, role in enumerate(roles)]
    from prorsa.engine.vllm.server import ServerSpec, build_command

    plan = node_plan(cfg, len(roles), environ, count_gpus) if local else None
    # a local run: CPU engines spanning "nodes" of engines.vllm.node_ranks, all on this machine
    spans = spanning_engines(cfg, None if local else node_gpus)
    out = []
    for i, role in enumerate(roles):
        settings = cfg.engine_vllm(i)  # engine groups: each its own layout
        layout = settings.layout
        cores = engine_cores(i, cfg.vllm.cores_per_engine) if cfg.vllm.device == "cpu" else None
        gpus = plan.for_slot(i) if plan is not None else None
        spec = ServerSpec.from_settings(settings, _model_dir(cfg), cores, gpus)
        command, followers, follower_env = build_command(spec, PORT), (), ()
        span = spans.get(i)
        if span and cores:  # each node binds its own ranks to its share of the cores
            follower_env = tuple(_shown(replace(spec, cores=tuple(node_share(cores, span.nodes, k)),
                                                local_dp=span.local_dp)) for k in range(1, span.nodes))
            spec = replace(spec, cores=tuple(node_share(cores, span.nodes, 0)), local_dp=span.local_dp)
        shown = _shown(spec)
        if span:
            leader = "127.0.0.1" if local else LEADER_HOST
            followers = tuple(tuple(command + node_args(span, k, leader, RPC_PORT)) for k in range(1, span.nodes))
            command = command + node_args(span, 0, leader, RPC_PORT)
        if gpus is not None:
            runs_on = "GPU " + ",".join(gpus)
        elif span and cfg.vllm.device == "cpu":
            shares = (",".join(map(str, node_share(cores, span.nodes, k))) for k in range(span.nodes))
            runs_on = f"{span.nodes} workers: cores " + ("|".join(shares) if cores else "any")
        elif span:
            runs_on = f"{span.nodes} jobs of {span.local_dp * layout.tp} GPUs"
        elif cfg.vllm.device == "cuda":
            runs_on = f"{layout.gpus} GPU{'s' if layout.gpus > 1 else ''} of its job"
        else:
            runs_on = "cores " + ",".join(map(str, cores)) if cores else "any core"
        out.append(EngineLaunch(engine_name(i), role, layout.describe(), runs_on, gpus,
                                tuple(command), shown, followers, follower_env))
    return out


def _shown(spec) -> tuple[tuple[str, str], ...]:
    """Where a server runs, and whether it patches vLLM for DP ranks on CPU (_launch.py)."""
    from prorsa.engine.vllm.server import build_env

    env = build_env(spec, side_channel_port=0, base={})
    keys = ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND", "PRORSA_CPU_DP")
    return tuple((k, env[k]) for k in keys if k in env)


def plan_table(plans: list[EngineLaunch]) -> Table:
    table = Table(title="launch plan (nothing started)")
    for column in ("engine", "role", "runs on", "layout", "port"):
        table.add_column(column)
    for p in plans:
        table.add_row(p.engine, p.role.value, p.runs_on, p.layout, PORT if p.command else "-")
    return table


def print_plan(plans: list[EngineLaunch], console: Console) -> None:
    """The table, then each server's command line whole, as a shell would take it (an engine
    spanning nodes: one per node, the first node's API server first)."""
    console.print(plan_table(plans))
    for p in plans:
        if p.command:
            console.print(f"{p.engine}: {p.shell()}", soft_wrap=True, markup=False, highlight=False)
        for k in range(1, len(p.followers) + 1):
            console.print(f"{p.engine} node {k}: {p.shell(k)}", soft_wrap=True, markup=False, highlight=False)
