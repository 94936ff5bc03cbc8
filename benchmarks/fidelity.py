"""The simulator against the live Dask runtime: the same replayed workload, policy and emulated
engines, once on a real LocalCluster in (time-scaled) wall time and once in virtual time.

The live makespan is divided by the time scale to compare in the cost model's seconds. The gap is
what the simulator leaves out: Dask's scheduling of every leg and the driver's own work, which a
shorter time scale magnifies. Goal: within 5%.

    .venv/bin/python benchmarks/fidelity.py [--time-scale 0.2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import tempfile
from pathlib import Path

CASES = [  # (label, family, model, ep, engines, slots, policy)
    ("swe dense colocated", "swe", "qwen3-8b", 1, 4, 32, "colocated"),
    ("swe dense 1:3", "swe", "qwen3-8b", 1, 4, 32, "static:1:3"),
    ("search MoE EP4 1:3", "search", "qwen3-30b-a3b", 4, 4, 64, "static:1:3"),
    ("swe MoE EP4 prorsa", "swe", "qwen3-30b-a3b", 4, 4, 64, "prorsa"),
]


def config(family: str, model: str, ep: int, engines: int, slots: int, policy: str, scale: float):
    from prorsa.config.pipeline import PipelineConfig

    return PipelineConfig.model_validate({
        "name": "fidelity", "seed": 2, "policy": policy,
        "engines": {"backend": "emulated", "count": engines, "slots": slots, "model": model, "ep": ep,
                    "time_scale": scale},
        "workload": {"family": family, "mode": "sync", "prompts": 8, "group_size": 8, "max_turns": 8,
                     "tool_time_scale": scale},  # one clock for tools and engines
        "runtime": {"control_interval_s": scale, "metrics_interval_s": 0.5, "dashboard_address": None},
    })  # fmt: skip


def live_run(cfg) -> dict:
    from rich.console import Console

    from prorsa.rollout.context import time_unit
    from prorsa.rollout.live import run_live

    with tempfile.TemporaryDirectory() as d:
        summary = asyncio.run(run_live(cfg, Path(d), Console(file=io.StringIO())))
    assert summary["trajectories_failed"] == 0
    return summary | {"body_makespan_s": summary["makespan_s"] / time_unit(cfg)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-scale", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from prorsa.sim.run import simulate

    table = Table(title=f"simulator vs live LocalCluster, emulated engines at time scale {args.time_scale} "
                        f"(makespan in cost-model seconds, median of {args.repeats})")
    for col in ("case", "live", "sim", "sim / live", "switches live / sim"):
        table.add_column(col, justify="left" if col == "case" else "right")
    worst = 0.0
    for label, family, model, ep, engines, slots, policy in CASES:
        cfg = config(family, model, ep, engines, slots, policy, args.time_scale)
        sim = simulate(cfg)
        runs = [live_run(cfg) for _ in range(args.repeats)]
        live = statistics.median(r["body_makespan_s"] for r in runs)
        live_switches = "/".join(str(r["role_switches"]) for r in runs)
        ratio = sim.makespan_s / live
        worst = max(worst, abs(ratio - 1))
        table.add_row(label, f"{live:.2f}", f"{sim.makespan_s:.2f}", f"{ratio:.3f}", f"{live_switches} / {sim.summary['role_switches']}")
        print(f"{label}: live {live:.2f} s, sim {sim.makespan_s:.2f} s", file=sys.stderr)
    Console().print(table)
    print(f"largest gap {worst:.1%} (goal: within 5%)")
    print("command: python benchmarks/fidelity.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
