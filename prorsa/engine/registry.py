"""Engine backends by name: the pipeline's `engines.backend` picks one.

    make_engine(index, role, cfg, run_dir) -> Engine    called once per engine, where it will live

Imports are lazy so a machine without vLLM runs emulated engines.
"""

from __future__ import annotations

from pathlib import Path

from prorsa.config.pipeline import EnginesConfig
from prorsa.engine.base import Engine
from prorsa.roles import Role


def engine_name(index: int) -> str:
    return f"engine-{index}"


def make_engine(index: int, role: Role, cfg: EnginesConfig, run_dir: Path) -> Engine:
    if cfg.backend == "emulated":
        from prorsa.costmodel import CostModel
        from prorsa.engine.emulated import EmulatedEngine

        cost = CostModel.from_names(cfg.gpu, cfg.model, tp=cfg.tp)
        return EmulatedEngine(engine_name(index), role, cost, slots=cfg.slots, time_scale=cfg.time_scale)
    if cfg.backend == "vllm":
        from prorsa.engine.vllm import make_vllm_engine

        return make_vllm_engine(engine_name(index), index, role, cfg, run_dir)
    raise ValueError(f"engines.backend: unknown backend {cfg.backend!r}")
