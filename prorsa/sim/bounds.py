"""A makespan no policy can beat on a workload, so every result says how far it is from the limit.

    lower_bound(run) -> Bound      the larger of the two limits below, per sync step (summed) or
                                   over an async run of a fixed trajectory count

  critical path   the slowest trajectory alone on the cluster: each turn's prefill of its append on
                  its cached context, its decode one token a step at batch 1, and its tool call
  work            all prefill compute plus every decode token at its share of a full batch, spread
                  over every rank of every engine without a gap
  concurrency     (async) at most `concurrency` trajectories run at once, each for its critical path

Prefills are counted as compute alone (no step overhead, no weight reads) and decodes at the
engine's full batch, so both are below what any schedule pays. With per-role parallelism each
turn's prefill and decode take the cheaper of the layouts that may serve them (the role's own or
mixed), and work is counted in engine-seconds (an engine of ep ranks does ep ranks' work at once).
Tool latencies are in the run's body seconds (divided by its time unit, as the simulator does).
Engine groups of different sizes (engines.groups): every op takes the cheapest group's layout in
GPU-seconds (engine-seconds x its GPUs, at that group's slots), spread over every GPU of the run;
roles are not counted, so the bound is looser there but still one no split can beat.
With scheduling.tail_layout engines may merge into wider tensor-parallel layouts
(control/tail_layout.py), so every layout a merge may form counts too, in GPU-seconds like groups:
the critical path takes the widest when it is the fastest, and work never gets cheaper by it
(a merged engine keeps one engine's slots and spends all its GPUs on them).
"""

from __future__ import annotations

from dataclasses import dataclass

from prorsa.agent.trace import TrajectorySpec
from prorsa.agent.workload import Workload
from prorsa.control.tail_layout import TailLayout
from prorsa.costmodel import CostModel
from prorsa.rollout.context import RunContext


@dataclass(frozen=True)
class Bound:
    makespan_s: float  # the bound
    critical_path_s: float  # the longest single trajectory (sync: summed over steps)
    work_s: float  # total work over capacity (sync: summed over steps)


def _path_and_work(spec: TrajectorySpec, pre: list[CostModel], dec: list[CostModel], slots: int | dict,
                   unit: float, per_gpu: bool = False) -> tuple[float, float]:
    """The trajectory's critical path and its work in engine-seconds (`per_gpu`: GPU-seconds);
    `pre` and `dec` are the layouts that may prefill and decode, `slots` one engine's (or per layout)."""
    def size(c: CostModel) -> int:
        return c.tp * c.ep if per_gpu else 1

    def batch(c: CostModel) -> int:
        return max((slots[c.layout] if isinstance(slots, dict) else slots) // c.ep, 1)

    path = work = 0.0
    ctx = 0
    for turn in spec.turns:
        work += min(c.prefill_compute_time(turn.appended_tokens, ctx) / c.ep * size(c) for c in pre)
        ctx += turn.appended_tokens
        path += min(c.prefill_time([(turn.appended_tokens, ctx - turn.appended_tokens)]) for c in pre)
        path += min(float(c.decode_series(1, ctx, turn.decode_tokens).sum()) for c in dec)
        path += turn.tool_latency_s / unit
        mid = ctx + turn.decode_tokens / 2
        work += min(turn.decode_tokens * c.decode_token_time(mid, batch(c)) / c.ep * size(c) for c in dec)
        ctx += turn.decode_tokens
    return path, work


def lower_bound(run: RunContext) -> Bound:
    """The bound of a resolved pipeline (rollout/context.py resolve): its engines as the plan
    gives them (RunContext.engines)."""
    cfg, e, unit = run.cfg, run.cfg.engines, run.unit
    layouts = run.costs
    pre = list({c.layout: c for c in (layouts.prefill, layouts.mixed)}.values())
    dec = list({c.layout: c for c in (layouts.decode, layouts.mixed)}.values())

    spread = e.count  # what work is divided over: engines, or GPUs where engines differ in size
    slots: int | dict = e.slots
    per_gpu = not run.engines_alike
    if per_gpu:
        models = {s.costs.mixed.layout: s.costs.mixed for s in run.engines}
        pre = dec = list(models.values())
        slots = {}
        for s in run.engines:
            slots[s.costs.mixed.layout] = max(slots.get(s.costs.mixed.layout, 0), s.slots)
        spread = sum(s.costs.mixed.tp * s.costs.mixed.ep for s in run.engines)
    elif cfg.scheduling.tail_layout:
        tail = TailLayout(layouts.mixed, e.count, e.slots)
        wide = [tail.wide_cost(f) for f in tail.widths()]
        pre, dec = pre + wide, dec + wide
        slots = {c.layout: e.slots for c in (*pre, *dec)}
        spread, per_gpu = e.count * layouts.mixed.tp * layouts.mixed.ep, True

    def path_and_work(spec: TrajectorySpec) -> tuple[float, float]:
        return _path_and_work(spec, pre, dec, slots, unit, per_gpu=per_gpu)

    workload = Workload.from_config(cfg.workload, cfg.seed)
    w = cfg.workload
    if w.mode == "sync":
        total = paths = works = 0.0
        for step in range(w.steps):
            pw = [path_and_work(s) for s in workload.trajectories_for_step(step)]
            path, work = max(p for p, _ in pw), sum(x for _, x in pw) / spread
            total += max(path, work)
            paths += path
            works += work
        return Bound(total, paths, works)
    if w.trajectories is None:
        raise ValueError("a makespan bound needs a trajectory count (async runs bounded by duration have none)")
    pw = [path_and_work(workload.trajectory(i)) for i in range(w.trajectories)]
    path = max(p for p, _ in pw)
    work = sum(x for _, x in pw) / spread
    concurrency = sum(p for p, _ in pw) / w.concurrency
    return Bound(max(path, work, concurrency), path, work)
