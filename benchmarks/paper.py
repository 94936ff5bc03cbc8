"""The paper table in the simulator: prorsa against colocated, every static split (the best in
hindsight marked), reactive and the oracle, with the makespan lower bound, for the four agentic
workloads x a dense and an MoE model x synchronous and asynchronous RL.

Cells: 8 engines each. Dense: Qwen3-8B, one H200 per engine, 32 slots. MoE: Qwen3-30B-A3B with
expert parallelism 4 (an engine is a DP-attention group of 4 H200s, 32 slots a rank), 32 GPUs.
Sync: one step of 32 prompts x 8 samples; async: 256 trajectories, 128 in flight. Up to 12 turns.
Every policy replays the same workload; the figures are virtual-time results, deterministic.

    .venv/bin/python benchmarks/paper.py [--families swe,search,math-tir,terminal] [--workers 2]
                                         [--sticky-overload cost|2|none] [--restart-s S] [--out FILE]
                                         [--reuse FILE --rerun prorsa,oracle]

--restart-s switches engines by restart (engines.role_switch: restart, restart_s S): a switch
between prefill and decode or mixed empties the engine and holds it S seconds, and the policies
price it so; the policies that never switch run alike either way (reuse their points).

--reuse keeps the points an earlier results file holds (same seed and cells) and simulates only the
points it lacks and the policies --rerun names (after a change to the forecaster, say).
Every script's --reuse (paper, drivers, priors, drift, model_error) simulates a reused point of
each mode again first and refuses a file it no longer reproduces: the simulator changed since it
was made.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from progress import each_done

MODELS = {"dense": ("qwen3-8b", 1, 32), "moe": ("qwen3-30b-a3b", 4, 128)}  # profile, ep, slots
ENGINES = 8
STATICS = [f"static:{p}:{ENGINES - p}" for p in range(1, ENGINES)]
ADAPTIVE = ["reactive", "prorsa", "oracle"]


def config(family: str, model: str, mode: str, seed: int, sticky_overload: float | str | None = "cost",
           restart_s: float | None = None):
    from prorsa.config.pipeline import PipelineConfig

    name, ep, slots = MODELS[model]
    restart = {} if restart_s is None else {"role_switch": "restart", "restart_s": restart_s}
    return PipelineConfig.model_validate({
        "name": f"paper-{family}-{model}-{mode}", "seed": seed, "policy": "colocated",
        "engines": {"backend": "emulated", "count": ENGINES, "slots": slots, "gpu": "h200", "model": name, "ep": ep,
                    **restart},
        "workload": {"family": family, "mode": mode, "prompts": 32, "group_size": 8, "concurrency": 128,
                     "trajectories": 256, "max_turns": 12},
        "runtime": {"sticky_overload": sticky_overload},
    })  # fmt: skip


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    family, model, mode, seed, overload, restart_s, policy = job
    s = simulate(resolve(config(family, model, mode, seed, overload, restart_s)), policy).summary
    return {"family": family, "model": model, "mode": mode, "seed": seed, "policy": policy,
            "figure": s["makespan_s"] if mode == "sync" else s["trajectories_per_s"],
            "switches": s["role_switches"], "prefix_hit_rate": s["prefix_hit_rate"],
            "recomputed_tokens": s["recomputed_tokens"], "sim_wall_s": s["sim_wall_s"]}


def cell_summary(points: list[dict], bound_s: float | None) -> dict:
    sync = points[0]["mode"] == "sync"
    by = {p["policy"]: p for p in points}

    def ratio(fig: float, base: float) -> float:  # > 1: better than base
        return base / fig if sync else fig / base

    pick = min if sync else max
    best = pick(STATICS, key=lambda p: by[p]["figure"])
    col = by["colocated"]["figure"]
    ref = pick(col, by[best]["figure"])
    out = {"colocated": col, "best_static": best, "bound_s": bound_s,
           "vs_colocated": {p: ratio(by[p]["figure"], col) for p in ["colocated", best, *ADAPTIVE]},
           "prorsa_vs_best": ratio(by["prorsa"]["figure"], ref),
           "oracle_vs_best": ratio(by["oracle"]["figure"], ref),
           "switches": {p: by[p]["switches"] for p in ADAPTIVE},
           "prefix_hit_rate": {p: by[p]["prefix_hit_rate"] for p in ["colocated", best, "prorsa"]}}
    if sync and bound_s:
        out["colocated_vs_bound"] = bound_s / col
        out["prorsa_vs_bound"] = bound_s / by["prorsa"]["figure"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="swe,search,math-tir,terminal")
    ap.add_argument("--models", default="dense,moe")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/paper.json")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file: its points are kept")
    ap.add_argument("--rerun", default="", help="policies simulated again although FILE holds them "
                                                "(POLICY:MODEL for one model's, e.g. prorsa:moe)")
    ap.add_argument("--sticky-overload", default="cost", metavar="X|cost|none",
                    help="runtime.sticky_overload of every run (cost: a turn leaves its engines when the move "
                         "pays for its recompute; X: past X times the least-loaded engine's turns; none: never)")
    ap.add_argument("--restart-s", type=float, default=None, metavar="S",
                    help="switch engines by restart, each holding its engine S seconds (engines.restart_s)")
    args = ap.parse_args()
    from prorsa.config.pipeline import sticky_overload_from

    try:
        overload = sticky_overload_from(args.sticky_overload)
    except ValueError as e:
        sys.exit(f"error: --sticky-overload: {e}")

    from rich.console import Console
    from rich.table import Table

    from prorsa.sim.bounds import lower_bound
    from prorsa.rollout.context import resolve

    cells = [(f, m, md) for f in args.families.split(",") for m in args.models.split(",")
             for md in args.modes.split(",")]
    jobs = [(f, m, md, args.seed, overload, args.restart_s, p) for f, m, md in cells
            for p in ["colocated", *STATICS, *ADAPTIVE]]
    t0 = time.perf_counter()
    points = reused_points(args.reuse, set(filter(None, args.rerun.split(","))), args.seed)
    have = {(p["family"], p["model"], p["mode"], p["policy"]) for p in points}
    points = [p for p in points if (p["family"], p["model"], p["mode"]) in cells]
    jobs = [j for j in jobs if (j[0], j[1], j[2], j[6]) not in have]
    # reused colocated points simulated again (one a mode): a file the simulator moved past is refused
    for probe in first_each([p for p in points if p["policy"] == "colocated"], lambda p: p["mode"]):
        again = run_point((probe["family"], probe["model"], probe["mode"], args.seed, overload, args.restart_s,
                           probe["policy"]))
        reuse_holds(args.reuse, f"{probe['family']} {probe['model']} {probe['mode']} {probe['policy']}",
                    probe["figure"], again["figure"])
    with Pool(args.workers) as pool:
        points.extend(each_done(pool, run_point, jobs, lambda p: f"{p['family']} {p['model']} {p['mode']} {p['policy']}: "
                  f"{p['figure']:.3f}"))
    results = []
    for f, m, md in cells:
        cfg = config(f, m, md, args.seed, overload)
        bound = lower_bound(resolve(cfg)).makespan_s if md == "sync" or cfg.workload.trajectories else None
        summary = cell_summary([p for p in points if (p["family"], p["model"], p["mode"]) == (f, m, md)], bound)
        results.append({"family": f, "model": m, "mode": md} | summary)

    table = Table(title="prorsa vs colocated, static splits, reactive and the oracle (simulated; ratios vs "
                        "colocated, > 1 is faster; sync: makespan, async: trajectories/s)")
    for col in ("family", "model", "mode", "colocated", "best static", "reactive", "prorsa", "oracle",
                "prorsa / best", "switches", "bound / colocated"):
        table.add_column(col, justify="left" if col in ("family", "model", "mode") else "right")
    misses = []
    for r in results:
        v = r["vs_colocated"]
        unit = "s" if r["mode"] == "sync" else "/s"
        table.add_row(r["family"], r["model"], r["mode"], f"{r['colocated']:.2f} {unit}",
                      f"{v[r['best_static']]:.3f} ({r['best_static'][7:]})", f"{v['reactive']:.3f}",
                      f"{v['prorsa']:.3f}", f"{v['oracle']:.3f}", f"{r['prorsa_vs_best']:.3f}",
                      str(r["switches"]["prorsa"]), f"{r.get('colocated_vs_bound', float('nan')):.3f}")
        if r["prorsa_vs_best"] < 0.97:
            misses.append(f"{r['family']} {r['model']} {r['mode']}: prorsa {r['prorsa_vs_best']:.3f} of the best")
        if v[r["best_static"]] >= 1.1 and v["prorsa"] < 1.1:
            misses.append(f"{r['family']} {r['model']} {r['mode']}: a static split gains >= 1.1x, prorsa {v['prorsa']:.3f}")
    Console(width=160).print(table)
    print("goal (prorsa >= 0.97 of the better of colocated and the best static; >= 1.1x where a static split "
          "is): " + ("met in every cell" if not misses else "missed in " + "; ".join(misses)))
    save("paper.py", t0, results, points, args.out)


def reused_points(path: str | None, rerun: set[str], seed: int) -> list[dict]:
    """The points of an earlier results file worth keeping: its seed's, of policies not in `rerun`
    (POLICY, or POLICY:MODEL for one model's: prorsa:moe)."""
    if not path:
        return []
    try:
        points = json.loads(Path(path).read_text())["points"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: --reuse {path}: not a paper.py results file ({e})")
    return [p for p in points if p["seed"] == seed and p["policy"] not in rerun
            and f"{p['policy']}:{p['model']}" not in rerun]


def save(script: str, t0: float, cells: list[dict], points: list[dict], out: str) -> None:
    """The results file: the command that made it, the cells' summaries and every point."""
    command = f"python benchmarks/{script} " + " ".join(sys.argv[1:])
    print(f"command: {command}  ({time.perf_counter() - t0:.0f} s)")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": command, "cells": cells, "points": points}, indent=1) + "\n")


def saved_points(path: str, script: str) -> list:
    """The points of an earlier results file (--reuse); exits with one line naming it if it is not one."""
    try:
        return json.loads(Path(path).read_text())["points"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: --reuse {path}: not a {script} results file ({e})")


def first_each(items, kind) -> list:
    """The first of `items` of each kind (`kind(item)`), in order: the reused points simulated
    again, one a mode, since a change to the simulator may move async runs and leave sync ones."""
    seen: dict = {}
    for item in items:
        seen.setdefault(kind(item), item)
    return list(seen.values())


def reuse_holds(path: str, point: str, saved: float, fresh: float) -> None:
    """Exits naming `point` when a reused file's point no longer simulates to the figure it holds:
    the simulator changed since the file was made, and its points would be mixed with today's."""
    if saved != fresh:
        sys.exit(f"error: --reuse {path}: its point {point} simulates to {fresh:.6g} now, the file holds "
                 f"{saved:.6g}; the simulator changed since it was made: run without --reuse")


RERUN_HELP = ("with --reuse: policies simulated again although FILE holds them "
              "(POLICY:PRIOR for one prior's points, e.g. prorsa:none; POLICY:MODEL for one model's, prorsa:dense)")


def rerun_names(rerun, policy: str, *qualifiers) -> bool:
    """Whether --rerun names `policy` or POLICY:Q for one of its points' `qualifiers` (a prior, a
    model, a family, a factor's value)."""
    return policy in rerun or any(f"{policy}:{q}" in rerun for q in qualifiers)


def rerun_asks(point: dict, rerun) -> bool:
    """Whether --rerun names this saved point's policy, its POLICY:PRIOR or its POLICY:MODEL."""
    return rerun_names(rerun, point["policy"], point.get("prior", "-"), point.get("model", "-"))


if __name__ == "__main__":
    main()
