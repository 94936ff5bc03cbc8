"""Which GPUs of a node each vLLM engine on it gets: the device plan.

    node_devices(listed, environ, count_gpus) -> (devices, source)   the node's GPUs, in order
    plan_node(devices, source, layout, engines) -> DevicePlan         checked; DevicePlanError says why not
    DevicePlan.for_slot(k) -> ("2", "3")                              the k-th engine's GPUs on the node
    gpus_for_slot(cfg, slot, engines_on_node) -> tuple | None         what an engine worker launches with

The node's device list follows dask-cuda (LocalCUDACluster, dask-cuda-worker): the GPUs listed in
the pipeline (engines.devices), else CUDA_VISIBLE_DEVICES as the run was started with (indices or
GPU-/MIG- UUIDs, in that order), else every GPU NVML counts. dask-cuda rotates the whole list per
worker so each sees its own GPU first; a vLLM server is given a slice instead: engine k takes
devices[k*g : (k+1)*g], g = tp x dp, and sees no other GPU (vLLM's ranks use the first tp x dp
visible devices, and a neighbour's GPU in view is one it could allocate on).

Engines on a node: a local run places all of them on this machine (slot = engine index); a batch
job or a worker that joined by itself hosts one engine on what it was given (slot 0).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prorsa.config.layout import EngineLayout
from prorsa.config.pipeline import EnginesConfig


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
    per_engine: int  # GPUs of one engine: tp x dp
    engines: int  # engines on the node

    def for_slot(self, slot: int) -> tuple[str, ...]:
        if not 0 <= slot < self.engines:
            raise IndexError(f"slot {slot} of {self.engines} engines on the node")
        return self.devices[slot * self.per_engine:(slot + 1) * self.per_engine]


def plan_node(devices: tuple[str, ...], source: str, layout: EngineLayout, engines: int) -> DevicePlan:
    n, g = len(devices), layout.gpus
    shape = f"tp {layout.tp} x dp {layout.dp} = {g} GPU{'s' if g > 1 else ''}"
    if n == 0:
        raise DevicePlanError(f"engines.vllm.device is cuda but no GPU was found ({source}); "
                              "list the node's GPUs in engines.devices")
    if g > n:
        raise DevicePlanError(f"engines.vllm: an engine of {shape} is larger than the node's {n} GPUs ({source})")
    if n % g:
        raise DevicePlanError(f"engines.vllm: the node's {n} GPUs ({source}) do not divide into engines of {shape}")
    if engines * g > n:
        raise DevicePlanError(f"engines.count: {engines} engines x {g} GPU{'s' if g > 1 else ''} = {engines * g} GPUs, "
                              f"but the node has {n} ({source})")
    return DevicePlan(tuple(devices), source, g, engines)


def needs_gpus(cfg: EnginesConfig) -> bool:
    return cfg.backend == "vllm" and cfg.vllm.device == "cuda"


def node_plan(cfg: EnginesConfig, engines_on_node: int, environ: Mapping[str, str] | None = None,
              count_gpus: Callable[[], int] = nvml_gpu_count) -> DevicePlan | None:
    """The plan of a node hosting `engines_on_node` engines; None for engines without GPUs."""
    if not needs_gpus(cfg):
        return None
    devices, source = node_devices(cfg.devices, environ, count_gpus)
    return plan_node(devices, source, cfg.vllm.layout, engines_on_node)


def gpus_for_slot(cfg: EnginesConfig, slot: int, engines_on_node: int) -> tuple[str, ...] | None:
    """What the engine worker in `slot` launches its server with (None: CPU, nothing set)."""
    plan = node_plan(cfg, engines_on_node)
    return None if plan is None else plan.for_slot(slot)
