"""Control-plane throughput: turns/s the Dask runtime sustains with no engine time, vs bare Dask.

For each concurrency (trajectories in flight) it runs, side by side and interleaved per repeat:
  prorsa/<shape>   Prorsa's live runtime, emulated engines at time_scale 0, tools at 0 s
  bare/<shape>     the same task shape (turn task on a tool worker; prefill and decode tasks on
                   role-tagged engine workers) with no-op functions and no Prorsa code
and prints medians, the ratio prorsa/bare (goal >= 0.9), tasks per turn and the peak RSS of the
driver process (which hosts the in-process scheduler and workers, as `prorsa run` does).
Each measurement runs in a fresh subprocess so peak memory is its own.

    .venv/bin/python benchmarks/control_plane.py [--sizes 64,256,1024] [--repeats 3] [--turns 4]

With --processes ENGINES the Prorsa side runs as on a real cluster instead: the scheduler in its own
process (`dask scheduler`), every engine and the tool worker a `dask worker` process of its own,
joined through the cluster file's `address` kind; it also reports the scheduler's and the driver's
CPU per turn (no bare Dask side). Sizes are trajectories in flight, as above. Beside the whole
run's CPU (from the workers' start, IDLE_S s idle included) it stores each process's CPU from the
moment every worker had joined and the run's wall time, which benchmarks/scale.py splits into a
background share of a core and a cost a turn, and the scheduler's share of a core over IDLE_S s
with every worker joined and no work (heartbeats, periodic callbacks), as a check on that split.

    .venv/bin/python benchmarks/control_plane.py --processes 8 [--sizes 256,1024] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENGINES, SLOTS, TOOL_THREADS = 3, 64, 64
IDLE_S = 10.0  # --processes: seconds the scheduler's idle CPU is read over, every worker joined


def _bare_cluster_specs():
    from distributed import Worker

    specs = {}
    for i, (p, d) in enumerate([(SLOTS, 0), (SLOTS, 0), (0, SLOTS)]):
        specs[f"engine-{i}"] = {"cls": Worker, "options": {
            "nthreads": SLOTS, "resources": {"prefill": p, "decode": d, "env": 0}, "dashboard": False}}
    specs["tools-0"] = {"cls": Worker, "options": {
        "nthreads": TOOL_THREADS, "resources": {"prefill": 0, "decode": 0, "env": TOOL_THREADS},
        "dashboard": False}}
    return specs


async def _noop_async(*args):
    return args[-1] if args else None


def _noop(*args):
    return None


def _bare_turn(t, k):
    from distributed import get_client, secede

    client = get_client()
    pf = client.submit(_noop_async, t, k, key=f"prefill-{t}-{k}", resources={"prefill": 1}, pure=False)
    df = client.submit(_noop_async, pf, key=f"decode-{t}-{k}", resources={"decode": 1}, pure=False)
    secede()
    return df.result()


async def bare(n: int, turns: list[int], shape: str) -> float:
    import asyncio

    import dask
    from distributed import Client, Scheduler, SpecCluster

    scheduler = {"cls": Scheduler, "options": {"dashboard": False}}
    async with SpecCluster(workers=_bare_cluster_specs(), scheduler=scheduler, asynchronous=True) as cluster, \
            Client(cluster, asynchronous=True) as client:

        async def trajectory(t: int) -> None:
            for k in range(turns[t]):
                with dask.annotate(traj=t, turn=k, phase="turn"):
                    if shape == "in_task":
                        fut = client.submit(_bare_turn, t, k, key=f"turn-{t}-{k}", resources={"env": 1}, pure=False)
                    else:
                        pf = client.submit(_noop_async, t, k, key=f"prefill-{t}-{k}", resources={"prefill": 1}, pure=False)
                        df = client.submit(_noop_async, pf, key=f"decode-{t}-{k}", resources={"decode": 1}, pure=False)
                        fut = client.submit(_noop, df, key=f"turn-{t}-{k}", resources={"env": 1}, pure=False)
                await fut

        t0 = time.perf_counter()
        await asyncio.gather(*(trajectory(t) for t in range(n)))
        return time.perf_counter() - t0


def _pipeline(n: int, turns: int, shape: str):
    from prorsa.config.pipeline import PipelineConfig

    return PipelineConfig.model_validate({
        "name": f"cp-{n}", "policy": "static:2:1",
        "engines": {"backend": "emulated", "count": ENGINES, "slots": SLOTS, "time_scale": 0.0},
        "workload": {"family": "search", "mode": "sync", "prompts": n // 4, "group_size": 4,
                     "max_turns": turns, "tool_time_scale": 0.0},
        "runtime": {"turn_shape": shape, "tool_threads": TOOL_THREADS, "dashboard_address": None,
                    "metrics_interval_s": 1.0},
    })


def turn_counts(n: int, turns: int) -> list[int]:
    from prorsa.agent.workload import Workload

    cfg = _pipeline(n, turns, "in_task")
    return [len(s.turns) for s in Workload.from_config(cfg.workload, cfg.seed).trajectories_for_step(0)]


async def prorsa(n: int, turns: int, shape: str) -> tuple[float, int]:
    import tempfile
    from pathlib import Path

    from rich.console import Console

    from prorsa.live.run import run_live
    from prorsa.rollout.context import resolve

    from prorsa.sim.run import lend

    with tempfile.TemporaryDirectory() as d:
        summary = await run_live(resolve(_pipeline(n, turns, shape)), Path(d), Console(quiet=True), lend=lend)
    return summary["makespan_s"], summary["turns"]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, timeout_s: float = 120.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


async def prorsa_processes(n: int, turns: int, shape: str, engines: int) -> dict:
    """Prorsa's runtime with the scheduler and every worker in processes of their own; the
    scheduler's CPU (psutil) and this driver's (getrusage) over the run, per turn."""
    import asyncio
    import tempfile

    import psutil
    from distributed import Client
    from rich.console import Console

    from prorsa.config.cluster import AddressSpec
    from prorsa.live.run import run_live
    from prorsa.rollout.context import resolve
    from prorsa.sim.run import lend

    cfg = _pipeline(n, turns, shape)
    p = max(engines // 3, 1)
    cfg = cfg.model_copy(update={"policy": f"static:{p}:{engines - p}",
                                 "engines": cfg.engines.model_copy(update={"count": engines})})
    address = f"tcp://127.0.0.1:{_free_port()}"
    cli = [sys.executable, "-m"]
    procs = [subprocess.Popen([*cli, "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                               address.rsplit(":", 1)[1], "--no-dashboard"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    workers = [(f"engine-{i}", f"prefill={SLOTS},decode=0,env=0", SLOTS) for i in range(engines)]
    workers.append(("tools-0", f"prefill=0,decode=0,env={TOOL_THREADS}", TOOL_THREADS))
    try:
        _wait_for_port(int(address.rsplit(":", 1)[1]))  # a loaded machine starts it slower than a client waits
        for name, res, threads in workers:
            procs.append(subprocess.Popen(
                [*cli, "distributed.cli.dask_worker", address, "--name", name, "--nthreads", str(threads),
                 "--resources", res, "--no-dashboard", "--no-nanny"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        sched = psutil.Process(procs[0].pid)
        me0, s0 = resource.getrusage(resource.RUSAGE_SELF), sched.cpu_times()
        async with Client(address, asynchronous=True) as probe:  # every worker joined: the run's share starts
            await probe.wait_for_workers(len(workers), timeout=600)
        # the scheduler's CPU with every worker joined and no work: heartbeats and its periodic
        # callbacks, a share of a core that grows with workers and wall time, not with turns
        si, ti = sched.cpu_times(), time.perf_counter()
        await asyncio.sleep(IDLE_S)
        sj, tj = sched.cpu_times(), time.perf_counter()
        mej = resource.getrusage(resource.RUSAGE_SELF)
        with tempfile.TemporaryDirectory() as d:
            summary = await run_live(resolve(cfg), Path(d), Console(quiet=True), cluster=AddressSpec(address=address), lend=lend)
            me1, s1 = resource.getrusage(resource.RUSAGE_SELF), sched.cpu_times()
        run_wall = time.perf_counter() - tj
        sched_rss_mib = sched.memory_info().rss / 2**20
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a worker still closing on a loaded machine
                proc.kill()
                proc.wait()
    turns_done = summary["turns"]

    def rusage_s(a, b) -> float:
        return (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)

    def times_s(a, b) -> float:
        return (b.user - a.user) + (b.system - a.system)

    driver, scheduler = rusage_s(me0, me1), times_s(s0, s1)
    # the run alone: from the moment every worker had joined (the run's own start, engines included)
    driver_run, scheduler_run = rusage_s(mej, me1), times_s(sj, s1)
    return {"seconds": summary["makespan_s"], "turns": turns_done, "turns_per_s": turns_done / summary["makespan_s"],
            "engines": engines, "scheduler_cpu_ms_per_turn": 1e3 * scheduler / turns_done,
            "driver_cpu_ms_per_turn": 1e3 * driver / turns_done,
            "scheduler_cpu_s": scheduler, "driver_cpu_s": driver,
            "scheduler_cpu_s_after_join": scheduler_run, "driver_cpu_s_after_join": driver_run,
            "scheduler_idle_cpu_share": times_s(si, sj) / (tj - ti), "run_wall_s": run_wall,
            "scheduler_rss_mib": sched_rss_mib,
            "trajectories_completed": summary["trajectories_completed"]}


def one(kind: str, shape: str, n: int, turns: int) -> dict:
    import asyncio

    counts = turn_counts(n, turns)
    if kind.startswith("processes:"):
        r = asyncio.run(prorsa_processes(n, turns, shape, int(kind.split(":")[1])))
        return {**r, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if kind == "bare":
        secs, total = asyncio.run(bare(n, counts, shape)), sum(counts)
    else:
        secs, total = asyncio.run(prorsa(n, turns, shape))
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": secs, "turns": total, "turns_per_s": total / secs, "peak_mib": peak_mib}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,256,1024")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4, help="turn cap per trajectory")
    ap.add_argument("--shapes", default="in_task,driver")
    ap.add_argument("--processes", default="", metavar="ENGINES",
                    help="engine counts (8,16): scheduler and workers in processes of their own")
    ap.add_argument("--out", default="", help="with --processes: store the results here (JSON)")
    ap.add_argument("--_one", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._one:
        kind, shape, n, turns = args._one
        print(json.dumps(one(kind, shape, int(n), int(turns))))
        return
    if args.processes:
        processes(args)
        return

    from rich.console import Console
    from rich.table import Table

    sizes = [int(s) for s in args.sizes.split(",")]
    shapes = args.shapes.split(",")
    results: dict[tuple, list[dict]] = {}
    for n in sizes:
        for rep in range(args.repeats):
            for shape in shapes:
                for kind in ("prorsa", "bare"):
                    out = subprocess.run(
                        [sys.executable, __file__, "--_one", kind, shape, str(n), str(args.turns)],
                        capture_output=True, text=True, check=True)
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    results.setdefault((n, shape, kind), []).append(r)
                    print(f"n={n} rep={rep} {kind}/{shape}: {r['turns_per_s']:.1f} turns/s", file=sys.stderr)

    table = Table(title="control plane: turns/s, emulated engines at time_scale 0 (median of repeats)")
    for col in ("trajectories", "shape", "prorsa turns/s", "bare turns/s", "ratio", "tasks/turn",
                "prorsa peak MiB", "bare peak MiB"):
        table.add_column(col, justify="right")
    for n in sizes:
        for shape in shapes:
            p, b = results[(n, shape, "prorsa")], results[(n, shape, "bare")]
            pt = statistics.median(r["turns_per_s"] for r in p)
            bt = statistics.median(r["turns_per_s"] for r in b)
            table.add_row(str(n), shape, f"{pt:.1f}", f"{bt:.1f}", f"{pt / bt:.2f}", "3",
                          f"{statistics.median(r['peak_mib'] for r in p):.0f}",
                          f"{statistics.median(r['peak_mib'] for r in b):.0f}")
    console = Console()
    console.print(table)
    console.print("command: " + " ".join(["python", "benchmarks/control_plane.py", *sys.argv[1:]]))


def processes(args) -> None:
    """--processes: per engine count and size, Prorsa with the scheduler and workers apart."""
    import datetime
    import platform

    rows = []
    for engines in (int(e) for e in args.processes.split(",")):
        for n in (int(s) for s in args.sizes.split(",")):
            for shape in args.shapes.split(","):
                runs = []
                for rep in range(args.repeats):
                    out = subprocess.run([sys.executable, __file__, "--_one", f"processes:{engines}", shape, str(n),
                                          str(args.turns)], capture_output=True, text=True)
                    if out.returncode:
                        sys.exit(f"error: engines={engines} n={n} failed: {out.stderr.strip().splitlines()[-1:]}")
                    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                    print(f"engines={engines} n={n} {shape} rep={rep}: {runs[-1]['turns_per_s']:.1f} turns/s, "
                          f"scheduler {runs[-1]['scheduler_cpu_ms_per_turn']:.2f} ms/turn, "
                          f"driver {runs[-1]['driver_cpu_ms_per_turn']:.2f} ms/turn", file=sys.stderr)
                rows.append({"engines": engines, "trajectories": n, "shape": shape, "runs": runs})
    command = " ".join(["python", "benchmarks/control_plane.py", *sys.argv[1:]])
    print("command: " + command)
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        doc = {"command": command, "date": datetime.date.today().isoformat(), "commit": commit,
               "machine": f"{platform.machine()}, shared 2-core", "turn_cap": args.turns, "rows": rows}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
