"""The simulator against the live Dask runtime: the same replayed workload, policy and emulated
engines, once on a real LocalCluster in (time-scaled) wall time and once in virtual time.

The live makespan is divided by the time scale to compare in the cost model's seconds. The gap is
what the simulator leaves out: Dask's scheduling of every leg and the driver's own work, which a
shorter time scale magnifies. Goal: within 5%.

That cost belongs to the host, not to the hardware profile, so it is also measured: the live runs
of one case (--fit-on, the first by default) correct the profile as `prorsa calibrate --from-run`
does (time per leg outside the engines, a KV pull's fixed cost, the engines' share of their speed),
and every case is simulated again with that profile. The other cases are held out.

    .venv/bin/python benchmarks/fidelity.py [--time-scale 0.2] [--repeats 1] [--fit-on "swe dense colocated"]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
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


def live_run(cfg) -> tuple[dict, list[dict]]:
    """The run's summary (with its makespan in body seconds) and its trajectory records."""
    import pyarrow.parquet as pq
    from rich.console import Console

    from prorsa.rollout.context import time_unit
    from prorsa.live.run import run_live
    from prorsa.rollout.context import resolve
    from prorsa.sim.run import lend

    with tempfile.TemporaryDirectory() as d:
        summary = asyncio.run(run_live(resolve(cfg), Path(d), Console(file=io.StringIO()), lend=lend))
        rows = pq.read_table(Path(d) / "trajectories.parquet").to_pylist()
    assert summary["trajectories_failed"] == 0
    return summary | {"body_makespan_s": summary["makespan_s"] / time_unit(cfg)}, rows


def fit_host(cfg, rows: list[dict], workdir: Path) -> tuple[str, str]:
    """(profile path, one line on the fit): cfg's profile corrected to its live runs' records."""
    from prorsa.calibration.from_runs import describe, fit_to_run, fitted_profile

    fits = fit_to_run(cfg, rows, workdir)
    g = fits[-1].gpu
    return str(fitted_profile(cfg, workdir)), (
        f"{describe(fits)[-1]}; fitted: {g.dispatch_latency_s * 1e3:.1f} ms a leg outside the engines, "
        f"{g.net_latency_s * 1e3:.1f} ms a KV pull, {len(fits)} corrections")


def with_gpu(cfg, gpu: str):
    return cfg.model_copy(update={"engines": cfg.engines.model_copy(update={"gpu": gpu})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-scale", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--fit-on", default=CASES[0][0], choices=[c[0] for c in CASES],
                    help="the case whose live runs the host's costs are fitted on")
    ap.add_argument("--out", default="benchmarks/results/fidelity.json")
    args = ap.parse_args()
    # a LocalCluster's workers log their own teardown at INFO, tracebacks included: not our figures
    # (after distributed's import, which sets its loggers' levels from its config)
    import distributed  # noqa: F401

    logging.getLogger("distributed").setLevel(logging.WARNING)

    from rich.console import Console
    from rich.table import Table

    from prorsa.sim.run import simulate

    from prorsa.rollout.context import resolve

    # the fitted case first: every other case is simulated with what it measured
    cases = sorted(CASES, key=lambda c: c[0] != args.fit_on)
    table = Table(title=f"simulator vs live LocalCluster, emulated engines at time scale {args.time_scale} "
                        f"(makespan in cost-model seconds, median of {args.repeats})")
    for col in ("case", "live", "sim", "sim / live", "sim, host fitted", "fitted / live", "switches live / sim"):
        table.add_column(col, justify="left" if col == "case" else "right")
    worst, worst_fitted, fitted_gpu, fit_line, results = 0.0, 0.0, None, "", []
    with tempfile.TemporaryDirectory() as tmp:
        for label, family, model, ep, engines, slots, policy in cases:
            cfg = config(family, model, ep, engines, slots, policy, args.time_scale)
            sim = simulate(resolve(cfg))
            runs = [live_run(cfg) for _ in range(args.repeats)]
            live = statistics.median(summary["body_makespan_s"] for summary, _ in runs)
            if fitted_gpu is None:
                fitted_gpu, fit_line = fit_host(cfg, [row for _, rows in runs for row in rows], Path(tmp))
            fitted = simulate(resolve(with_gpu(cfg, fitted_gpu))).makespan_s
            live_switches = "/".join(str(summary["role_switches"]) for summary, _ in runs)
            ratio, ratio_fitted = sim.makespan_s / live, fitted / live
            worst = max(worst, abs(ratio - 1))
            if label != args.fit_on:
                worst_fitted = max(worst_fitted, abs(ratio_fitted - 1))
            table.add_row(label + (" (fitted on)" if label == args.fit_on else ""), f"{live:.2f}",
                          f"{sim.makespan_s:.2f}", f"{ratio:.3f}", f"{fitted:.2f}", f"{ratio_fitted:.3f}",
                          f"{live_switches} / {sim.summary['role_switches']}")
            print(f"{label}: live {live:.2f} s, sim {sim.makespan_s:.2f} s, host fitted {fitted:.2f} s", file=sys.stderr)
            results.append({"case": label, "live_s": [summary["body_makespan_s"] for summary, _ in runs],
                            "live_median_s": live, "sim_s": sim.makespan_s, "sim_host_fitted_s": fitted,
                            "ratio": ratio, "ratio_host_fitted": ratio_fitted, "fitted_on": label == args.fit_on})
    Console().print(table)
    print(f"host fit on {args.fit_on}: {fit_line}")
    print(f"largest gap {worst:.1%}; with the host fitted, held-out cases {worst_fitted:.1%} (goal: within 5%)")
    command = "python benchmarks/fidelity.py " + " ".join(sys.argv[1:])
    Path(args.out).write_text(json.dumps({"command": command, "time_scale": args.time_scale, "repeats": args.repeats,
                                          "host_fit": fit_line, "cases": results}, indent=1) + "\n")
    print(f"command: {command}; results in {args.out}")


if __name__ == "__main__":
    main()
