"""The controller's own cost at scale: the scheduler plugin's transition hook and the control
step (one scheduler call for events and loads, then the policy's forecast and plan), as shares of
the CPU of the process that holds scheduler, workers and driver.

An async `search` workload on emulated engines at time scale 0 (no engine time, no tool time), so
the control plane is all there is; --concurrency trajectories in flight, twice that many in all.

    .venv/bin/python benchmarks/controller_cost.py [--concurrency 1024] [--engines 8] [--policy prorsa]
                                                   [--interval 1.0] [--cpu-share 0.05]

With --predict it times the forecast alone instead: Forecaster.predict over --concurrency tracked
trajectories in random phases (five families, a trained forecaster, caches warm), the CPU time of
each of --repeat calls with one trajectory's event applied between them; the target is under 5 ms
at 1024 (2-3 ms on this machine).

    .venv/bin/python benchmarks/controller_cost.py --predict [--concurrency 1024] [--repeat 9]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import resource
import sys
import tempfile
from pathlib import Path


def predict_cost(args) -> None:
    import statistics
    import time

    import numpy as np

    from prorsa.control.forecast import Forecaster
    from prorsa.control.lifecycle import LifecycleEvent as E
    from prorsa.control.lifecycle import LifecycleTracker, Phase

    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()

    def feed(events) -> None:
        for ev in events:
            fc.observe(ev)
            tr.apply(ev)

    train = []  # 20 two-turn trajectories, all alike, so the forecaster has learned something
    for i in range(20):
        tid = f"train-{i}"
        train += [E(0.0, tid, "f", 0, Phase.QUEUED, 500), E(0.1, tid, "f", 0, Phase.DECODE, 0, 0),
                  E(1.1, tid, "f", 0, Phase.TOOL, 100, 0), E(2.3, tid, "f", 1, Phase.QUEUED, 100, 600),
                  E(2.4, tid, "f", 1, Phase.DECODE), E(3.4, tid, "f", 1, Phase.DONE, 100)]
    feed(sorted(train, key=lambda e: e.time_s))
    rng = np.random.default_rng(1)
    phases = [Phase.QUEUED, Phase.PREFILL, Phase.DECODE, Phase.TOOL]
    fams = ["swe", "search", "math-tir", "terminal", "f"]
    feed([E(float(rng.uniform(0, 10)), f"t{i}", fams[i % 5], int(rng.integers(0, 20)), phases[int(rng.integers(0, 4))],
            int(rng.integers(1, 3000)), int(rng.integers(0, 30000))) for i in range(args.concurrency)])
    fc.predict(10.0, tr)  # warm the caches once
    times = []
    for k in range(args.repeat):
        tr.apply(E(10.0 + k, "t0", "swe", 99 + k, Phase.QUEUED, 10))
        t0 = time.process_time()  # CPU time: a busy machine stretches wall time, not this
        fc.predict(10.0 + k, tr)
        times.append(time.process_time() - t0)
    print(f"Forecaster.predict over {args.concurrency} trajectories: median {statistics.median(times) * 1e3:.1f} ms "
          f"of CPU (min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}; {args.repeat} calls; "
          "target < 5 ms at 1024)")
    print("command: python benchmarks/controller_cost.py " + " ".join(sys.argv[1:]))


def main(args) -> None:
    if args.predict:
        return predict_cost(args)
    from rich.console import Console
    from rich.table import Table

    from prorsa.config.pipeline import PipelineConfig
    from prorsa.live.run import run_live
    from prorsa.rollout.context import resolve
    from prorsa.sim.run import lend

    cfg = PipelineConfig.model_validate({
        "name": "controller-cost", "seed": 1, "policy": args.policy,
        "engines": {"backend": "emulated", "count": args.engines, "slots": 256, "time_scale": 0.0},
        "workload": {"family": "search", "mode": "async", "concurrency": args.concurrency,
                     "trajectories": 2 * args.concurrency, "tool_time_scale": 0.0, "max_turns": 4},
        "runtime": {"metrics_interval_s": 1.0, "control_interval_s": args.interval, "dashboard_address": None,
                    "control_cpu_share": args.cpu_share},
    })  # fmt: skip
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    with tempfile.TemporaryDirectory() as run_dir:
        summary = asyncio.run(run_live(resolve(cfg), Path(run_dir), Console(file=io.StringIO()), lend=lend))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    ctl = summary["control"]

    table = Table(title=f"controller cost, {args.concurrency} concurrent trajectories, policy {args.policy}")
    for col in ("what", "figure"):
        table.add_column(col, justify="right")
    table.add_row("trajectories completed", f"{summary['trajectories_completed']} / {summary['trajectories_expected']}")
    table.add_row("turns", str(summary["turns"]))
    table.add_row("run (makespan)", f"{summary['makespan_s']:.1f} s")
    table.add_row("process CPU", f"{cpu:.1f} s")
    table.add_row("plugin hook", f"{ctl['plugin_s']:.3f} s for {ctl['plugin_calls']} transitions "
                  f"({ctl['plugin_s'] / max(ctl['plugin_calls'], 1) * 1e6:.1f} us each)")
    table.add_row("plugin share of CPU", f"{ctl['plugin_s'] / cpu * 100:.2f}% (goal < 5%)")
    table.add_row("control step, median", f"{(ctl['step_s_median'] or 0) * 1000:.1f} ms of wall time, "
                  f"{(ctl['step_cpu_s_median'] or 0) * 1000:.1f} ms of CPU, x {ctl['intervals']} steps")
    table.add_row("control steps' share of CPU", f"{ctl['step_cpu_s'] / cpu * 100:.2f}% "
                  f"(policy, scheduler call and loop; at most {args.cpu_share * 100:g}% of a core by design)")
    Console().print(table)
    print("command: python benchmarks/controller_cost.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=1024)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--policy", default="prorsa")
    ap.add_argument("--interval", type=float, default=1.0, help="control interval, seconds")
    ap.add_argument("--cpu-share", type=float, default=0.05, help="runtime.control_cpu_share")
    ap.add_argument("--predict", action="store_true", help="time Forecaster.predict alone")
    ap.add_argument("--repeat", type=int, default=9, help="with --predict: calls timed")
    main(ap.parse_args())
