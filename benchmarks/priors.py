"""What prorsa is told, and what it costs: the paper table's cells under three priors, against
every fixed split and the oracle.

    none     prorsa starts all-mixed and learns the workload from its own turns; in a multi-step
             run each step after the first opens on what the steps before observed
    earlier  `prior:` an earlier run of the same cell (another seed, colocated): what
             `prorsa run --prior RUN_DIR` gives
    wrong    `prior:` an earlier run of another family (swe <- math-tir, search <- swe,
             math-tir <- search): a prior that misleads

The oracle opens on the run's own means and forecasts from its true future (the simulator alone can
give it). Fixed splits: colocated and every P:D of 8 engines. Cells as benchmarks/paper.py; with
--steps N every cell is a synchronous run of N steps (async cells are left out).

    .venv/bin/python benchmarks/priors.py [--families swe,search,math-tir] [--steps 1] [--workers 2]
                                          [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper import ENGINES, STATICS, config, save  # noqa: E402

WRONG = {"swe": "math-tir", "search": "swe", "math-tir": "search", "terminal": "swe"}
PRIORS = ("none", "earlier", "wrong")


def cell_config(family: str, model: str, mode: str, seed: int, steps: int, prior: str | None = None):
    cfg = config(family, model, mode, seed)
    return cfg.model_copy(update={"prior": prior, "workload": cfg.workload.model_copy(update={"steps": steps})})


def make_prior(job: tuple) -> tuple:
    """An earlier run: the same cell drawn from another seed, under colocated, written as a run."""
    from prorsa.sim.run import simulate, write_run

    family, model, mode, seed, folder = job
    write_run(simulate(cell_config(family, model, mode, seed, 1), "colocated"), Path(folder))
    return job


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate

    family, model, mode, seed, steps, policy, prior_name, prior_dir = job
    s = simulate(cell_config(family, model, mode, seed, steps, prior_dir), policy).summary
    return {"family": family, "model": model, "mode": mode, "steps": steps, "policy": policy, "prior": prior_name,
            "figure": s["makespan_s"] if mode == "sync" else s["trajectories_per_s"],
            "switches": s["role_switches"]}


def cell_summary(points: list[dict]) -> dict:
    sync = points[0]["mode"] == "sync"
    fixed = {p["policy"]: p["figure"] for p in points if p["prior"] == "-"}
    best = (min if sync else max)(fixed, key=fixed.__getitem__)

    def vs_best(fig: float) -> float:  # > 1: better than the best fixed split
        return fixed[best] / fig if sync else fig / fixed[best]

    adaptive = {(p["policy"], p["prior"]): p for p in points if p["prior"] != "-"}
    return {"best_fixed": best, "best_fixed_figure": fixed[best], "colocated_vs_best": vs_best(fixed["colocated"]),
            "prorsa_vs_best": {pr: vs_best(adaptive["prorsa", pr]["figure"]) for pr in PRIORS},
            "prorsa_switches": {pr: adaptive["prorsa", pr]["switches"] for pr in PRIORS},
            "oracle_vs_best": vs_best(adaptive["oracle", "own"]["figure"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="swe,search,math-tir")
    ap.add_argument("--models", default="dense,moe")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--steps", type=int, default=1, help="synchronous steps per run (> 1: sync cells only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/priors.json")
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("error: --steps: at least 1")
    families = args.families.split(",")
    if unknown := [f for f in families if f not in WRONG]:
        sys.exit(f"error: --families: unknown {unknown}; known: {sorted(WRONG)}")
    modes = args.modes.split(",") if args.steps == 1 else ["sync"]
    cells = [(f, m, md) for f in families for m in args.models.split(",") for md in modes]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Pool(args.workers) as pool:
        # an earlier run of each cell's family, and of the family that misleads it
        wanted = {(f, m, md) for f, m, md in cells} | {(WRONG[f], m, md) for f, m, md in cells}
        folder = {key: str(Path(tmp) / "-".join(key)) for key in wanted}
        list(pool.imap_unordered(make_prior, [(*key, args.seed + 1, folder[key]) for key in wanted]))
        jobs = []
        for f, m, md in cells:
            base = (f, m, md, args.seed, args.steps)
            jobs += [(*base, p, "-", None) for p in ["colocated", *STATICS]]
            jobs.append((*base, "oracle", "own", None))
            jobs += [(*base, "prorsa", "none", None), (*base, "prorsa", "earlier", folder[f, m, md]),
                     (*base, "prorsa", "wrong", folder[WRONG[f], m, md])]
        points = []
        for i, point in enumerate(pool.imap_unordered(run_point, jobs), 1):
            points.append(point)
            print(f"[{i}/{len(jobs)}] {point['family']} {point['model']} {point['mode']} {point['policy']} "
                  f"({point['prior']}): {point['figure']:.3f}", file=sys.stderr, flush=True)
    results = []
    for f, m, md in cells:
        mine = [p for p in points if (p["family"], p["model"], p["mode"]) == (f, m, md)]
        results.append({"family": f, "model": m, "mode": md, "steps": args.steps} | cell_summary(mine))

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"prorsa / the best fixed split under three priors ({ENGINES} engines, {args.steps} step(s); "
                        "> 1 beats every fixed split)")
    for col in ("family", "model", "mode", "best fixed", "none", "earlier", "wrong", "oracle", "switches n/e/w"):
        table.add_column(col, justify="left" if col in ("family", "model", "mode") else "right")
    for r in results:
        v = r["prorsa_vs_best"]
        table.add_row(r["family"], r["model"], r["mode"], r["best_fixed"], *(f"{v[p]:.3f}" for p in PRIORS),
                      f"{r['oracle_vs_best']:.3f}", "/".join(str(r["prorsa_switches"][p]) for p in PRIORS))
    Console(width=160).print(table)
    save("priors.py", t0, results, points, args.out)


if __name__ == "__main__":
    main()
