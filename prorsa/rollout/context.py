"""What a run's clock and policy are, from its pipeline; the same for the live body and the simulator.

    time_unit(cfg)        wall seconds per body second (emulated engines may run time-scaled)
    policy_context(cfg)   the PolicyContext adaptive policies plan with
"""

from __future__ import annotations

from prorsa.config.pipeline import PipelineConfig
from prorsa.control.policy import PolicyContext
from prorsa.costmodel import CostModel


def time_unit(cfg: PipelineConfig) -> float:
    """Wall seconds per body second: emulated engines run the cost model's time scaled."""
    scale = cfg.engines.time_scale if cfg.engines.backend == "emulated" else 1.0
    return scale if scale > 0 else 1.0


def policy_context(cfg: PipelineConfig) -> PolicyContext:
    cost = CostModel.from_names(cfg.engines.gpu, cfg.engines.model, tp=cfg.engines.tp, ep=cfg.engines.ep)
    # an MoE engine under expert parallelism is a DP-attention group: KV of every rank
    return PolicyContext(cost=cost, slots=cfg.engines.slots, kv_capacity_tokens=cost.kv_capacity_tokens() * cost.ep,
                         interval_s=cfg.runtime.control_interval_s / time_unit(cfg))
