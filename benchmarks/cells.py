"""Cells: a rollout split over several schedulers, simulated at cluster scale and run live here.

--sim: the paper's SWE step as benchmarks/scale.py simulates it (dense Qwen3-8B on one H200 an
engine, 8 trajectories a GPU, up to 12 turns, 64 slots, policy prorsa) on G GPUs as C cells
(prorsa/sim/cells.py: each cell its own router, controller and policy over G / C engines, GRPO
groups placed by free slots, a coordinator moving engines between cells, a move's restart 60 s),
beside one cell of all G where that point is asked for. Each point runs in its own process. A row:
makespan, trajectories/s, moves, role switches, and per cell the scheduler load it would carry
live: turns/s over the step (mean) and in its busiest --window s (peak), against the capacity one
scheduler and one driver have (1 / the CPU ms a turn scale.py's fits measured: the `a` terms of
benchmarks/results/scale.json, no background share, no growth with engines).

--live: two cells on this machine (prorsa/live/cells.py: each its own Dask SpecCluster, scheduler
in this process, in-process workers; emulated MoE engines at time scale 0.1), one synchronous
step of 128 SWE trajectories in 2 GRPO groups of 64 (one a cell; seed 0: the first runs longer) on 6 engines, policy reactive with a low bar (reactive:4096:0.01:1: a
prefill engine turns decode once decode KV passes 1%, back on a prefill queue; the switches are
the point here, not their pay-off; the policy CPU share raised to 0.5 so it keeps its interval on
a loaded machine), coordinator interval 1 s. Reports
every trajectory id seen (and how many distinct), role switches per cell, and the moves.

    .venv/bin/python benchmarks/cells.py --sim 256:1,256:4,1024:1,1024:4 [--out benchmarks/results/cells-sim.json]
    .venv/bin/python benchmarks/cells.py --live [--out benchmarks/results/cells-live.json]
    .venv/bin/python benchmarks/cells.py --live --processes [--out benchmarks/results/cells-processes.json]

--live --processes: the same two cells with runtime.processes off (each cell's scheduler and
workers in the driver's process) and on (each a process of its own), each in a fresh interpreter:
makespan, and the CPU of the driver's process (with processes off it includes the schedulers' and
workers'; the children's CPU is that of the worker and scheduler processes that ended and were
waited for).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import GROUP, MAX_TURNS, PER_GPU, SLOTS, peak_rate  # noqa: E402  the same workload as scale.py

POLICY = "prorsa"
LIVE_POLICY = "reactive:4096:0.01:1"


def sim_config(gpus: int):
    from prorsa.config.pipeline import PipelineConfig

    return PipelineConfig.model_validate({
        "name": f"cells-{gpus}", "seed": 0, "policy": POLICY,
        "engines": {"backend": "emulated", "count": gpus, "slots": SLOTS, "gpu": "h200", "model": "qwen3-8b"},
        "workload": {"family": "swe", "mode": "sync", "prompts": PER_GPU * gpus // GROUP, "group_size": GROUP,
                     "steps": 1, "max_turns": MAX_TURNS},
    })  # fmt: skip


def capacities() -> dict[str, float]:
    fits = json.loads((Path(__file__).parent / "results" / "scale.json").read_text())["fits"]
    return {k: fits[k]["a"] for k in ("scheduler", "driver")}


def sim_point(gpus: int, cells: int, window: float) -> dict:
    from prorsa.sim.cells import simulate_cells

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    out = simulate_cells(sim_config(gpus), cells)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    ids = out.trajectory_ids()
    per_cell = []
    for rec, makespan in zip(out.recorders, out.cell_makespans):
        ends = [t.end_s for traj in rec.trajectories for t in traj.turns]
        per_cell.append({"trajectories": len(rec.trajectories), "turns": len(ends), "makespan_s": makespan,
                         "turns_per_s_mean": len(ends) / makespan if makespan else 0.0,
                         "turns_per_s_peak": peak_rate(ends, window), "role_switches": len(rec.role_changes)})
    return {"gpus": gpus, "cells": cells, "engines_per_cell": gpus // cells, "trajectories": len(ids),
            "distinct": len(set(ids)), "makespan_s": out.makespan_s, "trajectories_per_s": len(ids) / out.makespan_s,
            "turns": sum(c["turns"] for c in per_cell), "moves": [m.__dict__ for m in out.moves],
            "role_switches": sum(c["role_switches"] for c in per_cell), "per_cell": per_cell, "window_s": window,
            "sim_wall_s": out.wall_s, "sim_cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)}


def live_config(processes: bool = False):
    from prorsa.config.pipeline import PipelineConfig

    return PipelineConfig.model_validate({
        "name": "cells-live", "seed": 0, "policy": LIVE_POLICY,
        "engines": {"backend": "emulated", "count": 6, "slots": 128, "time_scale": 0.1, "model": "qwen3-30b-a3b",
                    "ep": 8},
        "workload": {"family": "swe", "mode": "sync", "prompts": 2, "group_size": 64, "steps": 1,
                     "tool_time_scale": 0.1, "max_turns": MAX_TURNS},
        "runtime": {"turn_shape": "driver", "metrics_interval_s": 0.2, "control_interval_s": 0.2,
                    "dashboard_address": None, "control_cpu_share": 0.5, "processes": processes},
    })  # fmt: skip


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def live_run(processes: bool = False) -> dict:
    from prorsa.control.cells import Coordinator
    from prorsa.live.cells import run_cells

    cfg = live_config(processes)
    t, cpu, children = time.time(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as d:
        # live seconds: a move here restarts an in-process emulated engine in well under a second
        out = asyncio.run(run_cells(cfg, 2, Path(d), Coordinator(ratio=1.5, interval_s=3.0, move_s=1.0), interval_s=1.0))
    ids = out.trajectory_ids()
    return {"cells": 2, "engines": cfg.engines.count, "trajectories": len(ids), "distinct": len(set(ids)),
            "expected": cfg.workload.prompts * cfg.workload.group_size, "makespan_s": out.makespan_s,
            "wall_s": time.time() - t, "processes": processes, "driver_cpu_s": _cpu(resource.RUSAGE_SELF) - cpu,
            "children_cpu_s": _cpu(resource.RUSAGE_CHILDREN) - children, "cell_makespans_s": out.cell_makespans,
            "cell_trajectories": [len(r.trajectories) for r in out.recorders],
            "role_switches": [len(r.role_changes) for r in out.recorders],
            "switches": [[c.engine, c.from_role.value, c.to_role.value] for r in out.recorders for c in r.role_changes],
            "moves": [m.__dict__ for m in out.moves], "engines_at_end": out.engines_at_end}


def _fresh(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"error: {' '.join(args)}: {proc.stderr.strip().splitlines()[-3:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"processes {row['processes']}: makespan {row['makespan_s']:.1f} s, driver CPU {row['driver_cpu_s']:.1f} s",
          file=sys.stderr, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", help="GPUS:CELLS points, comma-separated")
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one simulated point may take")
    ap.add_argument("--out")
    ap.add_argument("--processes", action="store_true",
                    help="with --live: the two cells with runtime.processes off, then on (each scheduler and "
                         "worker a process of its own); makespan and the driver's CPU")
    ap.add_argument("--_point", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--_live", choices=["threads", "processes"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._point:
        print(json.dumps(sim_point(int(args._point[0]), int(args._point[1]), args.window)))
        return
    if args._live:
        print(json.dumps(live_run(args._live == "processes")))
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"command": "python benchmarks/cells.py " + " ".join(sys.argv[1:]), "date": datetime.date.today().isoformat(),
           "commit": commit, "machine": f"{platform.machine()}, shared 2-core"}
    if args.live and args.processes:
        # each mode in a fresh interpreter: the first run's imports and warm caches favour no one
        doc |= {"policy": LIVE_POLICY, "runs": [_fresh(["--_live", mode]) for mode in ("threads", "processes")]}
        out = args.out or "benchmarks/results/cells-processes.json"
    elif args.live:
        doc |= {"policy": LIVE_POLICY, "live": live_run()}
        print(json.dumps(doc["live"], indent=1))
        out = args.out or "benchmarks/results/cells-live.json"
    else:
        rows, skipped = [], []
        out = args.out or "benchmarks/results/cells-sim.json"
        doc |= {"policy": POLICY, "per_gpu_trajectories": PER_GPU, "max_turns": MAX_TURNS,
                "cpu_ms_per_turn": capacities(), "rows": rows, "skipped": skipped}
        for point in args.sim.split(","):
            gpus, cells = point.split(":")
            try:
                proc = subprocess.run([sys.executable, __file__, "--_point", gpus, cells, "--window", str(args.window)],
                                      capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                skipped.append({"gpus": int(gpus), "cells": int(cells), "why": f"over {args.timeout:.0f} s"})
                print(f"{gpus} GPUs, {cells} cells: over {args.timeout:.0f} s, skipped", file=sys.stderr, flush=True)
                continue
            if proc.returncode:
                sys.exit(f"error: {gpus} GPUs, {cells} cells: {proc.stderr.strip().splitlines()[-3:]}")
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(row)
            peak = max(c["turns_per_s_peak"] for c in row["per_cell"])
            print(f"{gpus} GPUs, {cells} cells: makespan {row['makespan_s']:.1f} s, {len(row['moves'])} moves, "
                  f"busiest cell peak {peak:.0f} turns/s ({row['sim_wall_s']:.0f} s wall)", file=sys.stderr, flush=True)
            Path(out).write_text(json.dumps(doc, indent=1) + "\n")  # what finished is kept
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
