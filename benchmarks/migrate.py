"""Migration during a tool call (scheduling.migrate), simulated, over seeds.

As a turn's decode ends, the router may pick another engine for the trajectory's next turn and
warm it with the context while the tool runs (Router.relocate): the move then costs no recompute
on the trajectory's path, only what the warm-up makes the other engine's turns wait. For the sync
cells of benchmarks/tail.py (every paper family on dense and MoE engines, `drivers.py --factor
turns` at EP16, two cells with 8 slots an engine where turns queue), colocated and prorsa, with
migrate off and on: makespan over several workload seeds (a sync step's end is a handful of
trajectories, so one seed is one draw), the per-seed ratio off / on (> 1: migration shortened the
step), and how many turns migrated. Virtual time: deterministic, independent of the machine's load.

    .venv/bin/python benchmarks/migrate.py [--seeds 4] [--workers 2] [--out benchmarks/results/migrate.json]
        [--reuse FILE --rerun prorsa:dense,...]

--reuse FILE keeps an earlier results file's points and simulates only those it lacks and those
--rerun names (POLICY, or POLICY:MODEL for one engine model's: prorsa:dense).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from paper import rerun_names, saved_points
from progress import each_done

sys.path.insert(0, str(Path(__file__).parent))

POLICIES = ["colocated", "prorsa"]


def run(job: tuple) -> dict:
    import tail
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    cell, policy, migrate, seed = job
    cfg = tail.config(cell, "none", seed=seed)
    cfg = cfg.model_validate(cfg.model_dump() | {"scheduling": {"migrate": migrate}})
    s = simulate(resolve(cfg), policy).summary
    return {"cell": list(cell), "policy": policy, "migrate": migrate, "seed": seed,
            "makespan_s": s["makespan_s"], "migrated": s["turns_migrated"], "turns": s["turns"]}


def summarise(cell: tuple, policy: str, points: list[dict]) -> dict:
    import tail

    by = {(p["migrate"], p["seed"]): p for p in points}
    seeds = sorted({p["seed"] for p in points})
    ratios = [by[False, s]["makespan_s"] / by[True, s]["makespan_s"] for s in seeds]
    return {"cell": list(cell), "label": tail.label(list(cell)), "policy": policy, "seeds": seeds,
            "off_s": [by[False, s]["makespan_s"] for s in seeds], "on_s": [by[True, s]["makespan_s"] for s in seeds],
            "ratios": ratios, "median_ratio": statistics.median(ratios),
            "migrated_share": sum(by[True, s]["migrated"] for s in seeds) / sum(by[True, s]["turns"] for s in seeds)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/migrate.json")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file: its points are kept")
    ap.add_argument("--rerun", default="", help="with --reuse: POLICY or POLICY:MODEL simulated again")
    args = ap.parse_args()
    import tail
    from rich.console import Console
    from rich.table import Table

    todo = [c for c in tail.cells(async_too=False)]
    jobs = [(c, p, m, s) for c in todo for p in POLICIES for m in (False, True) for s in range(args.seeds)]
    t0 = time.perf_counter()
    rerun = set(filter(None, args.rerun.split(",")))
    saved = saved_points(args.reuse, "migrate.py") if args.reuse else []
    kept = {(tuple(p["cell"]), p["policy"], p["migrate"], p["seed"]): p for p in saved
            if not rerun_names(rerun, p["policy"], p["cell"][2])}
    points: list[dict] = [kept[j] for j in jobs if j in kept]
    jobs = [j for j in jobs if j not in kept]
    with Pool(args.workers) as pool:
        points.extend(each_done(pool, run, jobs, lambda p: f"{tail.label(p['cell'])} {p['policy']} migrate {p['migrate']} "
                  f"seed {p['seed']}: {p['makespan_s']:.2f} s"))
    rows = [summarise(c, p, [x for x in points if tuple(x["cell"]) == c and x["policy"] == p])
            for c in todo for p in POLICIES]
    table = Table(title=f"migration during a tool call: makespan off / on (> 1: migration shortened it), "
                        f"seeds 0-{args.seeds - 1}")
    for col in ("cell", "policy", "median off / on", "range", "turns migrated"):
        table.add_column(col, justify="left" if col in ("cell", "policy") else "right")
    for r in rows:
        table.add_row(r["label"], r["policy"], f"{r['median_ratio']:.3f}",
                      f"{min(r['ratios']):.3f}-{max(r['ratios']):.3f}", f"{100 * r['migrated_share']:.1f}%")
    Console(width=160).print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "command": "python benchmarks/migrate.py " + " ".join(sys.argv[1:]),
        "wall_s": round(time.perf_counter() - t0, 1), "rows": rows, "points": points}, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
