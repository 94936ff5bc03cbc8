"""What a run's clock and policy are, from its pipeline; the same for the live body and the simulator.

    time_unit(cfg)        wall seconds per body second (emulated engines may run time-scaled)
    engine_costs(cfg)     RoleCosts: an engine's cost model in each role (engines.parallelism)
    policy_context(cfg)   the PolicyContext adaptive policies plan with
    workload_hint(cfg)    means over the first trajectories of cfg's workload (WorkloadHint)
    make_router(cfg, roles, clock[, hint])   the Router of a run: engine -> role, runtime's routing settings
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from prorsa.agent.workload import Workload
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.policy import PolicyContext, WorkloadHint
from prorsa.costmodel import CostModel, RoleCosts
from prorsa.roles import Role
from prorsa.rollout.placement import MoveCost
from prorsa.rollout.router import Router


def time_unit(cfg: PipelineConfig) -> float:
    """Wall seconds per body second: emulated engines run the cost model's time scaled."""
    scale = cfg.engines.time_scale if cfg.engines.backend == "emulated" else 1.0
    return scale if scale > 0 else 1.0


def engine_costs(cfg: PipelineConfig) -> RoleCosts:
    e = cfg.engines
    base = CostModel.from_names(e.gpu, e.model, tp=e.tp, ep=e.ep)
    if e.parallelism is None:
        return RoleCosts.uniform(base)
    # one model per distinct layout: roles laid out alike share it, so they never reshard
    models = {base.layout: base}
    for role in ("prefill", "decode", "mixed"):
        tp, ep = e.layout(role)
        if (tp, ep) not in models:
            models[tp, ep] = CostModel.from_names(e.gpu, e.model, tp=tp, ep=ep)
    return RoleCosts(*(models[e.layout(role)] for role in ("prefill", "decode", "mixed")))


def policy_context(cfg: PipelineConfig) -> PolicyContext:
    layouts = engine_costs(cfg)
    cost = layouts.mixed
    # an MoE engine under expert parallelism is a DP-attention group: KV of every rank
    return PolicyContext(cost=cost, slots=cfg.engines.slots, kv_capacity_tokens=cost.kv_capacity_tokens() * cost.ep,
                         interval_s=cfg.runtime.control_interval_s / time_unit(cfg), workload=workload_hint(cfg),
                         layouts=None if layouts.is_uniform else layouts)


def workload_hint(cfg: PipelineConfig, sample: int = 64) -> WorkloadHint:
    w = cfg.workload
    workload = Workload.from_config(w, cfg.seed)
    if w.mode == "sync":
        specs = workload.trajectories_for_step(0, first=sample)
        concurrency = w.prompts * w.group_size
    else:
        specs = [workload.trajectory(i) for i in range(sample)]
        concurrency = w.concurrency
    turns = [t for s in specs for t in s.turns]
    later = [t.appended_tokens for s in specs for t in s.turns[1:]]
    tools = [t.tool_latency_s for t in turns if not t.done]
    return WorkloadHint(
        concurrency=concurrency,
        prompt_tokens=float(np.mean([s.turns[0].appended_tokens for s in specs])),
        observation_tokens=float(np.mean(later)) if later else 0.0,
        decode_tokens=float(np.mean([t.decode_tokens for t in turns])),
        tool_s=float(np.mean(tools)) / time_unit(cfg) if tools else 0.0,
        turns=len(turns) / len(specs))


def make_router(cfg: PipelineConfig, roles: dict[str, Role], clock: Callable[[], float],
                hint: WorkloadHint | None = None) -> Router:
    """`clock`: the run's body seconds (live: wall seconds over time_unit); `hint`: the policy
    context's, so a sync run's step is not drawn once more for it."""
    e, r = cfg.engines, cfg.runtime
    move_cost = None
    if r.sticky_overload == "cost":  # priced as the mixed role's layout, as the allocator plans
        hint = hint or workload_hint(cfg)
        move_cost = MoveCost(engine_costs(cfg).mixed, e.slots, hint.decode_tokens)
    return Router(roles, overload=r.sticky_overload, local_prefill_tokens=r.local_prefill_tokens, slots=e.slots,
                  move_cost=move_cost, clock=clock)
