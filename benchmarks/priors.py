"""What prorsa is told, and what it costs: cells of the paper table, of drivers.py's factors and
of phases.py under four priors, against every fixed split and the oracle.

    none     prorsa starts all-mixed and learns the workload from its own turns; in a multi-step
             run each step after the first opens on what the steps before observed
    earlier  `prior:` an earlier run of the same cell (another seed, colocated): what
             `prorsa run --prior RUN_DIR` gives
    wrong    `prior:` an earlier run of another family whose prompts look alike, so the opening's
             prompt check passes it (swe <- terminal, terminal <- swe, search <- math-tir,
             math-tir <- search): a prior that misleads and is plausible
    declared `prior: {prompt_tokens, observation_tokens, decode_tokens, tool_s, turns}`: the
             earlier run's five means written into the pipeline, as a user copies them from
             the logs of an earlier training run (no trajectories to rehearse)

The oracle replays the run itself under every split (the simulator alone can give it its future),
holds the fastest and moves only where the replayed run gains. Fixed splits: colocated, every P:D and every P beside mixed engines of 8 (phases: every
P:D:M). --reuse FILE keeps the points an earlier results file holds and simulates the rest, less
the policies --rerun names (after a change to the oracle, say: --rerun oracle).

    --table paper     benchmarks/paper.py's cells (--families, --models, --modes)
    --table drivers   benchmarks/drivers.py's SWE cells, one per value of each --factors
                      (ep, tokens, prefix-cache, turns, weight-update, weight-update-clock,
                      parallelism, ep-wide);
                      the wrong prior is a terminal run on the same engines
    --table phases    benchmarks/phases.py's alternating trace (async, EP --ep); the earlier run
                      is the same trace with its blocks in the other order (the same data seen in
                      another order), the wrong prior a SWE run on the same engines; --jitter F
                      draws each turn's decode within F of its kind's either side (default 0:
                      every trajectory of a block alike; results in priors-phases-jitter.json)

With --steps N every synchronous cell is a run of N steps (async cells are left out).

    .venv/bin/python benchmarks/priors.py [--table paper] [--families swe,search,math-tir] [--steps 1]
                                          [--factors ep,turns] [--workers 2] [--out FILE]
                                          [--reuse FILE [--rerun oracle]]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper import ENGINES, RERUN_HELP, STATICS, first_each, rerun_asks, reuse_holds, save, saved_points  # noqa: E402
from progress import each_done

# Each family's wrong prior has prompts within the opening check's factor of 2 of its own (swe 2k,
# terminal 1.5k; search 0.3k, math-tir 0.4k), so the prior is not set aside before the run opens:
# a wrong prior the opening discards is no prior at all, and tests nothing.
WRONG = {"swe": "terminal", "search": "math-tir", "math-tir": "search", "terminal": "swe"}
PRIORS = ("none", "earlier", "wrong", "declared")
DRIVER_FACTORS = ("ep", "tokens", "prefix-cache", "turns", "weight-update", "weight-update-clock", "parallelism")
PHASES_FIXED = ["colocated"] + [f"static:{p}:{d}" + (f":{m}" if m else "")
                                for p in range(ENGINES + 1) for d in range(ENGINES + 1 - p)
                                for m in [ENGINES - p - d] if 0 < m < ENGINES or (m == 0 and p and d)]
BESIDE_MIXED = [f"static:{p}:0:{ENGINES - p}" for p in range(1, ENGINES)]
# A cell is (table, a, b, mode): ("paper", family, model, mode), ("drivers", factor, value, mode),
# ("phases", "ep", ep, "async"). Its workload kind: a family, or "phases" (the alternating trace).


def cell_config(cell: tuple, seed: int, steps: int, prior: str | dict | None = None, kind: str | None = None,
                trace_dir: str = ""):
    """The cell's pipeline; `kind` replaces its workload (a family, "phases" or "phases-reversed")."""
    table, a, b, mode = cell
    if table == "paper":
        from paper import config

        cfg = config(kind or a, b, mode, seed)
    elif table == "drivers":
        from drivers import config

        cfg = config(a, b, mode).model_copy(update={"seed": seed})
    else:
        from phases import config

        cfg = config(Path(trace_dir) / "phases.jsonl", b, 64, 512).model_copy(update={"seed": seed})
    data = cfg.model_dump()
    work = data["workload"]
    if kind in ("phases", "phases-reversed"):
        work["trace"] = str(Path(trace_dir) / f"{kind}.jsonl")
    elif kind is not None:
        work["family"], work["trace"] = kind, None
    if mode == "sync" and steps > 1:  # else the cell's own (drivers' weight-update cells run 3)
        work["steps"] = steps
    data["prior"] = prior
    from prorsa.config.pipeline import PipelineConfig

    return PipelineConfig.model_validate(data)


def own_kind(cell: tuple) -> str:
    return {"paper": cell[1], "drivers": "swe", "phases": "phases"}[cell[0]]


def wrong_kind(cell: tuple) -> str:
    return "swe" if cell[0] == "phases" else WRONG[own_kind(cell)]


def earlier_kind(cell: tuple) -> str:
    return "phases-reversed" if cell[0] == "phases" else own_kind(cell)


def fixed_splits(cell: tuple) -> list[str]:
    """Colocated, every P:D and every P beside mixed engines (phases: every P:D:M)."""
    return PHASES_FIXED if cell[0] == "phases" else ["colocated", *STATICS, *BESIDE_MIXED]


def make_prior(job: tuple) -> tuple:
    """An earlier run of `kind` on the cell's engines, from another seed, under colocated, one step."""
    from prorsa.sim.run import simulate, write_run
    from prorsa.rollout.context import resolve

    cell, kind, seed, folder, trace_dir = job
    write_run(simulate(resolve(cell_config(cell, seed, 1, kind=kind, trace_dir=trace_dir)), "colocated"), Path(folder))
    return job


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    cell, seed, steps, policy, prior_name, prior_dir, trace_dir = job
    prior = prior_dir
    if prior_name == "declared":  # the earlier run's means alone, as a pipeline declares them
        from prorsa.metrics.prior import read_prior

        prior = read_prior(prior_dir).model_dump()
    s = simulate(resolve(cell_config(cell, seed, steps, prior, trace_dir=trace_dir)), policy).summary
    return {**cell_keys(cell), "steps": steps, "policy": policy, "prior": prior_name,
            "figure": s["makespan_s"] if cell[3] == "sync" else s["trajectories_per_s"],
            "switches": s["role_switches"]}


def cell_keys(cell: tuple) -> dict:
    table, a, b, mode = cell
    if table == "paper":
        return {"family": a, "model": b, "mode": mode}
    return {"table": table, "factor": a, "value": b, "mode": mode}


def cell_summary(points: list[dict]) -> dict:
    sync = points[0]["mode"] == "sync"
    fixed = {p["policy"]: p["figure"] for p in points if p["prior"] == "-"}
    best = (min if sync else max)(fixed, key=fixed.__getitem__)

    def vs_best(fig: float) -> float:  # > 1: better than the best fixed split
        return fixed[best] / fig if sync else fig / fixed[best]

    adaptive = {(p["policy"], p["prior"]): p for p in points if p["prior"] != "-"}
    told = [pr for pr in PRIORS if ("prorsa", pr) in adaptive]
    return {"best_fixed": best, "best_fixed_figure": fixed[best], "colocated_vs_best": vs_best(fixed["colocated"]),
            "prorsa_vs_best": {pr: vs_best(adaptive["prorsa", pr]["figure"]) for pr in told},
            "prorsa_switches": {pr: adaptive["prorsa", pr]["switches"] for pr in told},
            "oracle_vs_best": vs_best(adaptive["oracle", "own"]["figure"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", choices=("paper", "drivers", "phases"), default="paper")
    ap.add_argument("--families", default="swe,search,math-tir", help="--table paper")
    ap.add_argument("--models", default="dense,moe", help="--table paper")
    ap.add_argument("--factors", default=",".join(DRIVER_FACTORS), help="--table drivers")
    ap.add_argument("--ep", default="4,16", help="--table phases: EP ranks an engine, one cell each")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="--table phases: each turn's decode drawn within this share either side of its kind's")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--steps", type=int, default=1, help="synchronous steps per run (> 1: sync cells only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", help="default: benchmarks/results/priors.json (paper), priors-TABLE.json")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file of the same table: its points are kept")
    ap.add_argument("--rerun", default="", help=RERUN_HELP)
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("error: --steps: at least 1")
    if not 0 <= args.jitter < 1 or (args.jitter and args.table != "phases"):
        sys.exit(f"error: --jitter: at least 0 and under 1, and for --table phases only; got {args.jitter}")
    cells = chosen_cells(args)
    if not cells:
        sys.exit("error: no cells: phases cells are asynchronous, --steps > 1 keeps synchronous cells only")
    out = args.out or ("benchmarks/results/priors.json" if args.table == "paper"
                       else f"benchmarks/results/priors-{args.table}{'-jitter' if args.jitter else ''}.json")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Pool(args.workers) as pool:
        if args.table == "phases":
            from phases import write_phase_trace

            write_phase_trace(Path(tmp) / "phases.jsonl", 4, 128, 8192, 2048, 1.0, jitter=args.jitter)
            write_phase_trace(Path(tmp) / "phases-reversed.jsonl", 4, 128, 8192, 2048, 1.0, first="decode-heavy",
                              jitter=args.jitter)
        # an earlier run of each cell's workload, and of the one that misleads it
        wanted = {(c, earlier_kind(c)) for c in cells} | {(c, wrong_kind(c)) for c in cells}
        folder = {key: str(Path(tmp) / f"prior-{i}") for i, key in enumerate(sorted(wanted, key=str))}
        jobs = []
        for c in cells:
            base = (c, args.seed, args.steps)
            jobs += [(*base, p, "-", None, tmp) for p in fixed_splits(c)]
            jobs.append((*base, "oracle", "own", None, tmp))
            jobs += [(*base, "prorsa", "none", None, tmp), (*base, "prorsa", "earlier", folder[c, earlier_kind(c)], tmp),
                     (*base, "prorsa", "wrong", folder[c, wrong_kind(c)], tmp),
                     (*base, "prorsa", "declared", folder[c, earlier_kind(c)], tmp)]
        kept = reused(args.reuse, set(filter(None, args.rerun.split(","))))
        for probe in first_each([j for j in jobs if job_key(j) in kept and j[5] is None], lambda j: j[0][3]):
            reuse_holds(args.reuse, " ".join(map(str, job_key(probe))), kept[job_key(probe)]["figure"],
                        run_point(probe)["figure"])  # a fixed split's point, one a mode
        points = [kept[key] for key in map(job_key, jobs) if key in kept]
        jobs = [j for j in jobs if job_key(j) not in kept]
        needed = {j[5] for j in jobs if j[5] is not None}  # the priors the points left to simulate read
        list(pool.imap_unordered(make_prior, [(c, k, args.seed + 1, folder[c, k], tmp) for c, k in wanted
                                              if folder[c, k] in needed]))
        points.extend(each_done(pool, run_point, jobs, lambda p: f"{label(p)} {p['policy']} ({p['prior']}): {p['figure']:.3f}"))
    results = []
    for c in cells:
        mine = [p for p in points if all(p[k] == v for k, v in cell_keys(c).items())]
        results.append(cell_keys(c) | {"steps": args.steps} | cell_summary(mine))

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"prorsa / the best fixed split under four priors ({ENGINES} engines, {args.steps} step(s); "
                        "> 1 beats every fixed split)")
    for col in ("cell", "best fixed", *PRIORS, "oracle", "switches n/e/w/d"):
        table.add_column(col, justify="left" if col == "cell" else "right")
    for r in results:
        v = r["prorsa_vs_best"]
        table.add_row(label(r), r["best_fixed"], *(f"{v[p]:.3f}" for p in PRIORS),
                      f"{r['oracle_vs_best']:.3f}", "/".join(str(r["prorsa_switches"][p]) for p in PRIORS))
    Console(width=160).print(table)
    save("priors.py", t0, results, points, out)


def job_key(job: tuple) -> tuple:
    cell, _, steps, policy, prior_name = job[:5]
    return (*cell_keys(cell).values(), steps, policy, prior_name)


def reused(path: str | None, rerun: set[str] = frozenset()) -> dict[tuple, dict]:
    """job key -> point, from an earlier results file (--reuse), less the `rerun` policies' (a
    policy, or POLICY:PRIOR for one prior's points: prorsa:none)."""
    if not path:
        return {}
    points = saved_points(path, "priors.py")
    keys = ("family", "model") if points and "family" in points[0] else ("table", "factor", "value")
    return {(*(p[k] for k in keys), p["mode"], p["steps"], p["policy"], p["prior"]): p for p in points
            if not rerun_asks(p, rerun)}


def chosen_cells(args: argparse.Namespace) -> list[tuple]:
    modes = args.modes.split(",") if args.steps == 1 else ["sync"]
    if args.table == "paper":
        families = args.families.split(",")
        if unknown := [f for f in families if f not in WRONG]:
            sys.exit(f"error: --families: unknown {unknown}; known: {sorted(WRONG)}")
        return [("paper", f, m, md) for f in families for m in args.models.split(",") for md in modes]
    if args.table == "drivers":
        from drivers import FACTORS, modes_of

        factors = args.factors.split(",")
        if unknown := [f for f in factors if f not in FACTORS]:
            sys.exit(f"error: --factors: unknown {unknown}; known: {sorted(FACTORS)}")
        return [("drivers", f, v, md) for f in factors for v in FACTORS[f] for md in modes_of(f, modes)]
    return [("phases", "ep", int(ep), "async") for ep in args.ep.split(",")] if "async" in modes else []


def label(r: dict) -> str:
    if "family" in r:
        return f"{r['family']} {r['model']} {r['mode']}"
    return f"{r['table']} {r['factor']}={r['value']} {r['mode']}"


if __name__ == "__main__":
    main()
