"""A makespan no policy can beat on a workload, so every result says how far it is from the limit.

    lower_bound(cfg) -> Bound      the larger of the two limits below, per sync step (summed) or
                                   over an async run of a fixed trajectory count

  critical path   the slowest trajectory alone on the cluster: each turn's prefill of its append on
                  its cached context, its decode one token a step at batch 1, and its tool call
  work            all prefill compute plus every decode token at its share of a full batch, spread
                  over every rank of every engine without a gap
  concurrency     (async) at most `concurrency` trajectories run at once, each for its critical path

Prefills are counted as compute alone (no step overhead, no weight reads) and decodes at the
engine's full batch, so both are below what any schedule pays. Tool latencies are in the run's
body seconds (divided by its time unit, as the simulator does).
"""

from __future__ import annotations

from dataclasses import dataclass

from prorsa.agent.trace import TrajectorySpec
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import PipelineConfig
from prorsa.costmodel import CostModel
from prorsa.rollout.context import time_unit


@dataclass(frozen=True)
class Bound:
    makespan_s: float  # the bound
    critical_path_s: float  # the longest single trajectory (sync: summed over steps)
    work_s: float  # total work over capacity (sync: summed over steps)


def _path_and_work(spec: TrajectorySpec, cost: CostModel, batch: int, unit: float) -> tuple[float, float]:
    path = work = 0.0
    ctx = 0
    for turn in spec.turns:
        pre = cost.prefill_compute_time(turn.appended_tokens, ctx)
        ctx += turn.appended_tokens
        alone = float(cost.decode_series(1, ctx, turn.decode_tokens).sum())
        mid = ctx + turn.decode_tokens / 2
        path += cost.prefill_time([(turn.appended_tokens, ctx - turn.appended_tokens)]) + alone \
            + turn.tool_latency_s / unit
        work += pre + turn.decode_tokens * cost.decode_token_time(mid, batch)
        ctx += turn.decode_tokens
    return path, work


def lower_bound(cfg: PipelineConfig) -> Bound:
    e = cfg.engines
    cost = CostModel.from_names(e.gpu, e.model, tp=e.tp, ep=e.ep)
    ranks = e.count * cost.ep  # an EP engine is ep DP-attention ranks; cost times one rank
    batch = max(e.slots // cost.ep, 1)
    unit = time_unit(cfg)
    workload = Workload.from_config(cfg.workload, cfg.seed)
    w = cfg.workload
    if w.mode == "sync":
        total = paths = works = 0.0
        for step in range(w.steps):
            pw = [_path_and_work(s, cost, batch, unit) for s in workload.trajectories_for_step(step)]
            path, work = max(p for p, _ in pw), sum(x for _, x in pw) / ranks
            total += max(path, work)
            paths += path
            works += work
        return Bound(total, paths, works)
    if w.trajectories is None:
        raise ValueError("a makespan bound needs a trajectory count (async runs bounded by duration have none)")
    pw = [_path_and_work(workload.trajectory(i), cost, batch, unit) for i in range(w.trajectories)]
    path = max(p for p, _ in pw)
    work = sum(x for _, x in pw) / ranks
    concurrency = sum(p for p, _ in pw) / w.concurrency
    return Bound(max(path, work, concurrency), path, work)
