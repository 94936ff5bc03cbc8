"""Engine backends by name: the pipeline's `engines.backend` picks one.

    make_engine(index, role, cfg, run_dir, gpus) -> Engine   called once per engine, where it will live;
                                                            gpus: a CUDA engine's own (cluster/devices.py)
                                                            peers: the other nodes of an engine spanning
                                                            nodes, when this is its leader
    node_server(index, cfg, run_dir, peers) -> VllmServer   a further node's headless server of that engine
    hosted_engines(pipeline) -> EnginesConfig           the engines section the engine hosts get

Imports are lazy so a machine without vLLM runs emulated engines.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from prorsa.config.engines import EnginesConfig
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.base import Engine
from prorsa.engine.core_share import engine_cores, node_share
from prorsa.roles import Role


def engine_name(index: int) -> str:
    return f"engine-{index}"


def make_engine(index: int, role: Role, cfg: EnginesConfig, run_dir: Path,
                gpus: tuple[str, ...] | None = None, peers=None) -> Engine:
    if cfg.backend == "emulated":
        if cfg.parallelism is not None:  # the live controller has no relayout step (sim/controller.py has)
            raise ValueError("engines.parallelism: per-role parallelism is simulated only (prorsa sim); "
                             "live engines use engines.tp and engines.ep")
        from prorsa.costmodel import CostModel
        from prorsa.engine.emulated import EmulatedEngine

        # engine groups: this engine's own layout and slots
        group = cfg.engine_groups[cfg.group_of_engine()[index]] if cfg.groups is not None else None
        tp, ep, slots = (group.tp, group.ep, group.slots) if group is not None else (cfg.tp, cfg.ep, cfg.slots)
        cost = CostModel.from_names(cfg.gpu, cfg.model, tp=tp, ep=ep)
        return EmulatedEngine(engine_name(index), role, cost, slots=slots, time_scale=cfg.time_scale,
                              prefix_cache=cfg.prefix_cache)
    if cfg.backend == "vllm":
        return _vllm_engine(index, role, cfg, run_dir, gpus, peers)
    raise ValueError(f"engines.backend: unknown backend {cfg.backend!r}")


def hosted_engines(cfg: PipelineConfig) -> EnginesConfig:
    """The engines section as the engine hosts get it. With scheduling.priority, vLLM servers run
    the priority scheduling policy: one on the default fcfs policy would not look at a request's
    priority (emulated engines always admit by it)."""
    engines = cfg.engines
    if not cfg.scheduling.priority or engines.backend != "vllm":
        return engines
    return engines.model_copy(update={"vllm": engines.vllm.model_copy(update={"scheduling_policy": "priority"})})


def resolve_model_dir(cfg: EnginesConfig) -> Path:
    """`tiny` (a Llama) and `tiny-moe` (a Qwen3-MoE) are made locally on first use (no model hub
    is needed); anything else is a directory."""
    if cfg.vllm.model == "tiny":
        from prorsa.engine.tiny_model import ensure_tiny_model

        return ensure_tiny_model(Path(cfg.vllm.cache_dir))
    if cfg.vllm.model == "tiny-moe":
        from prorsa.engine.tiny_model import ensure_tiny_moe

        return ensure_tiny_moe(Path(cfg.vllm.cache_dir))
    model_dir = Path(cfg.vllm.model)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"engines.vllm.model: {model_dir} is not a model directory (no config.json)")
    return model_dir


def _cores(index: int, cfg: EnginesConfig) -> list[int] | None:
    """The cores engine `index` pins on CPU (all its nodes' together); None on GPUs."""
    return engine_cores(index, cfg.vllm.cores_per_engine) if cfg.vllm.device == "cpu" else None


def _vllm_engine(index: int, role: Role, cfg: EnginesConfig, run_dir: Path, gpus: tuple[str, ...] | None,
                 peers=None) -> Engine:
    from prorsa.engine.vllm import VllmEngine

    model_dir = resolve_model_dir(cfg)
    server = node_server(index, cfg, run_dir, peers, gpus) if peers is not None else None
    engine = VllmEngine(engine_name(index), role, cfg.engine_vllm(index), model_dir, _cores(index, cfg),
                        run_dir / "engines", gpus, server)
    engine.vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    return engine


def node_server(index: int, cfg: EnginesConfig, run_dir: Path, peers, gpus: tuple[str, ...] | None = None):
    """Node `peers.node`'s server of engine `index`, an engine spanning nodes (cluster/span_host.py):
    its ranks on its share of the engine's cores (CPU), its DP arguments from `peers` at each launch.
    Node 0's is the leader's, with the API server; the others' are headless."""
    from prorsa.engine.vllm.server import ServerSpec, VllmServer

    spec = ServerSpec.from_settings(cfg.engine_vllm(index), resolve_model_dir(cfg),
                                    node_share(_cores(index, cfg), peers.nodes, peers.node), gpus)
    spec = dataclasses.replace(spec, local_dp=peers.local_dp)
    name = engine_name(index) if peers.node == 0 else f"{engine_name(index)}-node-{peers.node}"
    return VllmServer(spec, Path(run_dir) / "engines" / f"{name}.log", peers)
