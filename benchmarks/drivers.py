"""What drives the gain of disaggregation, one factor at a time, in the simulator: SWE, sync and
async, 8 engines, policies colocated, static 1:7 / 2:6 / 3:5 (the best kept), prorsa and the
oracle (prorsa's allocator fed the true future).

    --factor ep            Qwen3-30B-A3B with expert parallelism 1, 2, 4, 8, 16: an engine is a
                           DP-attention group of ep ranks stepping at its slowest rank (the
                           paper's effect (a)); slots and trajectories grow with ep, so every rank
                           carries the same load
    --factor tokens        every appended and decoded token count x 0.5, 1, 2, 4 (prefill length
                           and context length together), MoE EP4
    --factor prefix-cache  ideal vs lru, Qwen3-32B on H100s, whose KV memory is tight at SWE contexts
    --factor turns         trajectories capped at 4, 8, 16, 24 turns, MoE EP16: the longer they run,
                           the longer the tail of a synchronous step, where few trajectories are left
    --factor weight-update 0 or 10 s weight updates (sync: between 3 steps; async: every 32 finished
                           trajectories, rollout going on) that invalidate every prefix cache, MoE EP4

    .venv/bin/python benchmarks/drivers.py --factor ep [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from multiprocessing import Pool
from pathlib import Path

POLICIES = ["colocated", "static:1:7", "static:2:6", "static:3:5", "prorsa", "oracle"]
FACTORS = {
    "ep": [1, 2, 4, 8, 16],
    "tokens": [0.5, 1.0, 2.0, 4.0],
    "prefix-cache": ["ideal", "lru"],
    "weight-update": [0.0, 10.0],
    "turns": [4, 8, 16, 24],
}


def config(factor: str, value, mode: str):
    from prorsa.config.pipeline import PipelineConfig

    ep, model, gpu, scale, cache, slots, update, steps = 4, "qwen3-30b-a3b", "h200", 1.0, "ideal", 32, 0.0, 1
    turns = 12
    if factor == "turns":
        ep, turns = 16, value
    elif factor == "weight-update":
        update, steps = value, 3
    elif factor == "ep":
        ep = value
    elif factor == "tokens":
        scale = value
    elif factor == "prefix-cache":
        ep, model, gpu, cache, slots = 1, "qwen3-32b", "h100", value, 32
    return PipelineConfig.model_validate({
        "name": f"drivers-{factor}-{value}-{mode}", "seed": 0, "policy": "colocated",
        "engines": {"backend": "emulated", "count": 8, "slots": slots * ep, "gpu": gpu, "model": model,
                    "ep": ep, "prefix_cache": cache},
        "workload": {"family": "swe", "mode": mode, "prompts": 4 * ep, "group_size": 8, "steps": steps,
                     "concurrency": 16 * ep, "trajectories": 32 * ep * steps, "max_turns": turns, "token_scale": scale,
                     "weight_update_s": update},
    })  # fmt: skip


def run(job: tuple) -> tuple:
    from prorsa.sim.run import simulate

    factor, value, mode, policy = job
    s = simulate(config(factor, value, mode), policy).summary
    fig = s["makespan_s"] if mode == "sync" else s["trajectories_per_s"]
    return factor, value, mode, policy, fig, s["prefix_hit_rate"], s["role_switches"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factor", choices=sorted(FACTORS), default="ep")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    modes = args.modes.split(",")
    jobs = [(args.factor, v, m, p) for v in FACTORS[args.factor] for m in modes for p in POLICIES]
    with Pool(args.workers) as pool:
        res = pool.map(run, jobs, chunksize=1)
    table = Table(title=f"what drives the gain: {args.factor} (SWE, 8 engines; ratios vs colocated, > 1 faster)")
    for col in (args.factor, "mode", "colocated", "best static", "prorsa", "oracle", "prefix hit coloc / best / prorsa"):
        table.add_column(col, justify="right")
    rows = []
    for v in FACTORS[args.factor]:
        for m in modes:
            by = {r[3]: r for r in res if r[1] == v and r[2] == m}
            sync = m == "sync"

            def ratio(p):
                return by["colocated"][4] / by[p][4] if sync else by[p][4] / by["colocated"][4]

            statics = [p for p in POLICIES if p.startswith("static")]
            best = max(statics, key=ratio)
            unit = "s" if sync else "/s"
            hits = " / ".join(f"{by[p][5]:.0%}" if by[p][5] is not None else "-" for p in ("colocated", best, "prorsa"))
            table.add_row(str(v), m, f"{by['colocated'][4]:.2f} {unit}", f"{ratio(best):.3f} ({best[7:]})",
                          f"{ratio('prorsa'):.3f}", f"{ratio('oracle'):.3f}", hits)
            rows.append({"value": v, "mode": m, "best_static": best, "best_vs_colocated": ratio(best),
                         "prorsa_vs_colocated": ratio("prorsa"), "oracle_vs_colocated": ratio("oracle")})
    Console(width=140).print(table)
    command = "python benchmarks/drivers.py " + " ".join(sys.argv[1:])
    print(f"command: {command}")
    out = Path("benchmarks/results") / f"drivers-{args.factor}.json"
    out.write_text(json.dumps({"command": command, "rows": rows, "points": res}, indent=1) + "\n")


if __name__ == "__main__":
    main()
