"""Multi-step runs whose decode lengths drift as a policy learns: can switching roles between steps
beat every fixed split, and by how much could it at best?

Each cell is a synchronous run of --steps steps of SWE trajectories whose decodes grow (or shrink)
geometrically to `decode_growth` times step 0's by the last step (`workload.decode_growth`). It is
run under colocated, every P:D split, prorsa with no prior and the oracle. "hindsight" is the best
fixed split chosen afresh for every step, knowing each step's time under each: the most any
between-step switching could gain over the best single split here.

Cells: the paper table's SWE MoE engines (8 engines of EP4, 256 trajectories a step) and
drivers.py's EP8 ones (8 engines of EP8, 256 a step).

    .venv/bin/python benchmarks/drift.py [--growths 0.25,4,8] [--steps 4] [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper import ENGINES, STATICS, save  # noqa: E402

ENGINE_SETS = ("paper-moe-ep4", "drivers-ep8")


def cell_config(engines: str, growth: float, steps: int):
    if engines == "paper-moe-ep4":
        from paper import config

        cfg = config("swe", "moe", "sync", 0)
    else:
        from drivers import config

        cfg = config("ep", 8, "sync")
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"steps": steps, "decode_growth": growth})})


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate

    engines, growth, steps, policy = job
    sim = simulate(cell_config(engines, growth, steps), policy)
    ends = [0.0] * steps
    for r in sim.recorder.trajectories:
        ends[r.spec.step] = max(ends[r.spec.step], r.end_s)
    return {"engines": engines, "growth": growth, "steps": steps, "policy": policy, "figure": sim.makespan_s,
            "per_step": [ends[0]] + [ends[k] - ends[k - 1] for k in range(1, steps)],
            "switches": sim.summary["role_switches"]}


def cell_summary(points: list[dict]) -> dict:
    fixed = {p["policy"]: p for p in points if p["policy"] not in ("prorsa", "oracle")}
    by = {p["policy"]: p for p in points}
    best = min(fixed, key=lambda k: fixed[k]["figure"])
    steps = points[0]["steps"]
    hindsight = [min(fixed, key=lambda k: fixed[k]["per_step"][s]) for s in range(steps)]
    hind_s = sum(fixed[k]["per_step"][s] for s, k in enumerate(hindsight))
    ref = fixed[best]["figure"]
    return {"best_fixed": best, "best_fixed_s": ref, "hindsight_splits": hindsight,
            "hindsight_vs_best": ref / hind_s, "prorsa_vs_best": ref / by["prorsa"]["figure"],
            "oracle_vs_best": ref / by["oracle"]["figure"], "prorsa_switches": by["prorsa"]["switches"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--growths", default="0.25,4,8")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--engines", default=",".join(ENGINE_SETS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/drift.json")
    args = ap.parse_args()
    try:
        growths = [float(g) for g in args.growths.split(",")]
    except ValueError:
        sys.exit(f"error: --growths: numbers, comma-separated; got {args.growths!r}")
    if args.steps < 2 or any(g <= 0 for g in growths):
        sys.exit("error: --steps must be >= 2 and every growth > 0")
    engine_sets = args.engines.split(",")
    if unknown := [e for e in engine_sets if e not in ENGINE_SETS]:
        sys.exit(f"error: --engines: unknown {unknown}; known: {list(ENGINE_SETS)}")
    cells = [(e, g) for e in engine_sets for g in growths]
    jobs = [(e, g, args.steps, p) for e, g in cells for p in ["colocated", *STATICS, "prorsa", "oracle"]]
    t0 = time.perf_counter()
    points = []
    with Pool(args.workers) as pool:
        for i, point in enumerate(pool.imap_unordered(run_point, jobs), 1):
            points.append(point)
            print(f"[{i}/{len(jobs)}] {point['engines']} x{point['growth']:g} {point['policy']}: "
                  f"{point['figure']:.1f} s", file=sys.stderr, flush=True)
    results = [{"engines": e, "growth": g, "steps": args.steps}
               | cell_summary([p for p in points if (p["engines"], p["growth"]) == (e, g)]) for e, g in cells]

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"decode lengths drifting over {args.steps} steps ({ENGINES} engines; > 1 beats the best "
                        "single fixed split)")
    for col in ("engines", "growth", "best fixed", "hindsight / best", "prorsa / best", "oracle / best", "switches"):
        table.add_column(col, justify="left" if col == "engines" else "right")
    for r in results:
        table.add_row(r["engines"], f"{r['growth']:g}", r["best_fixed"], f"{r['hindsight_vs_best']:.3f}",
                      f"{r['prorsa_vs_best']:.3f}", f"{r['oracle_vs_best']:.3f}", str(r["prorsa_switches"]))
    Console(width=160).print(table)
    save("drift.py", t0, results, points, args.out)


if __name__ == "__main__":
    main()
