"""prorsa with a wrong model: the engines keep the true cost model, the policy plans (its fluid model
and every rehearsal) with one whose prefill (compute) and decode (memory) throughputs are off by
0.8x or 1.25x, each alone and crossed, against the best fixed split of the same cell.

Cells: the paper table's MoE cells (benchmarks/paper.py: 8 engines of Qwen3-30B-A3B at EP4 on
H200, one step of 32 x 8 or 256 trajectories 128 in flight, up to 12 turns), no prior. Fixed
splits: colocated, every P:D and every P beside mixed engines; they do not depend on the policy's
model, so each is simulated once. With --steps 3 a synchronous run has three steps, and the policy
calibrates its model between them (control/calibration.py). Seed 0 is the tuning set's (the
constants were chosen on it); other seeds are held out, and so are other engine counts (--engines:
the same load on fewer or more engines, every fixed split of them) and other EP widths (--ep W).

--ep W: every engine a DP-attention group of W ranks instead of 4, 32 slots a rank (32 W an engine),
and the load scaled with the ranks as drivers.py's ep and ep-wide factors scale it, so that every rank
carries the paper's load: 8 W prompts x 8 (64 W trajectories a synchronous step), 32 W in flight and
64 W trajectories asynchronously. At W = 4 that is the paper's cell (32 prompts, 128 in flight, 256
trajectories, 128 slots); W = 1 is one H200 an engine holding the whole model (no all-to-all), as
drivers.py's EP1 row.

    .venv/bin/python benchmarks/model_error.py [--families swe,search,math-tir,terminal]
        [--modes sync,async] [--steps 1] [--seeds 0] [--engines 8] [--ep 4] [--errors default]
        [--workers 2] [--out FILE]
        [--reuse FILE --rerun prorsa:math-tir,...]

--reuse keeps the points an earlier results file holds and simulates only those it lacks and those
--rerun names (POLICY, or POLICY:FAMILY for one family's), after a change that moves only them.

Virtual-time results, deterministic; the figure is prorsa's over the best fixed split's (> 1:
faster; sync: makespan, async: trajectories per second).
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool

from paper import config, save, saved_points
from progress import each_done

ENGINES = 8
EP = 4  # the paper's MoE width: paper.py's MODELS["moe"]


def fixed_splits(engines: int) -> list[str]:
    """Colocated, every P:D and every P beside mixed engines."""
    return ["colocated", *(f"static:{p}:{engines - p}" for p in range(1, engines)),
            *(f"static:{p}:0:{engines - p}" for p in range(1, engines))]


FIXED = fixed_splits(ENGINES)
ERRORS = ["exact", "prefill=0.8", "prefill=1.25", "decode=0.8", "decode=1.25", "prefill=0.8,decode=0.8",
          "prefill=0.8,decode=1.25", "prefill=1.25,decode=0.8", "prefill=1.25,decode=1.25"]


def _config(family: str, mode: str, seed: int, steps: int, engines: int = ENGINES, ep: int | None = None):
    cfg = config(family, "moe", mode, seed)
    if mode == "sync" and steps > 1:
        cfg = cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"steps": steps})})
    if engines != ENGINES:
        cfg = cfg.model_copy(update={"engines": cfg.engines.model_copy(update={"count": engines})})
    if ep not in (None, EP):  # the paper's load a rank, at ep ranks an engine (drivers.py's ep factor)
        w = cfg.workload
        cfg = cfg.model_validate(cfg.model_dump() | {
            "engines": cfg.engines.model_dump() | {"ep": ep, "slots": cfg.engines.slots // EP * ep},
            "workload": w.model_dump() | {"prompts": w.prompts // EP * ep, "concurrency": w.concurrency // EP * ep,
                                          "trajectories": w.trajectories // EP * ep}})
    return cfg


def run_point(job: tuple) -> dict:
    from prorsa.costmodel.misfit import ModelScale
    from prorsa.sim.run import simulate

    family, mode, seed, steps, policy, error, engines, ep = job
    scale = None if error == "exact" else ModelScale.parse(error)
    s = simulate(_config(family, mode, seed, steps, engines, ep), policy, model_error=scale).summary
    point = {"family": family, "mode": mode, "seed": seed, "steps": steps, "engines": engines}
    if ep is not None:  # without --ep a point is written as before --ep (the paper's width, not named)
        point["ep"] = ep
    return point | {"policy": policy, "error": error,
            "figure": s["makespan_s"] if mode == "sync" else s["trajectories_per_s"],
            "switches": s["role_switches"], "sim_wall_s": s["sim_wall_s"]}


def cell_summary(points: list[dict]) -> dict:
    sync = points[0]["mode"] == "sync"
    fixed = {p["policy"]: p["figure"] for p in points if p["policy"] != "prorsa"}
    best = (min if sync else max)(fixed, key=fixed.get)

    def ratio(fig: float) -> float:  # > 1: better than the best fixed split
        return fixed[best] / fig if sync else fig / fixed[best]

    prorsa = {p["error"]: p for p in points if p["policy"] == "prorsa"}
    return {"best_fixed": best, "best_figure": fixed[best], "colocated": fixed["colocated"],
            "prorsa_vs_best": {e: round(ratio(p["figure"]), 4) for e, p in prorsa.items()},
            "switches": {e: p["switches"] for e, p in prorsa.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="swe,search,math-tir,terminal")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--steps", type=int, default=1, help="synchronous steps per run (calibration acts between them)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--engines", type=int, default=ENGINES, help="engines in every cell (the paper's: 8)")
    ap.add_argument("--ep", help=f"EP ranks an engine, comma-separated widths (the paper's: {EP}); 32 slots "
                                 "and the paper's load a rank; recorded in the results when given")
    ap.add_argument("--errors", default="default", help="';'-separated model scales, e.g. 'exact;decode=1.25'")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/model-error.json")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file: its points are kept")
    ap.add_argument("--rerun", default="", help="with --reuse: POLICY or POLICY:FAMILY simulated again")
    args = ap.parse_args()
    from prorsa.costmodel.misfit import ModelScale

    errors = ERRORS if args.errors == "default" else args.errors.split(";")
    if args.engines < 2:
        sys.exit(f"error: --engines: at least 2, not {args.engines}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        widths = [None] if args.ep is None else [int(w) for w in args.ep.split(",")]
        if any(w is not None and w < 1 for w in widths):
            raise ValueError(f"--ep: widths of at least 1, not {args.ep}")
        for e in errors:
            e == "exact" or ModelScale.parse(e)
    except ValueError as err:
        sys.exit(f"error: {err}")
    n = args.engines
    cells = [(f, m, s, w) for w in widths for s in seeds for f in args.families.split(",")
             for m in args.modes.split(",") if m == "sync" or args.steps == 1]
    jobs = [(f, m, s, args.steps, p, "exact", n, w) for f, m, s, w in cells for p in fixed_splits(n)]
    jobs += [(f, m, s, args.steps, "prorsa", e, n, w) for f, m, s, w in cells for e in errors]
    t0 = time.perf_counter()
    rerun = set(filter(None, args.rerun.split(",")))
    points = [p for p in (saved_points(args.reuse, "model_error.py") if args.reuse else [])
              if p["policy"] not in rerun and f"{p['policy']}:{p['family']}" not in rerun]

    def key(p: dict) -> tuple:  # files made before --engines hold the paper's 8, before --ep its EP4
        return (p["family"], p["mode"], p["seed"], p["steps"], p["policy"], p["error"], p.get("engines", ENGINES),
                p.get("ep", EP))

    def job_key(j: tuple) -> tuple:
        return *j[:7], EP if j[7] is None else j[7]

    have = {key(p) for p in points}
    wanted = {job_key(j) for j in jobs}
    points = [p for p in points if key(p) in wanted]
    jobs = [j for j in jobs if job_key(j) not in have]
    with Pool(args.workers) as pool:
        points += each_done(pool, run_point, jobs, lambda p: f"{p['family']} {p['mode']} seed {p['seed']} "
                            + (f"EP{p['ep']} " if "ep" in p else "") + f"{p['policy']} ({p['error']}): {p['figure']:.3f}")
    results = [{"family": f, "mode": m, "seed": s, "steps": args.steps, "engines": n} | ({} if w is None else {"ep": w})
               | cell_summary([p for p in points
                               if (p["family"], p["mode"], p["seed"], p.get("ep", EP)) == (f, m, s, w or EP)])
               for f, m, s, w in cells]
    for e in errors:
        low = min(results, key=lambda r: r["prorsa_vs_best"][e])
        print(f"{e:>26}: lowest prorsa / best fixed {low['prorsa_vs_best'][e]:.3f} "
              f"({low['family']} {low['mode']} seed {low['seed']}" + (f" EP{low['ep']})" if "ep" in low else ")"))
    save("model_error.py", t0, results, points, args.out)


if __name__ == "__main__":
    main()
