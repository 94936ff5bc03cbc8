"""Partial rollouts with overlapped steps under every fixed split and under prorsa, in the simulator.

With `partial_rollout.overlap`, the next step's groups start as this step's become whole, so while
a step's tail decodes, its freed slots take the next step's first prefills: the demand a fixed
split was chosen for turns over mid-step, and a policy that forecasts it may move engines there.
Each mode of benchmarks/partial_rollout.py (the same cells, workload `coding-agent`, 4 steps of 32
prompts x 8, a 5 s weight update between steps) runs under colocated, every P:D, every P beside
mixed engines and prorsa (no prior); the figure is trained trajectories per second, prorsa's over
the best fixed split's.

    .venv/bin/python benchmarks/overlap_split.py [--models moe] [--modes partial:0.25,overlap:0.25]
        [--workers 1] [--out benchmarks/results/overlap-split.json]
    .venv/bin/python benchmarks/overlap_split.py --models dense --out benchmarks/results/overlap-split-dense.json

--reuse FILE keeps an earlier results file's points and simulates only those it lacks and the
policies --rerun names (e.g. prorsa, after a change to it).
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool

from model_error import fixed_splits
from paper import save, saved_points
from partial_rollout import MODELS, _over_sample, run_point
from progress import each_done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="moe")
    ap.add_argument("--modes", default="partial:0.25,overlap:0.25")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/overlap-split.json")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file: its points are kept")
    ap.add_argument("--rerun", default="", help="with --reuse: policies simulated again")
    args = ap.parse_args()
    models, modes = args.models.split(","), args.modes.split(",")
    if unknown := [m for m in models if m not in MODELS]:
        sys.exit(f"error: --models: {unknown[0]!r}: expected {' or '.join(MODELS)}")
    if bad := [m for m in modes if not _over_sample(m)]:
        sys.exit(f"error: --modes: {bad[0]!r}: expected partial:X, cut:X or overlap:X (X >= 0)")
    t0 = time.perf_counter()
    jobs = [(m, md, args.prompts, args.steps, args.seed, None, policy) for m in models for md in modes
            for policy in [*fixed_splits(MODELS[m][1]), "prorsa"]]
    rerun = set(filter(None, args.rerun.split(",")))
    kept = {(p["model"], p["mode"], p["policy"]): p for p in (saved_points(args.reuse, "overlap_split.py")
                                                             if args.reuse else []) if p["policy"] not in rerun}
    points = [kept[j[0], j[1], j[6]] for j in jobs if (j[0], j[1], j[6]) in kept]
    jobs = [j for j in jobs if (j[0], j[1], j[6]) not in kept]
    with Pool(args.workers) as pool:
        points += each_done(pool, run_point, jobs, lambda p: f"{p['model']} {p['mode']} {p['policy']}: "
                            f"{p['trained_per_s']:.4f} trained/s")
    cells = []
    for m in models:
        for md in modes:
            by = {p["policy"]: p for p in points if (p["model"], p["mode"]) == (m, md)}
            fixed = {k: p["trained_per_s"] for k, p in by.items() if k != "prorsa"}
            best = max(fixed, key=fixed.get)
            cells.append({"model": m, "mode": md, "best_fixed": best, "best_trained_per_s": fixed[best],
                          "colocated_trained_per_s": fixed["colocated"],
                          "prorsa_trained_per_s": by["prorsa"]["trained_per_s"],
                          "prorsa_vs_best": round(by["prorsa"]["trained_per_s"] / fixed[best], 4),
                          "prorsa_vs_colocated": round(by["prorsa"]["trained_per_s"] / fixed["colocated"], 4),
                          "switches": by["prorsa"]["switches"]})
            c = cells[-1]
            print(f"{m} {md}: best fixed {best} {fixed[best]:.4f}, prorsa {c['prorsa_trained_per_s']:.4f} "
                  f"({c['prorsa_vs_best']:.3f} of it, {c['switches']} switches)")
    save("overlap_split.py", t0, cells, points, args.out)


if __name__ == "__main__":
    main()
