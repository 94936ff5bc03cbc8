"""Multi-step runs whose workload drifts as a policy learns: can switching roles between steps
beat every fixed split, and by how much could it at best?

Each cell is run under colocated, every P:D split, every P beside mixed engines, prorsa and the
oracle. Kinds:
    growth   a synchronous run of --steps steps of SWE trajectories whose decodes grow (or shrink)
             geometrically to `decode_growth` times step 0's by the last step (--growths; none: no cell)
    shift    a synchronous run of --steps steps whose task mix moves from one family to another
             (`workload.mix: {A: 1}`, `mix_end: {B: 1}`; --shifts A:B,...)
    release  an asynchronous run of the cell's 256 SWE trajectories released in --waves equal waves,
             one every P seconds (a trace's `start_s`; --releases P,...); its figure is the makespan
"hindsight" is the best fixed split chosen afresh for every step, knowing each step's time under
each: the most any between-step switching could gain over the best single split here (none for
release cells: one asynchronous run has no steps to choose between).

Engines: the paper table's MoE ones (8 engines of EP4, 256 trajectories a step) and drivers.py's
EP8 ones (8 engines of EP8, 256 a step).

--priors runs prorsa under each of priors.py's priors as well as none: `earlier`, a run of the
cell's first step (its first family, its step-0 decodes; release cells: every trajectory at once)
on the same engines under another seed, colocated; `wrong`, the same of another family (swe <-
math-tir, math-tir <- search, search <- swe); `declared`, the earlier run's five means. --reuse
FILE keeps the points an earlier results file holds and simulates the rest, less the policies
--rerun names (after a change to the policy, say: --rerun prorsa,oracle).

    .venv/bin/python benchmarks/drift.py [--growths 0.25,4,8|none] [--shifts swe:math-tir] [--releases 60]
                                         [--waves 4] [--steps 4] [--engines ...] [--workers 2] [--out FILE]
                                         [--priors none,earlier,wrong,declared] [--reuse FILE [--rerun prorsa]]
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
from priors import BESIDE_MIXED, PRIORS, WRONG  # noqa: E402
from progress import each_done

ENGINE_SETS = ("paper-moe-ep4", "drivers-ep8")


def base_config(engines: str, mode: str):
    if engines == "paper-moe-ep4":
        from paper import config

        return config("swe", "moe", mode, 0)
    from drivers import config

    return config("ep", 8, mode)


def cell_config(engines: str, kind: str, value, steps: int, waves: int = 4):
    """The cell's pipeline, and the trajectories it replays (None: the pipeline's own draw)."""
    cfg = base_config(engines, "async" if kind == "release" else "sync")
    w = cfg.workload
    if kind == "growth":
        w = w.model_copy(update={"steps": steps, "decode_growth": value})
    elif kind == "shift":
        start, end = value.split(":")
        w = w.model_copy(update={"steps": steps, "family": None, "mix": {start: 1.0}, "mix_end": {end: 1.0}})
    cfg = cfg.model_copy(update={"workload": w})
    return cfg, released(cfg, value, waves) if kind == "release" else None


def released(cfg, period_s: float, waves: int):
    """The async cell's trajectories as drawn, wave k of `waves` released at k x period_s."""
    from dataclasses import replace

    from prorsa.agent.workload import Workload

    w = cfg.workload
    drawn = Workload.from_config(w, cfg.seed)
    per_wave = -(-w.trajectories // waves)
    specs = tuple(replace(drawn.trajectory(i), start_s=(i // per_wave) * period_s) for i in range(w.trajectories))
    return Workload(w, cfg.seed, family=None, trace=specs)


def prior_config(engines: str, kind: str, value, seed: int, wrong: bool):
    """An earlier run for the cell: its first step (release cells: every trajectory at once) of its
    first family, or of the family WRONG names for that one, under `seed`."""
    cfg = base_config(engines, "async" if kind == "release" else "sync")
    family = value.split(":")[0] if kind == "shift" else "swe"
    w = cfg.workload.model_copy(update={"family": WRONG[family] if wrong else family})
    return cfg.model_copy(update={"workload": w, "seed": seed})


def make_prior(job: tuple) -> tuple:
    """Runs prior_config's earlier run under colocated and writes it to its folder."""
    from prorsa.sim.run import simulate, write_run
    from prorsa.rollout.context import resolve

    engines, kind, value, seed, wrong, folder = job
    write_run(simulate(resolve(prior_config(engines, kind, value, seed, wrong)), "colocated"), Path(folder))
    return job


def with_prior(cfg, prior_name: str, folder: str | None):
    """`cfg` told the prior: the earlier run's folder, or its five means as the pipeline declares them."""
    if prior_name == "none":
        return cfg
    from prorsa.config.pipeline import PipelineConfig
    from prorsa.metrics.prior import read_prior

    data = cfg.model_dump()
    data["prior"] = read_prior(folder).model_dump() if prior_name == "declared" else folder
    return PipelineConfig.model_validate(data)


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    engines, kind, value, steps, waves, policy, prior_name, folder = job
    cfg, workload = cell_config(engines, kind, value, steps, waves)
    sim = simulate(resolve(with_prior(cfg, prior_name, folder)), policy, workload)
    steps = cfg.workload.steps if cfg.workload.mode == "sync" else 1
    ends = [0.0] * steps
    for r in sim.recorder.trajectories:
        ends[r.spec.step] = max(ends[r.spec.step], r.end_s)
    return cell_key(engines, kind, value, steps) | {
        "policy": policy, "prior": prior_name, "figure": sim.makespan_s, "switches": sim.summary["role_switches"],
        "per_step": [ends[0]] + [ends[k] - ends[k - 1] for k in range(1, steps)]}


def cell_key(engines: str, kind: str, value, steps: int) -> dict:
    """How a cell is named in the results: growth cells as drift.json has always named them."""
    return {"engines": engines, "steps": steps} | ({"growth": value} if kind == "growth" else
                                                   {"kind": kind, "value": value})


def cell_summary(points: list[dict]) -> dict:
    fixed = {p["policy"]: p for p in points if p["policy"] not in ("prorsa", "oracle")}
    by = {p["policy"]: p for p in points if p.get("prior", "-") in ("none", "-")}
    mine = {p["prior"]: p for p in points if p["policy"] == "prorsa" and "prior" in p}
    best = min(fixed, key=lambda k: fixed[k]["figure"])
    steps = points[0]["steps"]
    ref = fixed[best]["figure"]
    summary = {"best_fixed": best, "best_fixed_s": ref, "prorsa_vs_best": ref / by["prorsa"]["figure"],
               "oracle_vs_best": ref / by["oracle"]["figure"], "prorsa_switches": by["prorsa"]["switches"],
               "prorsa_vs_best_by_prior": {k: ref / p["figure"] for k, p in mine.items()},
               "prorsa_switches_by_prior": {k: p["switches"] for k, p in mine.items()}}
    if steps < 2:
        return summary | {"hindsight_splits": None, "hindsight_vs_best": None}
    hindsight = [min(fixed, key=lambda k: fixed[k]["per_step"][s]) for s in range(steps)]
    hind_s = sum(fixed[k]["per_step"][s] for s, k in enumerate(hindsight))
    return summary | {"hindsight_splits": hindsight, "hindsight_vs_best": ref / hind_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--growths", default="0.25,4,8")
    ap.add_argument("--shifts", default="", help="FROM:TO families, comma-separated")
    ap.add_argument("--releases", default="", help="seconds between waves, comma-separated")
    ap.add_argument("--waves", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--engines", default=",".join(ENGINE_SETS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/drift.json")
    ap.add_argument("--priors", default="none", help=f"prorsa's priors, comma-separated, of {','.join(PRIORS)}")
    ap.add_argument("--seed", type=int, default=0, help="the earlier runs' seed is this + 1")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file: its points are kept")
    ap.add_argument("--rerun", default="", help=RERUN_HELP)
    args = ap.parse_args()
    priors = args.priors.split(",")
    if any(p not in PRIORS for p in priors) or "none" not in priors:
        sys.exit(f"error: --priors: of {list(PRIORS)}, comma-separated, none among them; got {args.priors!r}")
    kinds = parse_cells(args)
    engine_sets = args.engines.split(",")
    if unknown := [e for e in engine_sets if e not in ENGINE_SETS]:
        sys.exit(f"error: --engines: unknown {unknown}; known: {list(ENGINE_SETS)}")
    cells = [(e, kind, v) for e in engine_sets for kind, values in kinds.items() for v in values]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, Pool(args.workers) as pool:
        # an earlier run of each cell's first step, and of the family that misleads it
        folder = {(c, wrong): str(Path(tmp) / f"prior-{i}-{int(wrong)}") for i, c in enumerate(cells)
                  for wrong in (False, True)}
        prior_dir = {"none": None, "earlier": False, "wrong": True, "declared": False}
        jobs = [(e, kind, v, args.steps, args.waves, p, "none" if p == "prorsa" else "-", None) for e, kind, v in cells
                for p in ["colocated", *STATICS, *BESIDE_MIXED, "prorsa", "oracle"]]
        jobs += [(e, kind, v, args.steps, args.waves, "prorsa", pr, folder[(e, kind, v), prior_dir[pr]])
                 for e, kind, v in cells for pr in priors if pr != "none"]
        kept = reused(args.reuse, set(filter(None, args.rerun.split(","))))
        for probe in first_each([j for j in jobs if job_key(j) in kept and j[7] is None], lambda j: j[1]):
            reuse_holds(args.reuse, " ".join(map(str, job_key(probe))), kept[job_key(probe)]["figure"],
                        run_point(probe)["figure"])  # a fixed split's point, one a kind of cell
        points = [kept[job_key(j)] for j in jobs if job_key(j) in kept]
        jobs = [j for j in jobs if job_key(j) not in kept]
        needed = {j[7] for j in jobs if j[7] is not None}
        list(pool.imap_unordered(make_prior, [(*c, args.seed + 1, wrong, f) for (c, wrong), f in folder.items()
                                              if f in needed]))
        points.extend(each_done(pool, run_point, jobs, lambda p: f"{p['engines']} {label(p)} {p['policy']} "
                                f"({p['prior']}): {p['figure']:.1f} s"))
    results = []
    for e, kind, v in cells:
        key = cell_key(e, kind, v, 1 if kind == "release" else args.steps)
        results.append(key | cell_summary([p for p in points if all(p[k] == key[k] for k in key)]))

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"workloads drifting over {args.steps} steps ({ENGINES} engines; > 1 beats the best "
                        "single fixed split)")
    for col in ("engines", "cell", "best fixed", "hindsight / best", "prorsa / best", "oracle / best", "switches"):
        table.add_column(col, justify="left" if col == "engines" else "right")
    for r in results:
        hindsight = "-" if r["hindsight_vs_best"] is None else f"{r['hindsight_vs_best']:.3f}"
        table.add_row(r["engines"], label(r), r["best_fixed"], hindsight,
                      f"{r['prorsa_vs_best']:.3f}", f"{r['oracle_vs_best']:.3f}", str(r["prorsa_switches"]))
    Console(width=160).print(table)
    save("drift.py", t0, results, points, args.out)


def job_key(job: tuple) -> tuple:
    engines, kind, value, steps, _, policy, prior_name, _ = job
    key = cell_key(engines, kind, value, 1 if kind == "release" else steps)
    return (*key.items(), policy, prior_name)


def reused(path: str | None, rerun: set[str]) -> dict[tuple, dict]:
    """job key -> point, from an earlier results file (--reuse), less the `rerun` policies' (a
    policy, or POLICY:PRIOR for one prior's points: prorsa:none). Points
    from before --priors have no prior: prorsa's was none."""
    if not path:
        return {}
    out = {}
    for p in saved_points(path, "drift.py"):
        p = p | {"prior": p.get("prior", "none" if p["policy"] == "prorsa" else "-")}
        if rerun_asks(p, rerun):
            continue
        key = {k: p[k] for k in ("engines", "steps", "growth", "kind", "value") if k in p}
        out[(*key.items(), p["policy"], p["prior"])] = p
    return out


def parse_cells(args) -> dict[str, list]:
    """The cells of each kind the command line asks for; exits with one line on a bad value."""
    from prorsa.config.pipeline import FAMILY_NAMES

    def listed(text: str) -> list[str]:
        return [] if text.strip().lower() in ("", "none") else [x.strip() for x in text.split(",")]

    try:
        growths = [float(g) for g in listed(args.growths)]
        periods = [float(p) for p in listed(args.releases)]
    except ValueError:
        sys.exit(f"error: --growths, --releases: numbers, comma-separated; got {args.growths!r}, {args.releases!r}")
    shifts = listed(args.shifts)
    if args.steps < 2 or any(g <= 0 for g in growths) or any(p < 0 for p in periods) or args.waves < 1:
        sys.exit("error: --steps must be >= 2, every growth > 0, every release period >= 0 and --waves >= 1")
    if bad := [s for s in shifts if len(s.split(":")) != 2 or not set(s.split(":")) <= set(FAMILY_NAMES)]:
        sys.exit(f"error: --shifts: FROM:TO of {list(FAMILY_NAMES)}; got {bad[0]!r}")
    if not growths + shifts + periods:
        sys.exit("error: no cells: give --growths, --shifts or --releases")
    return {"growth": growths, "shift": shifts, "release": periods}


def label(cell: dict) -> str:
    if "growth" in cell:
        return f"x{cell['growth']:g}"
    if cell["kind"] == "shift":
        return cell["value"].replace(":", " -> ")
    return f"waves every {cell['value']:g} s"


if __name__ == "__main__":
    main()
