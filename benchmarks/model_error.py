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
        [--workers 2] [--out FILE] [--trace FILE[,FILE...]] [--prefill P,...]
        [--reuse FILE --rerun prorsa:math-tir,...]

--families takes, beside a family, FROM:TO, a task mix that shifts from one family to the other (the
paper cell's engines and load): synchronous, over --steps steps (at least 2; drift.py's shift cells),
each prompt drawn from TO with probability k / (steps - 1) at step k; asynchronous, over the run's
trajectories, prompt p of P drawn from TO with probability p / (P - 1). --trace FILE adds a cell per
recorded agent trace (named by the file), released when it was recorded to start: each recorded
trajectory a prompt of a GRPO group of 8 samples (partial_rollout.py's grouping), the recorded model's
time taken out of start-to-start gaps at the fastest rate they imply; a synchronous step keeps the
releases (relative to the step), an asynchronous run replays them in order and a repeat of the trace
one period (its last release) later.

--prefill P,...: only the fixed splits of these prefill engine counts (P:D and P beside mixed, and
colocated), a coarser grid where every split of many engines costs too much (32 engines: 63 splits).

--reuse keeps the points an earlier results file holds and simulates only those it lacks and those
--rerun names (POLICY, POLICY:FAMILY for one family's, or POLICY:epW for one EP width's), after a
change that moves only them.

Virtual-time results, deterministic; the figure is prorsa's over the best fixed split's (> 1:
faster; sync: makespan, async: trajectories per second).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path
from typing import NoReturn

from paper import config, first_each, rerun_names, reuse_holds, save, saved_points
from progress import each_done

ENGINES = 8
EP = 4  # the paper's MoE width: paper.py's MODELS["moe"]
SHIFT_STREAM = 0x5A1F7  # the async shift's draws: a stream no family draw shares


def fixed_splits(engines: int, prefill: list[int] | None = None) -> list[str]:
    """Colocated, every P:D and every P beside mixed engines (only the P in `prefill` when given)."""
    ps = [p for p in range(1, engines) if prefill is None or p in prefill]
    return ["colocated", *(f"static:{p}:{engines - p}" for p in ps), *(f"static:{p}:0:{engines - p}" for p in ps)]


FIXED = fixed_splits(ENGINES)
ERRORS = ["exact", "prefill=0.8", "prefill=1.25", "decode=0.8", "decode=1.25", "prefill=0.8,decode=0.8",
          "prefill=0.8,decode=1.25", "prefill=1.25,decode=0.8", "prefill=1.25,decode=1.25"]


def _config(family: str, mode: str, seed: int, steps: int, engines: int = ENGINES, ep: int | None = None,
            trace: str | None = None):
    """The cell's pipeline: `family` a family, FROM:TO (a shifting mix) or, with `trace` (a grouped
    trace file), the trace's name."""
    from prorsa.config.workload import FAMILY_NAMES

    cfg = config(family if family in FAMILY_NAMES else "swe", "moe", mode, seed)
    w = cfg.workload
    if trace is not None:
        cfg = cfg.model_validate(cfg.model_dump() | {"workload": w.model_dump(exclude={"family"}) | {"trace": trace}})
    elif ":" in family:  # the async stream is shifting_stream's; its pipeline names both families
        start, end = family.split(":")
        cfg = cfg.model_copy(update={"workload": w.model_copy(update={"family": None, "mix": {start: 1.0}, "mix_end": {
            end: 1.0}} if mode == "sync" else {"family": None, "mix": {start: 1.0, end: 1.0}})})
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


def shifting_stream(cfg):
    """An asynchronous run's trajectories as its mix shifts from the first family it names to the
    second: prompt p of P drawn from the second with probability p / (P - 1), on a stream of its own,
    its group's trajectories as that family draws them."""
    import numpy as np

    from prorsa.agent.workload import Workload

    w = cfg.workload
    start, end = (Workload.from_config(w.model_copy(update={"mix": None, "family": f}), cfg.seed) for f in w.mix)
    prompts = -(-w.trajectories // w.group_size)

    def late(p: int) -> bool:
        return np.random.default_rng([cfg.seed, SHIFT_STREAM, p]).random() < p / max(1, prompts - 1)

    specs = tuple((end if late(i // w.group_size) else start).trajectory(i) for i in range(w.trajectories))
    return Workload(w, cfg.seed, family=None, trace=specs)


def trace_file(src: str, folder: Path) -> tuple[str, tuple[str, str]]:
    """A recorded trace as its cell replays it (the module's notes): (its name, (`src`, the grouped
    file written in `folder`)). Exits naming the file on bad input."""
    from partial_rollout import GROUP, fastest_rate, grouped

    from prorsa.agent.importers import FORMATS, ImportOptions, TraceError, import_trace
    from prorsa.agent.trace import write_trace

    try:
        fmt, _ = import_trace(src, options=ImportOptions(releases="recorded"))
        rate = fastest_rate(FORMATS[fmt].read(Path(src), None))
        _, specs = import_trace(src, fmt, ImportOptions(decode_tps=rate, releases="recorded"))
    except TraceError as e:
        usage_error(f"--trace: {e}")
    name = Path(src).name.split(".")[0]
    path = folder / f"{name}.jsonl"
    if path.exists():
        usage_error(f"--trace: two files named {name}; rename one")
    write_trace(path, grouped(specs, GROUP))
    return name, (src, str(path))


def usage_error(message: str) -> NoReturn:
    """A bad command line or input file: one line, exit 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def run_point(job: tuple) -> dict:
    from prorsa.costmodel.misfit import ModelScale
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    family, mode, seed, steps, policy, error, engines, ep, trace = job
    scale = None if error == "exact" else ModelScale.parse(error)
    cfg = _config(family, mode, seed, steps, engines, ep, trace)
    stream = shifting_stream(cfg) if mode == "async" and ":" in family else None
    s = simulate(resolve(cfg), policy, stream, model_error=scale).summary
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
    ap.add_argument("--families", default="swe,search,math-tir,terminal",
                    help="families, or FROM:TO for a mix shifting from one to the other; 'none' with --trace")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--steps", type=int, default=1, help="synchronous steps per run (calibration acts between them)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--engines", type=int, default=ENGINES, help="engines in every cell (the paper's: 8)")
    ap.add_argument("--prefill", help="the fixed splits' prefill engine counts, comma-separated (default: "
                                      "every one from 1 to engines - 1): a coarser grid for many engines")
    ap.add_argument("--ep", help=f"EP ranks an engine, comma-separated widths (the paper's: {EP}); 32 slots "
                                 "and the paper's load a rank; recorded in the results when given")
    ap.add_argument("--errors", default="default", help="';'-separated model scales, e.g. 'exact;decode=1.25'")
    ap.add_argument("--trace", action="append", default=[], metavar="FILE[,FILE...]",
                    help="a recorded agent trace (per-turn JSONL with start_s) replayed as a cell of its own")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/model-error.json")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file: its points are kept")
    ap.add_argument("--rerun", default="", help="with --reuse: POLICY, POLICY:FAMILY or POLICY:epW simulated again")
    args = ap.parse_args()
    from prorsa.config.workload import FAMILY_NAMES
    from prorsa.costmodel.misfit import ModelScale

    errors = ERRORS if args.errors == "default" else args.errors.split(";")
    families = [] if args.families == "none" else args.families.split(",")
    if args.engines < 2:
        usage_error(f"--engines: at least 2, not {args.engines}")
    if bad := [f for f in families if not set(f.split(":")) <= set(FAMILY_NAMES) or f.count(":") > 1]:
        usage_error(f"--families: {bad[0]!r} is neither a family of {list(FAMILY_NAMES)} nor FROM:TO of two")
    if any(":" in f for f in families) and "sync" in args.modes.split(",") and args.steps < 2:
        usage_error("--steps: a shifting mix (FROM:TO) needs at least 2 synchronous steps to shift over")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        widths = [None] if args.ep is None else [int(w) for w in args.ep.split(",")]
        args.prefill = None if args.prefill is None else [int(p) if p.strip().isdigit() else -1
                                                          for p in args.prefill.split(",")]
        if args.prefill is not None and not all(0 < p < args.engines for p in args.prefill):
            raise ValueError(f"--prefill: counts from 1 to {args.engines - 1}, not {args.prefill}")
        if any(w is not None and w < 1 for w in widths):
            raise ValueError(f"--ep: widths of at least 1, not {args.ep}")
        for e in errors:
            e == "exact" or ModelScale.parse(e)
    except ValueError as err:
        usage_error(str(err))
    with tempfile.TemporaryDirectory(prefix="model-error-") as tmp:
        traces = dict(trace_file(src, Path(tmp)) for given in args.trace for src in given.split(",") if src)
        run(args, families + list(traces), traces, seeds, widths, errors)


def run(args, families: list[str], traces: dict[str, tuple[str, str]], seeds: list[int], widths: list, errors: list[str]) -> None:
    """Simulates the cells' points the reused file lacks and writes the results."""
    if not families:
        usage_error("no cells: give --families or --trace")
    n = args.engines

    def steps(family: str, mode: str) -> int:  # an async shift shifts over the run's trajectories
        return 1 if mode == "async" else args.steps

    cells = [(f, m, s, w) for w in widths for s in seeds for f in families
             for m in args.modes.split(",") if m == "sync" or args.steps == 1 or ":" in f]
    grouped = {f: path for f, (_, path) in traces.items()}
    jobs = [(f, m, s, steps(f, m), p, "exact", n, w, grouped.get(f)) for f, m, s, w in cells
            for p in fixed_splits(n, args.prefill)]
    jobs += [(f, m, s, steps(f, m), "prorsa", e, n, w, grouped.get(f)) for f, m, s, w in cells for e in errors]
    t0 = time.perf_counter()
    rerun = set(filter(None, args.rerun.split(",")))
    points = [p for p in (saved_points(args.reuse, "model_error.py") if args.reuse else [])
              if not rerun_names(rerun, p["policy"], p["family"], f"ep{p.get('ep', EP)}")]

    def key(p: dict) -> tuple:  # files made before --engines hold the paper's 8, before --ep its EP4
        return (p["family"], p["mode"], p["seed"], p["steps"], p["policy"], p["error"], p.get("engines", ENGINES),
                p.get("ep", EP))

    def job_key(j: tuple) -> tuple:
        return *j[:7], EP if j[7] is None else j[7]

    have = {key(p): p for p in points}
    for probe in first_each([j for j in jobs if job_key(j) in have and j[4] != "prorsa"], lambda j: j[1]):
        reuse_holds(args.reuse, " ".join(map(str, job_key(probe))), have[job_key(probe)]["figure"],
                    run_point(probe)["figure"])  # a fixed split's point, one a mode
    wanted = {job_key(j) for j in jobs}
    points = [p for p in points if key(p) in wanted]
    jobs = [j for j in jobs if job_key(j) not in have]
    with Pool(args.workers) as pool:
        points += each_done(pool, run_point, jobs, lambda p: f"{p['family']} {p['mode']} seed {p['seed']} "
                            + (f"EP{p['ep']} " if "ep" in p else "") + f"{p['policy']} ({p['error']}): {p['figure']:.3f}")
    results = [{"family": f, "mode": m, "seed": s, "steps": steps(f, m), "engines": n} | ({} if w is None else {"ep": w})
               | ({"trace": traces[f][0]} if f in traces else {})
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
