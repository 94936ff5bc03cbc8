"""Multi-step runs whose workload drifts as a policy learns: can switching roles between steps
beat every fixed split, and by how much could it at best?

Each cell is run under colocated, every P:D split, prorsa with no prior and the oracle. Kinds:
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

    .venv/bin/python benchmarks/drift.py [--growths 0.25,4,8|none] [--shifts swe:math-tir] [--releases 60]
                                         [--waves 4] [--steps 4] [--engines ...] [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper import ENGINES, STATICS, save  # noqa: E402
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


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate

    engines, kind, value, steps, waves, policy = job
    cfg, workload = cell_config(engines, kind, value, steps, waves)
    sim = simulate(cfg, policy, workload)
    steps = cfg.workload.steps if cfg.workload.mode == "sync" else 1
    ends = [0.0] * steps
    for r in sim.recorder.trajectories:
        ends[r.spec.step] = max(ends[r.spec.step], r.end_s)
    return cell_key(engines, kind, value, steps) | {
        "policy": policy, "figure": sim.makespan_s, "switches": sim.summary["role_switches"],
        "per_step": [ends[0]] + [ends[k] - ends[k - 1] for k in range(1, steps)]}


def cell_key(engines: str, kind: str, value, steps: int) -> dict:
    """How a cell is named in the results: growth cells as drift.json has always named them."""
    return {"engines": engines, "steps": steps} | ({"growth": value} if kind == "growth" else
                                                   {"kind": kind, "value": value})


def cell_summary(points: list[dict]) -> dict:
    fixed = {p["policy"]: p for p in points if p["policy"] not in ("prorsa", "oracle")}
    by = {p["policy"]: p for p in points}
    best = min(fixed, key=lambda k: fixed[k]["figure"])
    steps = points[0]["steps"]
    ref = fixed[best]["figure"]
    summary = {"best_fixed": best, "best_fixed_s": ref, "prorsa_vs_best": ref / by["prorsa"]["figure"],
               "oracle_vs_best": ref / by["oracle"]["figure"], "prorsa_switches": by["prorsa"]["switches"]}
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
    args = ap.parse_args()
    kinds = parse_cells(args)
    engine_sets = args.engines.split(",")
    if unknown := [e for e in engine_sets if e not in ENGINE_SETS]:
        sys.exit(f"error: --engines: unknown {unknown}; known: {list(ENGINE_SETS)}")
    cells = [(e, kind, v) for e in engine_sets for kind, values in kinds.items() for v in values]
    jobs = [(e, kind, v, args.steps, args.waves, p) for e, kind, v in cells
            for p in ["colocated", *STATICS, "prorsa", "oracle"]]
    t0 = time.perf_counter()
    points = []
    with Pool(args.workers) as pool:
        points.extend(each_done(pool, run_point, jobs, lambda p: f"{p['engines']} {label(p)} {p['policy']}: "
                  f"{p['figure']:.1f} s"))
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
