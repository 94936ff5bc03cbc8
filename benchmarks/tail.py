"""The tail: trajectory-level scheduling against the makespan lower bound (simulated).

A synchronous step ends with its slowest trajectory. For every sync cell of the paper table and
of `drivers.py --factor turns`, each scheduling mechanism (pipeline `scheduling:`) alone and
together, under colocated engines (no role switching) and prorsa (switching):

    none        every turn alike, first come (today)
    priority    engines admit turns by send time minus predicted remaining decode seconds
    spread      the router prices a move by the trajectory's predicted remainder
    both
    priority-oracle   priority keyed by the true remainder, read off the workload (simulator only)
    tail-layout       as a step's last trajectories remain, idle engines merge into wider TP layouts
                      for them (sync cells only: an async run keeps every engine busy)
    all               both and tail-layout
    priority-prior    priority with an earlier run of the cell (seed 1, colocated) as `prior:`: its
                      turn counts and decodes from the start (colocated only, where a prior moves
                      nothing but the scheduler)

Reported: makespan over the lower bound (sim/bounds.py: the slowest trajectory alone, or all the
work at full batch over every GPU, whichever is larger; with tail-layout the bound also lets the
slowest trajectory run on the widest layout a merge may form, `bound_tail_s`) and, against every fixed split with and
without the mechanisms, whether prediction beats them all. The paper cells admit every trajectory
at once (256 on 8 engines x 32 slots), so two `contended` cells give each engine 8 slots, where
turns queue for admission. Async cells are listed beside (trajectories/s, higher is better).
Virtual time: deterministic, independent of the machine's load.

    .venv/bin/python benchmarks/tail.py [--workers 2] [--out benchmarks/results/tail.json] [--add]

`--add` keeps the points already in --out and runs only the missing ones (a new mechanism).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path
from progress import each_done

sys.path.insert(0, str(Path(__file__).parent))

MECHANISMS = {"none": {}, "priority": {"priority": True}, "spread": {"spread": True},
              "both": {"priority": True, "spread": True},
              # priority on the true remainder (scheduling.oracle): what prediction leaves on the table
              "priority-oracle": {"priority": True, "oracle": True},
              "tail-layout": {"tail_layout": True},
              "all": {"priority": True, "spread": True, "tail_layout": True}}
SYNC_ONLY = ("tail-layout", "all")  # merges wait for a step's tail, which an async run has not
POLICIES = ["colocated", "prorsa"]
STATICS = [f"static:{p}:{8 - p}" for p in range(1, 8)]
FAMILIES = ["swe", "search", "math-tir", "terminal"]
TURNS = [4, 8, 16, 24]
CONTENDED_SLOTS = 8


def cells(async_too: bool) -> list[tuple]:
    """(source, family, model, variant, mode): variant is the turn cap (drivers) or the slots."""
    out = [("paper", f, m, 0, "sync") for f in FAMILIES for m in ("dense", "moe")]
    out += [("turns", "swe", "moe-ep16", t, "sync") for t in TURNS]
    out += [("contended", f, "dense", CONTENDED_SLOTS, "sync") for f in ("swe", "math-tir")]
    if async_too:
        out += [("paper", f, m, 0, "async") for f in FAMILIES for m in ("dense", "moe")]
    return out


def config(cell: tuple, mechanism: str, prior: str | None = None, seed: int = 0):
    import drivers
    import paper

    source, family, model, variant, mode = cell
    if source == "turns":
        cfg = drivers.config("turns", variant, mode)
    else:
        cfg = paper.config(family, model, mode, 0)
        if source == "contended":
            cfg = cfg.model_copy(update={"engines": cfg.engines.model_copy(update={"slots": variant})})
    scheduling = MECHANISMS["priority" if mechanism == "priority-prior" else mechanism]
    return cfg.model_validate(cfg.model_dump() | {"scheduling": scheduling, "prior": prior, "seed": seed})


def can_merge(cell: tuple) -> bool:
    """Whether any merge is possible: an EP16 group already spans two nodes, so the tail layout
    never fires there and its figures would repeat none's (not simulated)."""
    from prorsa.control.tail_layout import TailLayout
    from prorsa.rollout.context import engine_costs

    cfg = config(cell, "none")
    return bool(TailLayout(engine_costs(cfg).mixed, cfg.engines.count, cfg.engines.slots).widths())


def make_prior(job: tuple) -> None:
    """An earlier run of the cell: another seed, colocated, no scheduling, written as a run directory."""
    from prorsa.sim.run import simulate, write_run
    from prorsa.rollout.context import resolve

    cell, folder = job
    write_run(simulate(resolve(config(cell, "none", seed=1)), "colocated"), Path(folder))


def run(job: tuple) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    cell, mechanism, policy, prior = job
    s = simulate(resolve(config(cell, mechanism, prior)), policy).summary
    return {"cell": list(cell), "mechanism": mechanism, "policy": policy,
            "figure": s["makespan_s"] if cell[-1] == "sync" else s["trajectories_per_s"],
            "switches": s["role_switches"], "sim_wall_s": s["sim_wall_s"]}


def label(cell: list) -> str:
    source, family, model, variant, mode = cell
    extra = {"paper": "", "turns": f" turns {variant}", "contended": f" {variant} slots"}[source]
    return f"{family} {model}{extra} {mode}"


def summarise(cell: tuple, points: list[dict], bound_s: float | None, bound_tail_s: float | None = None) -> dict:
    by = {(p["policy"], p["mechanism"]): p["figure"] for p in points}
    sync = cell[-1] == "sync"
    pick = min if sync else max
    out = {"cell": list(cell), "label": label(list(cell)), "bound_s": bound_s, "bound_tail_s": bound_tail_s,
           "figures": {f"{p}/{m}": by[(p, m)] for p, m in by}}
    if sync and bound_s:
        # each figure over the bound of what it may do: a merged layout has its own, lower one
        out["over_bound"] = {f"{p}/{m}": by[(p, m)] / (bound_tail_s if m in SYNC_ONLY else bound_s) for p, m in by}
    statics = [s for s in STATICS if (s, "none") in by]
    if statics:
        best_none = pick(statics, key=lambda s: by[(s, "none")])
        best_both = pick(statics, key=lambda s: by[(s, "both")])
        fixed = pick(by[(best_none, "none")], by[("colocated", "none")])
        fixed_both = pick(by[(best_both, "both")], by[("colocated", "both")])
        ours = by[("prorsa", "both")]
        gain = (lambda a, b: b / a) if sync else (lambda a, b: a / b)  # > 1: ours is better
        out |= {"best_static": best_none, "best_static_both": best_both,
                "prorsa_both_vs_fixed": gain(ours, fixed), "prorsa_both_vs_fixed_both": gain(ours, fixed_both)}
        if all((s, "tail-layout") in by for s in statics) and ("prorsa", "tail-layout") in by:
            best_tail = pick(statics, key=lambda s: by[(s, "tail-layout")])
            fixed_tail = pick(by[(best_tail, "tail-layout")], by[("colocated", "tail-layout")])
            ours = by[("prorsa", "tail-layout")]
            out |= {"best_static_tail": best_tail, "prorsa_tail_vs_fixed": gain(ours, fixed),
                    "prorsa_tail_vs_fixed_tail": gain(ours, fixed_tail)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-async", action="store_true", help="sync cells only")
    ap.add_argument("--out", default="benchmarks/results/tail.json")
    ap.add_argument("--add", action="store_true", help="keep the points in --out, run only the missing ones")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    from prorsa.sim.bounds import lower_bound
    from prorsa.rollout.context import resolve

    todo = cells(not args.no_async)
    merges = {c: c[-1] == "sync" and can_merge(c) for c in todo}
    jobs = [(c, m, p, None) for c in todo for m in MECHANISMS for p in POLICIES
            if m not in SYNC_ONLY or merges[c]]
    # every fixed split with the mechanisms and without, where the question is whether prediction beats them
    jobs += [(c, m, s, None) for c in todo if c[-1] == "sync" for m in ("none", "both", "tail-layout") for s in STATICS
             if m not in SYNC_ONLY or merges[c]]
    t0 = time.perf_counter()
    points: list[dict] = []
    kept = json.loads(Path(args.out).read_text()) if args.add else None
    if kept is not None:
        points = kept["points"]
        have = {(tuple(p["cell"]), p["mechanism"], p["policy"]) for p in points}
        jobs = [j for j in jobs if (j[0], j[1], j[2]) not in have]
        todo_priors = [] if all((c, "priority-prior", "colocated") in have for c in todo) else todo
    else:
        todo_priors = todo
    tmp = tempfile.TemporaryDirectory()
    priors = {c: str(Path(tmp.name) / f"prior-{i}") for i, c in enumerate(todo_priors)}
    jobs += [(c, "priority-prior", "colocated", priors[c]) for c in todo_priors]
    with Pool(args.workers) as pool:
        pool.map(make_prior, list(priors.items()), chunksize=1)
        points.extend(each_done(pool, run, jobs, lambda p: f"{label(p['cell'])} {p['policy']} {p['mechanism']}: "
                  f"{p['figure']:.3f}"))
    rows = []
    tmp.cleanup()
    for c in todo:
        sync = c[-1] == "sync"
        bound = lower_bound(resolve(config(c, "none"))).makespan_s if sync else None
        bound_tail = lower_bound(resolve(config(c, "tail-layout"))).makespan_s if sync else None
        rows.append(summarise(c, [p for p in points if tuple(p["cell"]) == c], bound, bound_tail))

    table = Table(title="makespan over the lower bound (sync; lower is better) by scheduling mechanism")
    for col in ("cell", "bound s", *(f"{p} {m}" for p in POLICIES for m in MECHANISMS), "prorsa both / best fixed"):
        table.add_column(col, justify="left" if col == "cell" else "right")
    for r in rows:
        if "over_bound" not in r:
            continue
        o = r["over_bound"]
        table.add_row(r["label"], f"{r['bound_s']:.1f}", *(f"{o.get(f'{p}/{m}', float('nan')):.3f}" for p in POLICIES for m in MECHANISMS),
                      f"{r['prorsa_both_vs_fixed']:.3f}")
    console = Console(width=200)
    console.print(table)
    for r in rows:
        if r["cell"][-1] == "async":
            f = r["figures"]
            console.print(f"{r['label']}: " + ", ".join(f"{k} {v:.3f}/s" for k, v in f.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    wall = round(time.perf_counter() - t0, 1) + (kept["wall_s"] if kept else 0.0)
    Path(args.out).write_text(json.dumps({
        "command": "python benchmarks/tail.py" + (" --no-async" if args.no_async else ""),
        "wall_s": wall, "rows": rows, "points": points}, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
