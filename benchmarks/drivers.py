"""What drives the gain of disaggregation, one factor at a time, in the simulator: SWE, sync and
async, 8 engines, policies colocated, static 1:7 / 2:6 / 3:5 (the best kept), prorsa and the
oracle (prorsa's allocator fed the true future).

    --factor ep            Qwen3-30B-A3B with expert parallelism 1, 2, 4, 8, 16: an engine is a
                           DP-attention group of ep ranks stepping at its slowest rank (the
                           paper's effect (a)); slots and trajectories grow with ep, so every rank
                           carries the same load
    --factor ep-wide       the same at 16, 32, 64 and 128 ranks an engine (Qwen3-30B-A3B has 128 experts),
                           with splits 2:6 to 5:3: where the gain over colocated nears the paper's 4x
    --factor tokens        every appended and decoded token count x 0.5, 1, 2, 4 (prefill length
                           and context length together), MoE EP4
    --factor prefix-cache  ideal vs lru, Qwen3-32B on H100s, whose KV memory is tight at SWE contexts
    --factor turns         trajectories capped at 4, 8, 16, 24 turns, MoE EP16: the longer they run,
                           the longer the tail of a synchronous step, where few trajectories are left
    --factor weight-update 0 or 10 s weight updates (sync: between 3 steps; async: every 32 finished
                           trajectories, rollout going on) that invalidate every prefix cache, MoE EP4
    --factor weight-update-clock  async only: a 10 s weight update every 30 or 60 wall seconds
                           (`weight_update_every_s`: a trainer publishing on a clock, not per batch), MoE EP4
    --factor parallelism   stage-specific parallelism on 8 engines of 8 H200s each (64 GPUs in every
                           row), Qwen3-30B-A3B: every role EP8 (DP attention, 8 ranks), every role
                           TP8 (one rank, no barrier), or prefill TP8 with decode and mixed EP8

    .venv/bin/python benchmarks/drivers.py --factor ep [--workers 2] [--reuse FILE --rerun prorsa,oracle]

--reuse takes the points of an earlier run of the same factor from its results file and simulates
only the points it lacks and the policies named by --rerun (after a change to the allocator, say);
the results file lists which points were reused. A reused colocated point of each mode is simulated
again first: a file it no longer reproduces (the simulator changed since) is refused, never mixed
with today's points.
"""

from __future__ import annotations

import argparse
import json
import sys
from multiprocessing import Pool
from pathlib import Path

from paper import first_each, rerun_names, reuse_holds

POLICIES = ["colocated", "static:1:7", "static:2:6", "static:3:5", "prorsa", "oracle"]
# wider groups want more prefill engines: the splits tried move with them
WIDE_POLICIES = ["colocated", "static:2:6", "static:3:5", "static:4:4", "static:5:3", "prorsa", "oracle"]
FACTORS = {
    "ep": [1, 2, 4, 8, 16],
    "ep-wide": [16, 32, 64, 128],
    "tokens": [0.5, 1.0, 2.0, 4.0],
    "prefix-cache": ["ideal", "lru"],
    "weight-update": [0.0, 10.0],
    "weight-update-clock": [30.0, 60.0],
    "turns": [4, 8, 16, 24],
    "parallelism": ["ep8", "tp8", "p-tp8/d-ep8"],
}
# factors whose workload exists in one mode only (updates on a clock need a rollout going on)
ONLY_MODES = {"weight-update-clock": ("async",)}
# --factor parallelism: the engines' layout; tp x ep = 8 GPUs an engine in every row and role
LAYOUTS = {
    "ep8": {"tp": 1, "ep": 8},
    "tp8": {"tp": 8, "ep": 1},
    "p-tp8/d-ep8": {"tp": 1, "ep": 8, "parallelism": {"prefill": {"tp": 8, "ep": 1}}},
}


def config(factor: str, value, mode: str):
    from prorsa.config.pipeline import PipelineConfig

    ep, model, gpu, scale, cache, slots, update, steps = 4, "qwen3-30b-a3b", "h200", 1.0, "ideal", 32, 0.0, 1
    turns, every = 12, None
    if factor == "turns":
        ep, turns = 16, value
    elif factor == "weight-update":
        update, steps = value, 3
    elif factor == "weight-update-clock":
        update, every = 10.0, value
    elif factor in ("ep", "ep-wide"):
        ep = value
    elif factor == "tokens":
        scale = value
    elif factor == "prefix-cache":
        ep, model, gpu, cache, slots = 1, "qwen3-32b", "h100", value, 32
    elif factor == "parallelism":
        ep = 8  # slots and load as for EP8 in every layout
    engines = {"backend": "emulated", "count": 8, "slots": slots * ep, "gpu": gpu, "model": model,
               "ep": ep, "prefix_cache": cache}
    if factor == "parallelism":
        engines |= LAYOUTS[value]
    return PipelineConfig.model_validate({
        "name": f"drivers-{factor}-{str(value).replace('/', '_')}-{mode}", "seed": 0, "policy": "colocated",
        "engines": engines,
        "workload": {"family": "swe", "mode": mode, "prompts": 4 * ep, "group_size": 8, "steps": steps,
                     "concurrency": 16 * ep, "trajectories": 32 * ep * steps, "max_turns": turns, "token_scale": scale,
                     "weight_update_s": update, "weight_update_every_s": every},
    })  # fmt: skip


def modes_of(factor: str, modes: list[str]) -> list[str]:
    """Of `modes`, those `factor`'s workload exists in."""
    return [m for m in modes if m in ONLY_MODES.get(factor, modes)]


def run(job: tuple) -> tuple:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    factor, value, mode, policy = job
    s = simulate(resolve(config(factor, value, mode)), policy).summary
    fig = s["makespan_s"] if mode == "sync" else s["trajectories_per_s"]
    return factor, value, mode, policy, fig, s["prefix_hit_rate"], s["role_switches"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factor", choices=sorted(FACTORS), default="ep")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--values", help="a subset of the factor's values, comma-separated (e.g. 16,32,64)")
    ap.add_argument("--reuse", metavar="FILE", help="an earlier results file of this factor: its points are kept")
    ap.add_argument("--rerun", default="", help="policies simulated again although FILE holds them "
                                                "(POLICY:VALUE for one value's, e.g. prorsa:1)")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    modes = modes_of(args.factor, args.modes.split(","))
    if not modes:
        sys.exit(f"error: --modes {args.modes}: --factor {args.factor} runs {', '.join(ONLY_MODES[args.factor])} only")
    policies = WIDE_POLICIES if args.factor == "ep-wide" else POLICIES
    values = [v for v in FACTORS[args.factor] if args.values is None or str(v) in args.values.split(",")]
    if not values:
        sys.exit(f"error: --values {args.values}: none of {args.factor}'s values {FACTORS[args.factor]}")
    jobs = [(args.factor, v, m, p) for v in values for m in modes for p in policies]
    kept = reused_points(args.reuse, args.factor, set(filter(None, args.rerun.split(","))))
    todo = [j for j in jobs if j not in kept]
    # reused colocated points simulated again, one a mode: a file made before the simulator changed
    # must not be mixed in
    probes = first_each([j for j in jobs if j in kept and j[3] == "colocated"], lambda j: j[2])
    print(f"{len(todo)} simulations, {len(jobs) - len(todo)} points reused from {args.reuse}" if args.reuse
          else f"{len(todo)} simulations", file=sys.stderr)
    with Pool(args.workers) as pool:
        for probe, again in zip(probes, pool.map(run, probes, chunksize=1)):
            reuse_holds(args.reuse, " ".join(map(str, probe)), kept[probe][4], again[4])
        fresh = dict(zip(todo, pool.map(run, todo, chunksize=1)))
    res = [kept[j] if j in kept else fresh[j] for j in jobs]
    table = Table(title=f"what drives the gain: {args.factor} (SWE, 8 engines; ratios vs colocated, > 1 faster)")
    for col in (args.factor, "mode", "colocated", "best static", "prorsa", "oracle", "prefix hit coloc / best / prorsa"):
        table.add_column(col, justify="right")
    rows = []
    for v in values:
        for m in modes:
            by = {r[3]: r for r in res if r[1] == v and r[2] == m}
            sync = m == "sync"

            def ratio(p):
                return by["colocated"][4] / by[p][4] if sync else by[p][4] / by["colocated"][4]

            statics = [p for p in policies if p.startswith("static")]
            best = max(statics, key=ratio)
            unit = "s" if sync else "/s"
            hits = " / ".join(f"{by[p][5]:.0%}" if by[p][5] is not None else "-" for p in ("colocated", best, "prorsa"))
            table.add_row(str(v), m, f"{by['colocated'][4]:.2f} {unit}", f"{ratio(best):.3f} ({best[7:]})",
                          f"{ratio('prorsa'):.3f}", f"{ratio('oracle'):.3f}", hits)
            rows.append({"value": v, "mode": m, "best_static": best, "best_vs_colocated": ratio(best),
                         "prorsa_vs_colocated": ratio("prorsa"), "oracle_vs_colocated": ratio("oracle")})
    Console(width=140).print(table)
    command = "python benchmarks/drivers.py " + " ".join(sys.argv[1:])
    print(f"command: {command}")
    out = Path("benchmarks/results") / f"drivers-{args.factor}.json"
    reused = [list(j[1:]) for j in jobs if j in kept]
    out.write_text(json.dumps({"command": command, "rows": rows, "points": res, "reused": reused}, indent=1) + "\n")


def reused_points(path: str | None, factor: str, rerun: set[str]) -> dict[tuple, tuple]:
    """(factor, value, mode, policy) -> point, from an earlier results file, less the rerun policies."""
    if not path:
        return {}
    try:
        points = json.loads(Path(path).read_text())["points"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: --reuse {path}: not a drivers.py results file ({e})")
    return {tuple(p[:4]): tuple(p) for p in points if p[0] == factor and not rerun_names(rerun, p[3], p[1])}


if __name__ == "__main__":
    main()
