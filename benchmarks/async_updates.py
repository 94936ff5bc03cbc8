"""prorsa on asynchronous MoE rollouts whose trainer publishes weights on a clock: each update stalls
the engines and empties every prefix cache, so each trajectory's next turn prefills its whole
context again. No prior; against colocated, every P:D and every P beside mixed engines.

Cells: 4 engines of Qwen3-30B-A3B at EP8 on H200 (256 slots each), 256 trajectories in flight,
1024 in all, 3 s updates:
    mix            SWE and math-tir, half each, an update every 30 s
    coding-agent   the recorded coding agent's family (agent/families.py), every 60 s
Seed 0 of `mix` is the tuning cell (ASYNC_OPENING_WINDOWS in control/opening.py was chosen on
it); every other seed and the coding-agent cells are held out.

    .venv/bin/python benchmarks/async_updates.py [--cells mix,coding-agent] [--seeds 0,1,2]
        [--workers 2] [--out FILE]

Virtual-time results, deterministic; the figure is trajectories per second, and prorsa's over the
best fixed split's (> 1: faster).
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool

from paper import save
from progress import each_done

ENGINES = 4
FIXED = ["colocated", *(f"static:{p}:{ENGINES - p}" for p in range(1, ENGINES)),
         *(f"static:{p}:0:{ENGINES - p}" for p in range(1, ENGINES))]
CELLS = {"mix": ({"mix": {"swe": 0.5, "math-tir": 0.5}}, 30.0),
         "coding-agent": ({"family": "coding-agent"}, 60.0)}


def config(cell: str, seed: int):
    from prorsa.config.pipeline import PipelineConfig

    family, every = CELLS[cell]
    return PipelineConfig.model_validate({
        "name": f"async-updates-{cell}", "seed": seed, "policy": "colocated",
        "engines": {"backend": "emulated", "count": ENGINES, "slots": 256, "gpu": "h200",
                    "model": "qwen3-30b-a3b", "ep": 8},
        "workload": {"mode": "async", "concurrency": 256, "trajectories": 1024, "weight_update_s": 3.0,
                     "weight_update_every_s": every, **family},
    })  # fmt: skip


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    cell, seed, policy = job
    s = simulate(resolve(config(cell, seed)), policy).summary
    return {"cell": cell, "seed": seed, "policy": policy, "figure": s["trajectories_per_s"],
            "prefix_hit_rate": s["prefix_hit_rate"], "switches": s["role_switches"], "sim_wall_s": s["sim_wall_s"]}


def cell_summary(points: list[dict]) -> dict:
    fixed = {p["policy"]: p["figure"] for p in points if p["policy"] != "prorsa"}
    best = max(fixed, key=fixed.get)
    (prorsa,) = [p for p in points if p["policy"] == "prorsa"]
    return {"best_fixed": best, "best_figure": fixed[best], "colocated": fixed["colocated"],
            "prorsa": prorsa["figure"], "prorsa_vs_best": round(prorsa["figure"] / fixed[best], 4),
            "prorsa_vs_colocated": round(prorsa["figure"] / fixed["colocated"], 4),
            "switches": prorsa["switches"],
            "sim_cost_vs_colocated": round(prorsa["sim_wall_s"] / max(
                p["sim_wall_s"] for p in points if p["policy"] == "colocated"), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="mix,coding-agent")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/async-updates.json")
    args = ap.parse_args()
    names = args.cells.split(",")
    if unknown := [c for c in names if c not in CELLS]:
        sys.exit(f"error: --cells: no cell {', '.join(unknown)} (cells: {', '.join(CELLS)})")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        sys.exit(f"error: --seeds: not a list of integers: {args.seeds}")
    cells = [(c, s) for c in names for s in seeds]
    jobs = [(c, s, p) for c, s in cells for p in ("prorsa", *FIXED)]  # prorsa first: the longest
    t0 = time.perf_counter()
    with Pool(args.workers) as pool:
        points = list(each_done(pool, run_point, jobs, lambda p: f"{p['cell']} seed {p['seed']} {p['policy']}: "
                           f"{p['figure']:.4f}"))
    results = [{"cell": c, "seed": s} | cell_summary([p for p in points if (p["cell"], p["seed"]) == (c, s)])
               for c, s in cells]
    for r in results:
        print(f"{r['cell']:>13} seed {r['seed']}: prorsa / best fixed ({r['best_fixed']}) {r['prorsa_vs_best']:.3f}, "
              f"/ colocated {r['prorsa_vs_colocated']:.3f}, {r['switches']} switches")
    save("async_updates.py", t0, results, points, args.out)


if __name__ == "__main__":
    main()
