"""Engines of different sizes (engines.groups) beside equal-sized ones, simulated: does a small
prefill pool beside wide DP-attention decode engines beat the best split of equal engines?

Cells: Qwen3-30B-A3B on H200s, 32 GPUs, SWE and math-tir, sync and async, every layout a ratio to
colocated EP8 engines. Every layout replays the same seeded workload. Equal-sized, at each width EP
(4, 8, 16): 32/EP engines of EP DP-attention ranks, colocated and every static split. Heterogeneous: a prefill pool of 1-GPU
engines or TP2 engines beside EP decode engines, the GPUs left over in narrower decode engines
(power-of-two widths, over which 128 experts spread evenly) so 32 are covered (and the 2-GPU pool with no remainder engine, fewer GPUs; each layout's count is
in the results). Every rank admits 32 sequences (an EP8 engine 256, a 1-GPU or TP2 engine 32), as
in drivers.py's EP sweep; the load is half its EP8 row's (32 GPUs, not 64): sync one step of 16
prompts x 8 samples, async 128 trajectories with 64 in flight, up to 12 turns. Heterogeneous
layouts run static (each group in its opening role).

--prorsa LAYOUT[;LAYOUT] (EP --eps' first): prorsa on those groups made flexible (every group may
also take mixed: a prefill engine co-batches decodes, a decode engine takes prefill chunks),
with no prior and with an earlier run's (the same cell and groups, seed + 1, colocated), against
every fixed split of the same flexible groups (k of a group's engines in its opening role, the
rest mixed), the best of them again under the same earlier run's prior (the router reads a prior
too), and the best equal-sized layout of --reuse (a results file of this script, same seed).

    .venv/bin/python benchmarks/groups.py [--families swe,math-tir] [--modes sync,async] [--eps 4,8,16]
                                          [--seed 0] [--workers 2] [--out FILE]
                                          [--prorsa LAYOUT --reuse FILE [--keep FILE]]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path
from progress import each_done

MODEL, GPU, RANK_SLOTS, GPUS = "qwen3-30b-a3b", "h200", 32, 32
POOLS = [(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2)]  # prefill engines x their GPUs (TP)


def _prefill(count: int, tp: int = 1) -> dict:
    return {"count": count, "roles": ["prefill"], "tp": tp, "ep": 1, "slots": RANK_SLOTS}


def _decode(count: int, ep: int) -> dict:
    return {"count": count, "roles": ["decode"], "tp": 1, "ep": ep, "slots": RANK_SLOTS * ep}


def layouts(ep: int) -> dict[str, list[dict]]:
    """Heterogeneous layouts beside engines of `ep` ranks: a prefill pool of 1-GPU or TP2 engines,
    EP`ep` decode engines on the GPUs left, and the remainder (if any) in narrower decode engines
    of power-of-two widths, so 32 GPUs are covered; and the 2-GPU pool with no remainder (fewer GPUs)."""
    out = {}
    for count, tp in POOLS:
        pool = count * tp
        wide, rest = divmod(GPUS - pool, ep)
        if wide == 0:
            continue
        # the remainder as decode engines of power-of-two widths: 128 experts spread evenly over each
        narrow = [1 << (r.bit_length() - 1) for r in _halves(rest)]
        name = f"P {count}x{'TP2' if tp == 2 else '1'} + D {wide}xEP{ep}" + "".join(f" + EP{w}" for w in narrow)
        out[name] = [_prefill(count, tp), _decode(wide, ep)] + [_decode(1, w) for w in narrow]
        if (count, tp) == (2, 1) and rest:
            out[f"P 2x1 + D {wide}xEP{ep}"] = [_prefill(2), _decode(wide, ep)]
    return out


def _halves(n: int) -> list[int]:
    """n as a sum of distinct powers of two, the largest first."""
    return [1 << b for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1]


def statics(ep: int) -> list[str]:
    n = GPUS // ep
    return [f"static:{p}:{n - p}" for p in range(1, n)]


def gpus(groups: list[dict] | None) -> int:
    return GPUS if groups is None else sum(g["count"] * g["tp"] * g["ep"] for g in groups)


def flexible(groups: list[dict], opening: tuple[int, ...] | None = None) -> list[dict]:
    """`groups` each free to take mixed too; `opening`: how many of each group's engines open in its
    own role, the rest mixed (a fixed split, as two groups of the same engines); None: all of them."""
    out = []
    for k, g in zip(opening or [g["count"] for g in groups], groups):
        own = {**g, "roles": [*g["roles"], "mixed"]}
        out += [{**own, "count": k}] if k else []
        out += [{**own, "count": g["count"] - k, "roles": ["mixed", *g["roles"]]}] if k < g["count"] else []
    return out


def fixed_splits(groups: list[dict]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(g["count"] + 1) for g in groups)))


def config(family: str, mode: str, seed: int, ep: int, layout: str | None, opening=None, prior=None):
    """`layout`: a name of layouts(ep), or None for engines of `ep` ranks alike; `opening`: a fixed
    split of the flexible groups (flexible()), "prorsa" for the flexible groups themselves."""
    from prorsa.config.pipeline import PipelineConfig

    engines = {"backend": "emulated", "gpu": GPU, "model": MODEL}
    if layout is None:
        engines |= {"count": GPUS // ep, "ep": ep, "slots": RANK_SLOTS * ep}
    elif opening is not None:
        engines |= {"groups": flexible(layouts(ep)[layout], None if opening == "prorsa" else opening)}
    else:
        engines |= {"groups": layouts(ep)[layout]}
    return PipelineConfig.model_validate({
        "name": f"groups-{family}-{mode}-ep{ep}", "seed": seed, "policy": "colocated" if layout is None else "static",
        "engines": engines,
        "workload": {"family": family, "mode": mode, "prompts": 16, "group_size": 8, "concurrency": 64,
                     "trajectories": 128, "max_turns": 12},
        "prior": prior,
    })  # fmt: skip


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    family, mode, seed, ep, layout, policy = job
    s = simulate(resolve(config(family, mode, seed, ep, layout)), policy).summary
    return {"family": family, "mode": mode, "seed": seed, "ep": ep, "layout": layout or "equal",
            "policy": policy, "gpus": gpus(layouts(ep).get(layout)),
            "figure": s["makespan_s"] if mode == "sync" else s["trajectories_per_s"], "sim_wall_s": s["sim_wall_s"]}


def flex_point(job: tuple) -> dict:
    """A fixed split of the flexible groups, or prorsa on them (with an earlier run as its prior:
    that run is made first, colocated, from seed + 1, in a folder of its own)."""
    import tempfile

    from prorsa.sim.run import simulate, write_run

    from prorsa.rollout.context import resolve

    family, mode, seed, ep, layout, opening, prior = job
    with tempfile.TemporaryDirectory() as folder:
        if prior == "earlier":
            write_run(simulate(resolve(config(family, mode, seed + 1, ep, layout, "prorsa")), "colocated"), Path(folder))
        cfg = config(family, mode, seed, ep, layout, opening, folder if prior == "earlier" else None)
        sim = simulate(resolve(cfg), "prorsa" if opening == "prorsa" else "static")
    s = sim.summary
    policy = policy_name(opening, prior)
    return {"family": family, "mode": mode, "seed": seed, "ep": ep, "layout": layout, "policy": policy,
            "figure": s["makespan_s"] if mode == "sync" else s["trajectories_per_s"], "switches": s["role_switches"],
            "sim_wall_s": s["sim_wall_s"]}


def policy_name(opening, prior) -> str:
    if opening == "prorsa":
        return f"prorsa ({prior} prior)"
    return "fixed " + ",".join(map(str, opening)) + (f" ({prior} prior)" if prior else "")


def best_fixed(points: list[dict], family: str, mode: str, layout: str) -> tuple[int, ...]:
    """The opening of the best fixed split (no prior) of one row."""
    fixed = [p for p in points if (p["family"], p["mode"], p["layout"]) == (family, mode, layout)
             and p["policy"].startswith("fixed") and "prior" not in p["policy"]]
    best = (min if mode == "sync" else max)(fixed, key=lambda p: p["figure"])
    return tuple(int(x) for x in best["policy"].removeprefix("fixed ").split(","))


def prorsa_summary(points: list[dict], reuse: dict, family: str, mode: str) -> dict:
    """One cell: prorsa's two runs, the best fixed split of the same flexible groups and the best
    equal-sized layout (the reuse file's), each as a ratio to colocated EP8 (> 1 faster)."""
    cell = next(c for c in reuse["cells"] if (c["family"], c["mode"]) == (family, mode))
    sync, base = mode == "sync", cell["colocated"]
    v = {p["policy"]: base / p["figure"] if sync else p["figure"] / base for p in points}
    fixed = max((k for k in v if k.startswith("fixed") and "prior" not in k), key=v.__getitem__)
    equal = cell["vs_colocated"][cell["best_equal"]]
    out = {"family": family, "mode": mode, "layout": points[0]["layout"], "colocated": base,
           "best_equal": cell["best_equal"], "equal": equal, "best_fixed": fixed, "fixed": v[fixed],
           "fixed_with_prior": v[f"{fixed} (earlier prior)"],
           "opening_static": v["fixed " + ",".join(str(g["count"]) for g in layouts(points[0]["ep"])[points[0]["layout"]])],
           "vs_colocated": v, "switches": {p["policy"]: p["switches"] for p in points}}
    for prior in ("none", "earlier"):
        r = v[f"prorsa ({prior} prior)"]
        out[prior] = {"ratio": r, "vs_fixed": r / v[fixed], "vs_equal": r / equal}
    return out


def main_prorsa(args, eps: list[int]) -> None:
    ep = eps[0]
    reuse = json.loads(Path(args.reuse).read_text())
    chosen = args.prorsa.split(";")
    if bad := [n for n in chosen if n not in layouts(ep)]:
        sys.exit(f"error: --prorsa: {bad[0]!r} is not a layout at EP{ep}; known: {'; '.join(layouts(ep))}")
    cells = [(f, md) for f in args.families.split(",") for md in args.modes.split(",")]
    jobs = [(f, md, args.seed, ep, n, "prorsa", prior) for f, md in cells for n in chosen for prior in ("none", "earlier")]
    jobs += [(f, md, args.seed, ep, n, o, None) for f, md in cells for n in chosen for o in fixed_splits(layouts(ep)[n])]
    # --keep: the fixed splits an earlier results file holds (same seed) are not simulated again
    kept = [p for p in json.loads(Path(args.keep).read_text())["points"]
            if p["policy"].startswith("fixed") and "prior" not in p["policy"] and p["seed"] == args.seed] if args.keep else []
    have = {(p["family"], p["mode"], p["layout"], p["policy"]) for p in kept}
    jobs = [j for j in jobs if j[5] == "prorsa" or (j[0], j[1], j[4], "fixed " + ",".join(map(str, j[5]))) not in have]
    t0 = time.perf_counter()
    with Pool(args.workers) as pool:
        points = kept + list(each_done(pool, flex_point, jobs, lambda p: f"{p['family']} {p['mode']} {p['layout']} "
                                       f"{p['policy']}: {p['figure']:.3f} ({p['sim_wall_s']:.0f} s)"))
    # the best fixed split of each row again, under the earlier run's prior (which the router reads too)
    with Pool(args.workers) as pool:
        points += list(each_done(pool, flex_point, [
            (f, md, args.seed, ep, n, best_fixed(points, f, md, n), "earlier") for f, md in cells for n in chosen],
            lambda p: f"{p['family']} {p['mode']} {p['layout']} {p['policy']}: {p['figure']:.3f}"))
    jobs = [(f, md, args.seed, ep, n, "prorsa", prior) for f, md in cells for n in chosen for prior in ("none", "earlier")]
    jobs += [(f, md, args.seed, ep, n, o, None) for f, md in cells for n in chosen for o in fixed_splits(layouts(ep)[n])]
    jobs += [(f, md, args.seed, ep, n, best_fixed(points, f, md, n), "earlier") for f, md in cells for n in chosen]
    # in job order, not the order they finished in: the results file and its table stay put
    order = {(j[0], j[1], j[4], policy_name(j[5], j[6])): i for i, j in enumerate(jobs)}
    points.sort(key=lambda p: order[p["family"], p["mode"], p["layout"], p["policy"]])
    results = [prorsa_summary([p for p in points if (p["family"], p["mode"], p["layout"]) == (f, md, n)], reuse, f, md)
               for f, md in cells for n in chosen]
    for r in results:
        print(f"{r['family']} {r['mode']} {r['layout']}: prorsa {r['none']['ratio']:.3f} (no prior), "
              f"{r['earlier']['ratio']:.3f} (earlier run); best fixed {r['best_fixed']} {r['fixed']:.3f}; "
              f"best equal {r['best_equal']} {r['equal']:.3f}")
    command = "python benchmarks/groups.py " + " ".join(f"'{a}'" if " " in a else a for a in sys.argv[1:])
    print(f"command: {command}  ({time.perf_counter() - t0:.0f} s)")
    Path(args.out).write_text(json.dumps({"command": command, "cells": results, "points": points}, indent=1) + "\n")


def name(p: dict) -> str:
    """A point's layout as the tables show it: `EP8 colocated`, `EP8 1:3`, or the heterogeneous name."""
    return p["layout"] if p["layout"] != "equal" else f"EP{p['ep']} {p['policy'].removeprefix('static:')}"


def wide_decode(groups: list[dict]) -> bool:
    """Every decode engine EP8 or wider: a small prefill pool beside wide decode engines only, no
    narrow remainder engine."""
    return all(g["ep"] >= 8 for g in groups if g["roles"] == ["decode"])


def cell_summary(points: list[dict], reference_ep: int) -> dict:
    """One family and mode over every width: each layout as a ratio to colocated engines of
    `reference_ep` ranks; the best equal-sized layout (any width, any split, colocated included),
    the best heterogeneous one, and the best whose decode engines are all wide."""
    sync = points[0]["mode"] == "sync"

    def ratio(fig: float, base: float) -> float:  # > 1: better than base
        return base / fig if sync else fig / base

    colocated = next(p["figure"] for p in points if p["policy"] == "colocated" and p["ep"] == reference_ep)
    v = {name(p): ratio(p["figure"], colocated) for p in points}
    equal = [name(p) for p in points if p["layout"] == "equal"]
    hetero = [p for p in points if p["layout"] != "equal"]
    wide = [name(p) for p in hetero if wide_decode(layouts(p["ep"])[p["layout"]])]
    best_equal, best_hetero, best_wide = (max(names, key=v.__getitem__) for names in
                                          (equal, [name(p) for p in hetero], wide))
    return {"reference": f"EP{reference_ep} colocated", "colocated": colocated, "vs_colocated": v,
            "gpus": {name(p): p["gpus"] for p in points}, "wide_decode": wide,
            "best_equal": best_equal, "best_hetero": best_hetero, "best_wide": best_wide,
            "hetero_vs_best_equal": v[best_hetero] / v[best_equal], "wide_vs_best_equal": v[best_wide] / v[best_equal]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="swe,math-tir")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--eps", default="4,8,16", help="expert-parallel widths of the equal-sized engines and the "
                    "heterogeneous layouts' decode engines")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/groups.json")
    ap.add_argument("--prorsa", metavar="LAYOUT", help="prorsa on these layouts made flexible (module docstring)")
    ap.add_argument("--reuse", metavar="FILE", help="with --prorsa: this script's results, for the equal-sized layouts")
    ap.add_argument("--keep", metavar="FILE", help="with --prorsa: an earlier --prorsa results file whose fixed "
                    "splits are kept (prorsa is run again)")
    args = ap.parse_args()
    eps = [int(e) for e in args.eps.split(",")]
    if bad := [e for e in eps if not 1 < e < GPUS or GPUS % e]:
        sys.exit(f"error: --eps: {bad[0]} does not split {GPUS} GPUs into two or more engines")
    if args.prorsa:
        if not args.reuse:
            sys.exit("error: --prorsa needs --reuse FILE (the equal-sized layouts to compare with)")
        return main_prorsa(args, eps)

    cells = [(f, md) for f in args.families.split(",") for md in args.modes.split(",")]
    jobs = [(f, md, args.seed, ep, None, p) for f, md in cells for ep in eps for p in ["colocated", *statics(ep)]]
    jobs += [(f, md, args.seed, ep, n, "static") for f, md in cells for ep in eps for n in layouts(ep)]
    t0 = time.perf_counter()
    points: list[dict] = []
    with Pool(args.workers) as pool:
        points.extend(each_done(pool, run_point, jobs, lambda p: f"{p['family']} {p['mode']} EP{p['ep']} {p['layout']} {p['policy']}: "
                  f"{p['figure']:.3f} ({p['sim_wall_s']:.0f} s)"))
    # in job order, not the order they finished in: the results file and its tables stay put
    order = {(f, md, ep, layout or "equal", policy): i for i, (f, md, _, ep, layout, policy) in enumerate(jobs)}
    points.sort(key=lambda p: order[p["family"], p["mode"], p["ep"], p["layout"], p["policy"]])
    reference = 8 if 8 in eps else eps[0]
    results = [{"family": f, "mode": md} | cell_summary([p for p in points if (p["family"], p["mode"]) == (f, md)],
                                                        reference) for f, md in cells]
    for r in results:
        v = r["vs_colocated"]
        print(f"{r['family']} {r['mode']} (vs {r['reference']}): best equal {r['best_equal']} {v[r['best_equal']]:.3f}, "
              f"best heterogeneous {r['best_hetero']} {v[r['best_hetero']]:.3f} "
              f"({r['hetero_vs_best_equal']:.3f} of the best equal), wide decode only {r['best_wide']} "
              f"{v[r['best_wide']]:.3f} ({r['wide_vs_best_equal']:.3f})")
    command = "python benchmarks/groups.py " + " ".join(sys.argv[1:])
    print(f"command: {command}  ({time.perf_counter() - t0:.0f} s)")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": command, "layouts": {f"EP{ep}": layouts(ep) for ep in eps},
                                "cells": results, "points": points}, indent=1) + "\n")


if __name__ == "__main__":
    main()
