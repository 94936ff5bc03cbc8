"""The allocator's step against the number of engines: the split search beside pricing every split.

For each engine count and model (dense: Qwen3-8B on one H200 an engine; MoE: Qwen3-30B-A3B, a
DP-attention group of 4 H200s an engine) it builds seeded random states (demand proportional to the
engines, every role present, engines busy to different degrees, a few locked) and times
`Allocator.plan` with the default split search and with every split priced, as CPU seconds (the
machine is shared; wall time would count the neighbours). It stores the median step, the splits
each priced, whether the two plans were equal on every state, and the step's share of the control
interval (runtime.control_interval_s, 1 s by default; the goal is under 5% at 1,024 engines).
Past --exhaustive-max engines pricing every split is not run: its time is extrapolated from the
largest count run, in proportion to the number of splits.

    .venv/bin/python benchmarks/allocator_scale.py [--engines 8,64,128,512,1024] [--states 3]
                                                   [--repeats 3] [--exhaustive-max 1024]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODELS = {"dense": ("qwen3-8b", 1, 32), "moe": ("qwen3-30b-a3b", 4, 128)}  # profile, ep, slots an engine


def state(n: int, model: str, seed: int):
    """A random control-interval state of n engines: (capacity, forecast, engines, locked)."""
    import numpy as np

    from prorsa.control.allocator import Capacity
    from prorsa.control.forecast import Forecast
    from prorsa.costmodel import CostModel
    from prorsa.loads import EngineLoad
    from prorsa.roles import Role

    name, ep, slots = MODELS[model]
    cap = Capacity.from_cost(CostModel.from_names("h200", name, ep=ep), slots=slots)
    rng = np.random.default_rng(seed)
    bins, scale = 8, n * ep
    append = float(rng.choice([200, 1000, 4000]))
    turns = rng.uniform(0.5, 3.0) * scale * rng.uniform(0.5, 1.5, bins)
    seqs = rng.uniform(4, 14) * scale * rng.uniform(0.7, 1.3, bins)
    context = float(rng.choice([4000, 12000]))
    fc = Forecast(start_s=0.0, bin_s=0.5, prefill_tokens_per_s=turns * append, prefill_turns_per_s=turns,
                  decode_seqs=seqs, kv_tokens=seqs * context, backlog_tokens=float(rng.uniform(0, 4)) * append * scale,
                  backlog_turns=float(rng.uniform(0, 4)) * scale, prefill_prefix_tokens=context,
                  decode_tokens_per_turn=float(rng.choice([150, 400])), decode_tps_per_seq=float(rng.uniform(30, 90)),
                  decode_remaining_tokens=float(rng.uniform(50, 300)), live=int(seqs.mean()))
    roles = [(Role.PREFILL, Role.DECODE, Role.MIXED)[k] for k in rng.choice(3, n, p=rng.dirichlet([2, 2, 2]))]
    engines = [EngineLoad(f"engine-{i}", role, int(rng.integers(0, 4)), int(rng.integers(0, slots)),
                          int(rng.integers(0, 20 * context)), cap.kv_capacity_tokens)
               for i, role in enumerate(roles)]
    locked = {e.engine_id for e in engines if rng.random() < 0.1}
    return cap, fc, engines, locked


def timed_plans(alloc, st, repeats: int) -> tuple[float, object, int]:
    """Median CPU seconds of alloc.plan on state `st`, the plan, and the splits it priced."""
    import prorsa.control.allocator as allocator

    cap, fc, engines, locked = st
    priced = []
    score = allocator.score

    def counting(*args, **kwargs):
        priced.append(len(args[2]))
        return score(*args, **kwargs)

    allocator.score = counting
    try:
        plan = alloc.plan(fc, engines, locked)
    finally:
        allocator.score = score
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        alloc.plan(fc, engines, locked)
        times.append(time.process_time() - t0)
    return statistics.median(times), plan, sum(priced)


def _net(plan) -> float:
    return plan.cost_goal + 2.0 * plan.switch_cost  # Allocator's default hysteresis


def measure(n: int, model: str, states: int, repeats: int, exhaustive: bool) -> dict:
    from prorsa.control.allocator import Allocator, splits
    from prorsa.control.split_search import SplitSearch

    splits(n)  # built once and cached, as the first interval of a run does
    row = {"engines": n, "model": model, "splits": (n + 1) * (n + 2) // 2, "states": states,
           "search_ms": [], "search_priced": [], "exhaustive_ms": [], "same_plan": [],
           "same_moves": [], "net_search_vs_every": []}
    for seed in range(states):
        st = state(n, model, seed)
        t, plan, priced = timed_plans(Allocator(st[0]), st, repeats)
        row["search_ms"].append(round(t * 1e3, 2))
        row["search_priced"].append(priced)
        if exhaustive:
            t, full, _ = timed_plans(Allocator(st[0], search=SplitSearch(exact_side=n)), st, 1)
            row["exhaustive_ms"].append(round(t * 1e3, 2))
            row["same_plan"].append(plan == full)
            row["same_moves"].append(plan.targets == full.targets and plan.goal == full.goal)
            # the allocator's objective for the goal each chose (cost + hysteresis x switch cost)
            row["net_search_vs_every"].append(round(_net(plan) / _net(full), 4) if _net(full) else 1.0)
        every = (f", every split {row['exhaustive_ms'][-1]} ms, same plan {row['same_plan'][-1]}, "
                 f"same moves {row['same_moves'][-1]}, net {row['net_search_vs_every'][-1]}") if exhaustive else ""
        print(f"{model} {n} engines, state {seed}: search {row['search_ms'][-1]} ms ({priced} splits){every}",
              flush=True)
    return row


def main(args) -> None:
    from prorsa.config.pipeline import RuntimeConfig

    interval = RuntimeConfig().control_interval_s
    sizes = [int(x) for x in args.engines.split(",")]
    rows = [measure(n, model, args.states, args.repeats, n <= args.exhaustive_max)
            for model in args.models.split(",") for n in sizes]
    for model in args.models.split(","):  # extrapolate every split's time past the largest count run
        run = [r for r in rows if r["model"] == model and r["exhaustive_ms"]]
        for r in rows:
            if r["model"] == model and not r["exhaustive_ms"] and run:
                ref = run[-1]
                r["exhaustive_ms_extrapolated"] = round(statistics.median(ref["exhaustive_ms"]) * r["splits"] / ref["splits"], 1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"command": "python benchmarks/allocator_scale.py " + " ".join(sys.argv[1:]),
           "date": datetime.date.today().isoformat(), "commit": commit,
           "machine": f"{platform.machine()}, shared 2-core", "control_interval_s": interval,
           "goal_share": 0.05, "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="8,64,128,512,1024")
    ap.add_argument("--models", default="dense,moe")
    ap.add_argument("--states", type=int, default=3, help="random states per engine count")
    ap.add_argument("--repeats", type=int, default=3, help="timed plans per state (median)")
    ap.add_argument("--exhaustive-max", type=int, default=1024, help="price every split up to this many engines")
    ap.add_argument("--out", default="benchmarks/results/allocator-scale.json")
    main(ap.parse_args())
