"""How fast the simulator runs: one synchronous step of SWE trajectories (~20 turns each) on
simulated H200s serving Qwen3-8B, colocated, pinned to one core.

Each point runs in its own process (fresh interpreter, pinned with sched_setaffinity) and reports
wall time, CPU time, turns simulated and events, so the scaling with trajectories and GPUs can be
read off the table (near-linear: time per turn roughly constant). With --repeat N each point runs
N times and the table shows the run with the median CPU time.

An event is a timer firing on the virtual clock (prorsa/sim/clock.py `timers_fired`): the end of
a prefill step or of a decode stretch (the emulated engine skips the steps between arrivals and
finishes), the step in flight when an arrival cuts a stretch short, a KV transfer, a tool call
returning, a sample or control interval. Each is a moment the simulation advances to; the
callbacks it wakes at that moment are not counted again. Rates are per CPU second, the figure to
compare on a shared machine (wall time is the same when the core is otherwise idle).

    .venv/bin/python benchmarks/sim_speed.py [--trajectories 1024,4096] [--gpus 16,64] [--policy colocated] [--repeat 1]

With --calls it times the simulator's innermost calls instead, on the same pinned core: the cost
model's decode and mixed step times (20,000 of each, 128 contexts of 4,000 tokens and 8 prefill
chunks beside them; a simulated rollout makes ~10^6 such calls) and an emulated engine at time
scale 0 serving 1,000 requests at once (no modelled time: what is left is the engine's bookkeeping
and asyncio's scheduling, printed beside the ~20 s the same prefills would take modelled). The
tests check what these calls return; how long they take is measured here.

    .venv/bin/python benchmarks/sim_speed.py --calls [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def one_point(trajectories: int, gpus: int, policy: str) -> dict:
    from prorsa.config.pipeline import PipelineConfig
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    group = 8
    cfg = PipelineConfig.model_validate({
        "name": "sim-speed", "seed": 0, "policy": "colocated",
        "engines": {"backend": "emulated", "count": gpus, "slots": 64, "gpu": "h200", "model": "qwen3-8b"},
        "workload": {"family": "swe", "mode": "sync", "prompts": trajectories // group, "group_size": group},
    })  # fmt: skip
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    run = simulate(resolve(cfg), policy)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    s = run.summary
    return {"trajectories": trajectories, "gpus": gpus, "policy": policy, "wall_s": wall,
            "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
            "turns": s["turns"], "events": run.events, "completed": s["trajectories_completed"],
            "makespan_s": s["makespan_s"]}


def _timed(fn) -> tuple[float, float]:
    """(wall s, CPU s) of one call of fn."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, time.process_time() - cpu0


def calls(repeat: int) -> None:
    """The cost model's step times and an emulated engine at time scale 0, each the median of
    `repeat` runs (by CPU time)."""
    import asyncio

    from prorsa.costmodel import CostModel
    from prorsa.engine.base import DecodeRequest
    from prorsa.engine.emulated import EmulatedEngine
    from prorsa.roles import Role

    cost = CostModel.from_names("h200", "qwen3-8b")
    contexts, chunks = [4000] * 128, [(512, 4000)] * 8

    def cost_calls() -> None:
        for _ in range(20_000):
            cost.decode_time(contexts)
            cost.mixed_time(chunks, contexts)

    async def serve() -> None:
        engine = EmulatedEngine("e0", Role.MIXED, cost, slots=64, time_scale=0.0)
        await engine.start()
        await asyncio.gather(*[engine.generate(DecodeRequest(f"t{i}", 0, context_tokens=200 + i, max_tokens=20 + i % 7,
                                                             new_tokens=200 + i)) for i in range(1000)])
        await engine.stop()

    modelled = sum(cost.prefill_time([(200 + i, 0)]) for i in range(1000))
    for name, fn, note in (
        ("cost model: 20,000 decode_time + 20,000 mixed_time", cost_calls, ""),
        ("emulated engine, time scale 0: 1,000 requests", lambda: asyncio.run(serve()),
         f" (their prefills alone would take {modelled:.0f} s modelled)"),
    ):
        runs = sorted((_timed(fn) for _ in range(repeat)), key=lambda r: r[1])
        wall, cpu = runs[(len(runs) - 1) // 2]
        print(f"{name}: {wall:.2f} s wall, {cpu:.2f} s CPU{note}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", default="1024,4096")
    ap.add_argument("--gpus", default="16,64")
    ap.add_argument("--policy", default="colocated")
    ap.add_argument("--repeat", type=int, default=1, help="runs per point; the table shows the median")
    ap.add_argument("--core", type=int, default=0, help="the one core each point is pinned to")
    ap.add_argument("--point", help=argparse.SUPPRESS)  # internal: run one point, print JSON
    ap.add_argument("--calls", action="store_true", help="time the cost model's and the emulated engine's calls")
    args = ap.parse_args()
    if args.calls:
        os.sched_setaffinity(0, {args.core})
        calls(args.repeat)
        print("command: python benchmarks/sim_speed.py " + " ".join(sys.argv[1:]))
        return
    if args.point:
        os.sched_setaffinity(0, {args.core})
        n, g = (int(x) for x in args.point.split(","))
        print(json.dumps(one_point(n, g, args.policy)))
        return

    from rich.console import Console
    from rich.table import Table

    rows = []
    for n in (int(x) for x in args.trajectories.split(",")):
        for g in (int(x) for x in args.gpus.split(",")):
            runs = []
            for _ in range(args.repeat):
                out = subprocess.run([sys.executable, __file__, "--point", f"{n},{g}", "--policy", args.policy,
                                      "--core", str(args.core)], capture_output=True, text=True, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = sorted(runs, key=lambda x: x["cpu_s"])[(len(runs) - 1) // 2]  # the median run
            r["cpu_all"] = [x["cpu_s"] for x in runs]
            rows.append(r)
            print(f"{n} trajectories on {g} GPUs: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU "
                  f"(CPU s of each run: {', '.join(f'{c:.1f}' for c in r['cpu_all'])})", file=sys.stderr)
    title = f"simulator speed, one sync SWE step, policy {args.policy}, one core"
    if args.repeat > 1:
        title += f", median of {args.repeat} runs"
    table = Table(title=title)
    for col in ("trajectories", "GPUs", "turns", "events", "wall s", "CPU s", "turns/s", "events/s", "us/turn",
                "makespan (body s)"):
        table.add_column(col, justify="right")
    for r in rows:
        cpu = r["cpu_s"]
        table.add_row(str(r["trajectories"]), str(r["gpus"]), f"{r['turns']:,}", f"{r['events']:,}",
                      f"{r['wall_s']:.1f}", f"{cpu:.1f}", f"{r['turns'] / cpu:,.0f}", f"{r['events'] / cpu:,.0f}",
                      f"{1e6 * cpu / r['turns']:.0f}", f"{r['makespan_s']:.0f}")
    Console(width=160).print(table)
    print("turns/s, events/s and us/turn are per CPU second")
    print("command: python benchmarks/sim_speed.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
