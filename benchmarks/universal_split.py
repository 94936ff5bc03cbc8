"""How much could switching roles gain over every fixed split, at most? A bound from fixed splits.

A run whose demand moves passes through phases, each a workload W_i. Under a fixed split s phase i
takes T_i(s); a policy that switches at each phase's start, for free, to its best split takes
at least sum_i T_i(best_i). For any one split u the best single split takes at most sum_i T_i(u)
<= max_i [T_i(u) / T_i(best_i)] x sum_i T_i(best_i). So on any sequence of these workloads, in any
proportions, switching gains at most

    regret(u*) = min over splits u of max over workloads i of T_i(u) / T_i(best_i)

over the best fixed split: the worst regret of the "universal" split u*. Each engine set is run
under a grid of workloads (every task family, synchronous with its own turn cap and with 2 turns
(prefill-heavy), asynchronous), each under colocated, every P:D and every P beside mixed engines.
Async figures are trajectories/s, taken as time per trajectory. The bound treats each phase as its
own run; demand that mixes within a step is itself a workload (drift.py measures those runs whole).

Engines: the paper table's MoE ones (8 engines of EP4) and drivers.py's EP8, EP16 and EP32 ones
(8 engines each). --reuse FILE keeps the points an earlier results file holds.

    .venv/bin/python benchmarks/universal_split.py [--engines paper-moe-ep4,drivers-ep8,drivers-ep16,drivers-ep32]
                                                   [--families swe,search,math-tir,terminal]
                                                   [--workers 2] [--out FILE] [--reuse FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper import STATICS, save, saved_points  # noqa: E402
from priors import BESIDE_MIXED  # noqa: E402
from progress import each_done  # noqa: E402

ENGINE_SETS = ("paper-moe-ep4", "drivers-ep8", "drivers-ep16", "drivers-ep32")
FAMILIES = ("swe", "search", "math-tir", "terminal")
# (mode, max_turns): the engine set's own turn cap (None), and two turns, where prompts dominate
SHAPES = (("sync", None), ("sync", 2), ("async", None))
SPLITS = ["colocated", *STATICS, *BESIDE_MIXED]


def config(engines: str, family: str, mode: str, turns: int | None):
    if engines == "paper-moe-ep4":
        from paper import config as base

        cfg = base(family, "moe", mode, 0)
    else:
        from drivers import config as base

        cfg = base("ep", int(engines.removeprefix("drivers-ep")), mode)
    update = {"family": family, "trace": None} | ({"max_turns": turns} if turns else {})
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update=update)})


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    engines, family, mode, turns, policy = job
    s = simulate(resolve(config(engines, family, mode, turns)), policy).summary
    return {"engines": engines, "family": family, "mode": mode, "turns": turns, "policy": policy,
            "time": s["makespan_s"] if mode == "sync" else 1.0 / s["trajectories_per_s"]}


def key(p: dict) -> tuple:
    return p["engines"], p["family"], p["mode"], p["turns"], p["policy"]


def summary(engines: str, points: list[dict]) -> dict:
    """The universal split of one engine set: the least worst regret over its workloads."""
    times: dict[tuple, dict[str, float]] = {}
    for p in points:
        if p["engines"] == engines:
            times.setdefault((p["family"], p["mode"], p["turns"]), {})[p["policy"]] = p["time"]
    regret = {u: max(t[u] / min(t.values()) for t in times.values()) for u in SPLITS}
    u = min(SPLITS, key=lambda s: (regret[s], SPLITS.index(s)))
    worst = max(times, key=lambda w: times[w][u] / min(times[w].values()))
    return {"engines": engines, "workloads": len(times), "universal": u, "regret": regret[u],
            "worst_workload": list(worst), "colocated_regret": regret["colocated"],
            "best": [[*w, min(t, key=t.get)] for w, t in times.items()], "regrets": regret}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default=",".join(ENGINE_SETS))
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/universal-split.json")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file: its points are kept")
    args = ap.parse_args()
    engine_sets, families = args.engines.split(","), args.families.split(",")
    if bad := [e for e in engine_sets if e not in ENGINE_SETS]:
        sys.exit(f"error: --engines: unknown {bad}; known: {list(ENGINE_SETS)}")
    if bad := [f for f in families if f not in FAMILIES]:
        sys.exit(f"error: --families: unknown {bad}; known: {list(FAMILIES)}")
    jobs = [(e, f, mode, turns, s) for e in engine_sets for f in families for mode, turns in SHAPES for s in SPLITS]
    kept = {key(p): p for p in saved_points(args.reuse, "universal_split.py")} if args.reuse else {}
    points = [kept[j] for j in jobs if j in kept]
    todo = [j for j in jobs if j not in kept]
    t0 = time.perf_counter()
    with Pool(args.workers) as pool:
        points += each_done(pool, run_point, todo,
                            lambda p: f"{p['engines']} {p['family']} {p['mode']} turns={p['turns']} {p['policy']}: "
                                      f"{p['time']:.2f} s")
    cells = [summary(e, points) for e in engine_sets]

    from rich.console import Console
    from rich.table import Table

    table = Table(title="the most switching could gain over every fixed split: the universal split's worst regret")
    for col in ("engines", "workloads", "universal split", "its worst regret", "worst workload", "colocated's"):
        table.add_column(col)
    for c in cells:
        table.add_row(c["engines"], str(c["workloads"]), c["universal"], f"{c['regret']:.3f}",
                      " ".join(map(str, c["worst_workload"])), f"{c['colocated_regret']:.3f}")
    Console(width=140).print(table)
    save("universal_split.py", t0, cells, points, args.out)


if __name__ == "__main__":
    main()
