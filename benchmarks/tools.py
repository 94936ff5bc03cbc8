"""Tool throughput and sandbox start latency, in one process (the library, before Dask).

- start latency: one sandboxed `python` call at a time running `pass`, end to end (scratch dir,
  namespaces, rlimits, interpreter start, teardown); bare `python -I [-S] -c pass` spawns beside
  it show what the sandbox adds to starting an interpreter (the launcher runs with -S);
- sustained calls/s: --calls sandboxed calls of a short program with --concurrency of them in
  flight at once; the calculator and BM25 search (the generated corpus) for comparison.

    .venv/bin/python benchmarks/tools.py [--latency-calls 100] [--calls 200] [--concurrency 1,2,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def bare_spawn(n: int, flags: tuple[str, ...]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(sys.executable, *flags, "-c", "pass")
        await proc.wait()
        out.append(time.perf_counter() - t0)
    return out


async def sandbox_latency(tool, n: int) -> list[float]:
    from prorsa.agent.tools import ToolStatus, call_tool

    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        res = await call_tool(tool, {"code": "pass"})
        assert res.status is ToolStatus.OK, res.observation
        out.append(time.perf_counter() - t0)
    return out


async def sustained(tool, args: dict, calls: int, concurrency: int) -> tuple[float, int]:
    from prorsa.agent.tools import ToolStatus, call_tool

    sem = asyncio.Semaphore(concurrency)
    failed = 0

    async def one():
        nonlocal failed
        async with sem:
            res = await call_tool(tool, args)
            failed += res.status is not ToolStatus.OK

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    return calls / (time.perf_counter() - t0), failed


async def main(args) -> None:
    from rich.console import Console
    from rich.table import Table

    from prorsa.agent.tools import SandboxLimits, make_tool

    python = make_tool("python", limits=SandboxLimits(wall_s=30.0))
    await sandbox_latency(python, 3)  # warm the page cache and the import path
    bare = {flags: await bare_spawn(args.latency_calls, flags) for flags in (("-I",), ("-I", "-S"))}
    lat = await sandbox_latency(python, args.latency_calls)

    table = Table(title=f"sandbox start latency, {args.latency_calls} sequential calls, {os.cpu_count()} cores")
    for col in ("what", "median ms", "p99 ms"):
        table.add_column(col, justify="right")
    for flags, xs in bare.items():
        table.add_row(f"bare `python {' '.join(flags)} -c pass`", f"{statistics.median(xs) * 1e3:.1f}",
                      f"{_pct(xs, 0.99) * 1e3:.1f}")
    table.add_row("sandboxed `python` tool call", f"{statistics.median(lat) * 1e3:.1f}", f"{_pct(lat, 0.99) * 1e3:.1f}")
    Console().print(table)

    program = {"code": "print(sum(i * i for i in range(10000)))"}
    table = Table(title=f"sustained tool calls/s, {args.calls} calls each")
    for col in ("tool", "in flight", "calls/s", "failed"):
        table.add_column(col, justify="right")
    for c in args.concurrency:
        rate, failed = await sustained(python, program, args.calls, c)
        table.add_row("python (sandboxed)", str(c), f"{rate:.1f}", str(failed))
    calc, search = make_tool("calculator"), make_tool("search")
    rate, failed = await sustained(calc, {"expression": "factorial(20) / 7 + sqrt(2)"}, 20 * args.calls, 1)
    table.add_row("calculator", "1", f"{rate:.0f}", str(failed))
    rate, failed = await sustained(search, {"query": "province capital export"}, 5 * args.calls, 1)
    table.add_row("search (BM25, 302 docs)", "1", f"{rate:.0f}", str(failed))
    Console().print(table)
    print("command: .venv/bin/python benchmarks/tools.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency-calls", type=int, default=100)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    asyncio.run(main(ap.parse_args()))
