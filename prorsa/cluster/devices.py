"""Which GPUs of a node each vLLM engine on it gets: the device plan.

    node_devices(listed, environ, count_gpus) -> (devices, source)   the node's GPUs, in order
    plan_node(devices, source, layout, engines) -> DevicePlan         checked; DevicePlanError says why not
                                                                      (layout: one for all, or each engine's)
    DevicePlan.for_slot(k) -> ("2", "3")                              the k-th engine's GPUs on the node
    gpus_for_slot(cfg, slot, engines_on_node[, index])                what an engine worker launches with
    plan_on_nodes(cfg, devices, source) -> [(engines, DevicePlan)]    the engines over as many nodes of
                                                                      `devices` as they need (a dry run's
                                                                      --gpus-per-node): each node's engines
    engine_layouts(cfg) -> (EngineLayout, ...)                        each engine's layout (engines.groups)

The node's device list follows dask-cuda (LocalCUDACluster, dask-cuda-worker): the GPUs listed in
the pipeline (engines.devices), else CUDA_VISIBLE_DEVICES as the run was started with (indices or
GPU-/MIG- UUIDs, in that order), else every GPU NVML counts. dask-cuda rotates the whole list per
worker so each sees its own GPU first; a vLLM server is given a slice instead: engine k takes
devices[k*g : (k+1)*g], g = tp x dp, and sees no other GPU (vLLM's ranks use the first tp x dp
visible devices, and a neighbour's GPU in view is one it could allocate on).

Engines on a node: a local run places all of them on this machine (slot = engine index); a batch
job or a worker that joined by itself hosts one engine on what it was given (slot 0).

Engine groups of different sizes (engines.groups) take consecutive slices of their own group's
tp x dp GPUs, the widest engines first so each starts at a multiple of its size (an 8-GPU engine
on one NVLink domain of an 8-GPU board, not across two); the node must hold their sum, and no
engine may be larger than it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prorsa.config.engines import EnginesConfig
from prorsa.config.layout import EngineLayout
from prorsa.engine.registry import backend_of


class DevicePlanError(ValueError):
    """The engines do not fit the node's GPUs; the message is one line naming what to change."""


def nvml_gpu_count() -> int:
    """GPUs NVML sees; 0 without nvidia-ml-py, without a driver, or on any NVML error."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError and its driver-missing subclasses
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def node_devices(listed: tuple[str, ...] | None, environ: Mapping[str, str] | None = None,
                 count_gpus: Callable[[], int] = nvml_gpu_count) -> tuple[tuple[str, ...], str]:
    """The node's GPUs in order, and where the list came from (for messages)."""
    if listed is not None:
        return tuple(listed), "engines.devices"
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(d.strip() for d in visible.split(",") if d.strip()), "CUDA_VISIBLE_DEVICES"
    return tuple(str(i) for i in range(count_gpus())), "NVML"


@dataclass(frozen=True)
class DevicePlan:
    devices: tuple[str, ...]  # the node's GPUs, in order
    source: str  # engines.devices, CUDA_VISIBLE_DEVICES or NVML
    per_engine: int  # GPUs of one engine: tp x dp (engines of different sizes: the first's)
    engines: int  # engines on the node
    # (first GPU, GPUs) of each engine, where engines differ in size (engines.groups)
    slices: tuple[tuple[int, int], ...] | None = None

    def for_slot(self, slot: int) -> tuple[str, ...]:
        if not 0 <= slot < self.engines:
            raise IndexError(f"slot {slot} of {self.engines} engines on the node")
        if self.slices is not None:
            start, size = self.slices[slot]
            return self.devices[start:start + size]
        return self.devices[slot * self.per_engine:(slot + 1) * self.per_engine]


def _plural(n: int) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}"


def plan_groups(devices: tuple[str, ...], source: str, layouts: Sequence[EngineLayout]) -> DevicePlan:
    """Engines of their own sizes, in order, on consecutive slices of the node's GPUs."""
    n = len(devices)
    if n == 0:
        raise DevicePlanError(f"engines.vllm.device is cuda but no GPU was found ({source}); "
                              "list the node's GPUs in engines.devices (a plan for a GPU node: --gpus-per-node N)")
    if big := next((lay for lay in layouts if lay.gpus > n), None):
        raise DevicePlanError(f"engines.groups: an engine of tp {big.tp} x dp {big.dp} = {_plural(big.gpus)} is "
                              f"larger than the node's {n} GPUs ({source})"
                              "; an engine spans nodes only from batch jobs (engines.gpus in a slurm or pbs cluster file)")
    sizes = tuple(lay.gpus for lay in layouts)
    if sum(sizes) > n:
        counts: dict[int, int] = {}
        for g in sizes:
            counts[g] = counts.get(g, 0) + 1
        parts = " + ".join(f"{k} x {_plural(g)}" for g, k in counts.items())
        raise DevicePlanError(f"engines.groups: {parts} = {sum(sizes)} GPUs, but the node has {n} ({source})")
    starts, at = {}, 0
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):  # stable: engine order among equals
        starts[i], at = at, at + sizes[i]
    slices = tuple((starts[i], sizes[i]) for i in range(len(sizes)))
    return DevicePlan(tuple(devices), source, sizes[0] if sizes else 1, len(sizes), slices)


def plan_node(devices: tuple[str, ...], source: str, layout: EngineLayout | Sequence[EngineLayout],
              engines: int) -> DevicePlan:
    if not isinstance(layout, EngineLayout):
        return plan_groups(devices, source, layout)
    n, g = len(devices), layout.gpus
    shape = f"tp {layout.tp} x dp {layout.dp} = {g} GPU{'s' if g > 1 else ''}"
    if n == 0:
        raise DevicePlanError(f"engines.vllm.device is cuda but no GPU was found ({source}); "
                              "list the node's GPUs in engines.devices (a plan for a GPU node: --gpus-per-node N)")
    if g > n:
        raise DevicePlanError(f"engines.vllm: an engine of {shape} is larger than the node's {n} GPUs ({source})"
                              "; an engine spans nodes only from batch jobs (engines.gpus in a slurm or pbs cluster file)")
    if n % g:
        raise DevicePlanError(f"engines.vllm: the node's {n} GPUs ({source}) do not divide into engines of {shape}")
    if engines * g > n:
        raise DevicePlanError(f"engines.count: {engines} engines x {g} GPU{'s' if g > 1 else ''} = {engines * g} GPUs, "
                              f"but the node has {n} ({source})")
    return DevicePlan(tuple(devices), source, g, engines)


def engine_layouts(cfg: EnginesConfig) -> tuple[EngineLayout, ...]:
    """Each engine's vLLM layout, in engine order: its group's (engines.groups), else engines.vllm's."""
    return tuple(cfg.engine_vllm(i).layout for i in range(cfg.count))


def node_plan(cfg: EnginesConfig, engines_on_node: int, environ: Mapping[str, str] | None = None,
              count_gpus: Callable[[], int] = nvml_gpu_count, first: int = 0) -> DevicePlan | None:
    """The plan of a node hosting `engines_on_node` engines, engine `first` the first of them;
    None for engines without GPUs."""
    if not backend_of(cfg).on_gpus:
        return None
    devices, source = node_devices(cfg.devices, environ, count_gpus)
    if cfg.groups is not None:
        return plan_groups(devices, source, engine_layouts(cfg)[first:first + engines_on_node])
    return plan_node(devices, source, cfg.vllm.layout, engines_on_node)


def gpus_for_slot(cfg: EnginesConfig, slot: int, engines_on_node: int,
                  index: int | None = None) -> tuple[str, ...] | None:
    """What the engine worker in `slot` launches its server with (None: CPU, nothing set);
    `index`: the engine's, where a node hosts one engine of a group (a batch job)."""
    first = 0 if index is None or engines_on_node > 1 else index
    plan = node_plan(cfg, engines_on_node, first=first)
    return None if plan is None else plan.for_slot(slot)


def plan_on_nodes(cfg: EnginesConfig, devices: tuple[str, ...], source: str) -> list[tuple[tuple[int, ...], DevicePlan]]:
    """The engines on nodes like one of `devices`: on one node as a local run plans them where they
    fit it, else over as few nodes as first-fit of the widest engines first finds, each engine whole
    on one node (an engine larger than a node: DevicePlanError, as on one node)."""
    layouts = engine_layouts(cfg)
    n = len(devices)
    if sum(lay.gpus for lay in layouts) <= n or n == 0:
        one = plan_groups(devices, source, layouts) if cfg.groups is not None else \
            plan_node(devices, source, cfg.vllm.layout, cfg.count)
        return [(tuple(range(cfg.count)), one)]
    nodes: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(layouts)), key=lambda i: -layouts[i].gpus):
        at = next((k for k, left in enumerate(free) if left >= layouts[i].gpus), None)
        if at is None:
            nodes.append([])
            free.append(n)
            at = len(nodes) - 1
        nodes[at].append(i)
        free[at] -= layouts[i].gpus
    out = []
    for engines in nodes:
        engines.sort()
        out.append((tuple(engines), plan_groups(devices, source, [layouts[i] for i in engines])))
    return out
