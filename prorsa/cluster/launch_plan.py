"""What `prorsa run --dry-run` (and `prorsa validate --plan`) prints: every engine as it would start.

    NodeShape(devices, source)                      the GPU node a plan is for, where it is not this
                                                    machine (--gpus-per-node N, --devices 0,1,...)
    launch_plan(cfg, roles, local, environ, count_gpus, node_gpus, shape) -> [EngineLaunch]
                    the engines of a run, their node, GPUs or cores, role, layout and the server's
                    command line and environment, whole (an engine larger than a batch job's
                    node_gpus: one per node, nodes.py); DevicePlanError when they do not fit
    nodes_needed(plans, shape) -> str | None        how many nodes of the shape the engines take
    plan_table(plans) -> rich Table                 engines, roles, where they run, layouts, ports
    print_plan(plans, console, shape)               the table, how engines change role (kv_role),
                                                    then every server's command line whole

Nothing is started, no model is made or read. Each command is one a person can paste on the node
(server.py hand_command, built by the same code as the command a start runs): `vllm serve MODEL`
where no patch of ours is needed, else our launcher, with why; the environment a start sets in
front (GPUs, NIXL side-channel port, loopback-only networking, CPU binding). A start picks free
ports itself; the plan gives every engine ports of its own from vLLM's usual bases (HTTP 8000,
NIXL side channel 5600, DP RPC 29550), so engines started by hand side by side do not clash. An
engine spanning nodes from batch jobs meets at its first node, whose host only the batch system
knows (LEADER_HOST).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prorsa.cluster.devices import DevicePlan, node_plan, nvml_gpu_count, plan_on_nodes
from prorsa.cluster.nodes import NodeSpan, node_args, spanning_engines
from prorsa.config.engines import EnginesConfig
from prorsa.engine.core_share import engine_cores, node_share
from prorsa.engine.registry import backend_of, engine_name
from prorsa.roles import Role

HTTP_PORT, SIDE_CHANNEL_PORT, RPC_PORT = 8000, 5600, 29550  # vLLM's defaults: the first engine's
LEADER_HOST = "<leader-host>"  # an engine spanning batch jobs: the host of its first node's job


@dataclass(frozen=True)
class NodeShape:
    devices: tuple[str, ...]  # a node's GPUs, as CUDA_VISIBLE_DEVICES would list them
    source: str  # the option that gave them, for messages: "--gpus-per-node 8"


@dataclass(frozen=True)
class EngineLaunch:
    engine: str  # engine-<i>
    role: Role  # its initial role
    layout: str  # "tp2 x dp4 ep" (vLLM), "tp1 ep8" (an emulated engine's cost-model layout)
    runs_on: str  # "GPU 0,1", "node 1: GPU 0", "cores 2,3", "2 GPUs of its job", "any core", "emulated"
    gpus: tuple[str, ...] | None  # CUDA engines on a planned node; None: CPU, or its job's GPUs
    command: tuple[str, ...]  # the server's argv; () for an emulated engine (no process)
    env: tuple[tuple[str, str], ...]  # what a start sets in the server's environment
    # an engine spanning nodes: the headless server of each node after the first (`command` is the
    # first node's, with the API server); () for an engine on one node
    followers: tuple[tuple[str, ...], ...] = ()
    follower_env: tuple[tuple[tuple[str, str], ...], ...] = ()  # ... and each one's environment
    node: int = 0  # the planned node it runs on (nodes of a NodeShape; 0 otherwise)
    port: int | None = None  # its HTTP port
    launcher: tuple[str, ...] = ()  # why it runs our launcher rather than `vllm serve`; () it does not
    switch: str = ""  # how it changes role (engine/vllm/kv_roles.py describe); "" emulated

    def shell(self, node: int = 0) -> str:
        """Node `node`'s command line as a shell would take it, its environment in front."""
        command = self.command if node == 0 else self.followers[node - 1]
        env = self.follower_env[node - 1] if node else self.env
        return shlex.join([f"{k}={v}" for k, v in env] + list(command))


def _model_dir(cfg: EnginesConfig) -> Path:
    if cfg.vllm.model == "tiny":
        from prorsa.engine.tiny_model import tiny_model_dir

        return tiny_model_dir(cfg.vllm.cache_dir)
    if cfg.vllm.model == "tiny-moe":
        from prorsa.engine.tiny_model import tiny_moe_dir

        return tiny_moe_dir(cfg.vllm.cache_dir)
    return Path(cfg.vllm.model)


class _Ports:
    """Ports of their own for every server of the plan: HTTP one each, side channels one per DP rank."""

    def __init__(self) -> None:
        self.http, self.side = HTTP_PORT, SIDE_CHANNEL_PORT

    def take(self, ranks: int) -> tuple[int, int]:
        taken = self.http, self.side
        self.http, self.side = self.http + 1, self.side + ranks
        return taken


def _node_plans(cfg: EnginesConfig, engines: int, local: bool, environ: Mapping[str, str] | None,
                count_gpus: Callable[[], int], shape: NodeShape | None) -> dict[int, tuple[int, DevicePlan, int]]:
    """Engine index -> (node, the node's device plan, its slot there), for engines on planned nodes."""
    if not local or not backend_of(cfg).on_gpus:
        return {}
    if shape is None:
        plan = node_plan(cfg, engines, environ, count_gpus)
        return {i: (0, plan, i) for i in range(engines)}
    return {i: (node, plan, slot) for node, (members, plan) in enumerate(plan_on_nodes(cfg, shape.devices, shape.source))
            for slot, i in enumerate(members)}


def launch_plan(cfg: EnginesConfig, roles: list[Role], local: bool = True,
                environ: Mapping[str, str] | None = None, count_gpus: Callable[[], int] = nvml_gpu_count,
                node_gpus: int | None = None, shape: NodeShape | None = None) -> list[EngineLaunch]:
    """`local`: every engine on this machine (a LocalCluster), or with `shape` on as many such nodes as
    they need; else each engine joins from a job of its own, whose GPUs only the batch system knows;
    `node_gpus`: the GPUs such a job books (the cluster file's engines.gpus), None: as many as its
    engine needs."""
    if not backend_of(cfg).launches_servers:
        groups = cfg.engine_groups
        at = cfg.group_of_engine()
        return [EngineLaunch(engine_name(i), role, f"tp{groups[at[i]].tp} ep{groups[at[i]].ep}", "emulated", None, (), ())
                for i, role in enumerate(roles)]
    from prorsa.engine.vllm.command import ServerSpec
    from prorsa.engine.vllm.kv_roles import describe, kv_role

    path = backend_of(cfg).switch_path()
    placed = _node_plans(cfg, len(roles), local, environ, count_gpus, shape)
    several = len({node for node, _, _ in placed.values()}) > 1
    # a local run: CPU engines spanning "nodes" of engines.vllm.node_ranks, all on this machine
    spans = spanning_engines(cfg, None if local else node_gpus)
    ports = _Ports()
    out = []
    for i, role in enumerate(roles):
        settings = cfg.engine_vllm(i)  # engine groups: each its own layout
        cores = engine_cores(i, cfg.vllm.cores_per_engine) if cfg.vllm.device == "cpu" else None
        node, plan, slot = placed.get(i, (0, None, 0))
        gpus = plan.for_slot(slot) if plan is not None else None
        spec = ServerSpec.from_settings(settings, _model_dir(cfg), cores, gpus, kv_role(role, path))
        commands, envs, port, needs = _servers(spec, spans.get(i), i, "127.0.0.1" if local else LEADER_HOST, ports)
        where = _runs_on(cfg, spec, spans.get(i), gpus)
        out.append(EngineLaunch(engine_name(i), role, settings.layout.describe(),
                                f"node {node}: {where}" if several else where, gpus, commands[0], envs[0],
                                commands[1:], envs[1:], node, port, needs, describe(path)))
    return out


def _servers(spec, span: NodeSpan | None, index: int, leader: str, ports: _Ports):
    """The engine's servers' command lines and environments (the first node's, then its followers'
    where it spans nodes) on ports of their own; the first's HTTP port; why they need our launcher."""
    from prorsa.engine.vllm.command import hand_command

    commands, envs, needs, first_port = [], [], (), None
    for k in range(span.nodes if span else 1):
        node_spec = spec
        if span:  # each node's server runs its own ranks (CPU: on its share of the cores)
            cores = tuple(node_share(spec.cores, span.nodes, k)) if spec.cores else None
            node_spec = replace(spec, cores=cores, local_dp=span.local_dp)
        port, side = ports.take(node_spec.layout.dp)
        command, env, need = hand_command(node_spec, port, side)
        if span:
            command += node_args(span, k, leader, RPC_PORT + index)
        commands.append(tuple(command))
        envs.append(_ordered(env))
        needs = needs or tuple(need)
        first_port = first_port or port
    return tuple(commands), tuple(envs), first_port, needs


def _ordered(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Where the server runs first (its GPUs or cores), then the rest by name."""
    first = ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_OMP_THREADS_BIND")
    return tuple((k, env[k]) for k in first if k in env) + tuple(sorted((k, v) for k, v in env.items() if k not in first))


def _runs_on(cfg: EnginesConfig, spec, span: NodeSpan | None, gpus: tuple[str, ...] | None) -> str:
    layout, cores = spec.layout, spec.cores
    if gpus is not None:
        return "GPU " + ",".join(gpus)
    if span and cfg.vllm.device == "cpu":
        shares = (",".join(map(str, node_share(cores, span.nodes, k))) for k in range(span.nodes))
        return f"{span.nodes} workers: cores " + ("|".join(shares) if cores else "any")
    if span:
        return f"{span.nodes} jobs of {span.local_dp * layout.tp} GPUs"
    if cfg.vllm.device == "cuda":
        return f"{layout.gpus} GPU{'s' if layout.gpus > 1 else ''} of its job"
    return "cores " + ",".join(map(str, cores)) if cores else "any core"


def nodes_needed(plans: list[EngineLaunch], shape: NodeShape | None) -> str | None:
    """One line on the nodes of `shape` the engines take; None without a shape, or with no GPUs to place."""
    placed = [p for p in plans if p.gpus is not None]
    if shape is None or not placed:
        return None
    gpus, nodes, size = sum(len(p.gpus) for p in placed), max(p.node for p in placed) + 1, len(shape.devices)
    line = (f"nodes: {nodes} of {size} GPUs ({shape.source}) for the engines' {gpus} GPUs")
    if nodes > 1:
        line += ("; a local run is one node: start each node's engines by hand, or run on batch jobs "
                 "(--cluster cluster/slurm.yaml)")
    return line


def plan_table(plans: list[EngineLaunch]) -> Table:
    table = Table(title="launch plan (nothing started)")
    for column in ("engine", "role", "runs on", "layout", "port"):
        table.add_column(column)
    for p in plans:
        table.add_row(p.engine, p.role.value, p.runs_on, p.layout, str(p.port) if p.port else "-")
    return table


def print_plan(plans: list[EngineLaunch], console: Console, shape: NodeShape | None = None) -> None:
    """The table, the nodes it takes, then each server's command line whole, as a shell would take it
    (an engine spanning nodes: one per node, the first node's API server first), below a comment
    saying why where it runs our launcher rather than `vllm serve`."""
    console.print(plan_table(plans))
    if plans and plans[0].switch:
        console.print(plans[0].switch, soft_wrap=True, markup=False, highlight=False)
    if line := nodes_needed(plans, shape):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    for p in plans:
        if p.launcher:
            console.print(f"# {p.engine} runs prorsa's launcher: {'; '.join(p.launcher)}", soft_wrap=True,
                          markup=False, highlight=False)
        if p.command:
            console.print(f"{p.engine}: {p.shell()}", soft_wrap=True, markup=False, highlight=False)
        for k in range(1, len(p.followers) + 1):
            console.print(f"{p.engine} node {k}: {p.shell(k)}", soft_wrap=True, markup=False, highlight=False)
