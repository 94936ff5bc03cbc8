"""Demand that changes faster than trajectories finish: a search for a setting where switching
roles during a run beats every fixed split, in the simulator.

An asynchronous rollout replays a trace whose trajectories come in blocks of two kinds, started
in trace order as slots free up, so the engines see one kind, then the other, then the first again:

    prefill-heavy   4 turns, each appending --long tokens (a document, a big tool return) and
                    decoding 64: wants many prefill engines
    decode-heavy    4 turns, each appending 256 tokens and decoding --decode: wants many decode
                    engines

8 engines of Qwen3-30B-A3B (DP-attention groups of --ep ranks, where one rank's prefill stalls the
group's decodes, so colocation pays), H200. prorsa and the oracle (prorsa's allocator fed the true
future) against every fixed split: colocated and each P:D:M of prefill, decode and mixed engines
(42 of them). A fixed split must suit both kinds at once; prorsa may move engines at each block's
edge. Throughput in trajectories/s, ratios against colocated and the best fixed split in
hindsight (marked); the table lists colocated, the five best splits, prorsa and the oracle, the
results file every split.

    .venv/bin/python benchmarks/phases.py [--blocks 4] [--block 128] [--long 8192] [--decode 2048]
                                          [--ep 4] [--jitter 0] [--sticky-overload cost|2|none]
                                          [--workers 2] [--reuse FILE [--rerun prorsa,oracle]]

--jitter F draws each turn's decode within F of its kind's either side: with 0 every trajectory of
a block is the same, and colocated runs each block in lockstep (see priors.py --jitter).

--reuse FILE keeps FILE's rows of the fixed splits and simulates only the policies of --rerun
(default prorsa and the oracle), after simulating colocated again: a FILE whose colocated row no
longer reproduces (the simulator changed since) is refused, and nothing is written.

--sticky-overload picks the router's rule for leaving a trajectory's engines (a turn that leaves
recomputes its whole context): cost, the default, moves a turn only when the cost model prices
the wait it avoids above that recompute; 2, when its engines carry twice the least-loaded one's
turns (the default before); none, never for load.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from multiprocessing import Pool
from pathlib import Path

from paper import reuse_holds

ENGINES = 8
# every fixed split of the 8 engines into prefill, decode and mixed ones, colocated (all mixed) first
FIXED = ["colocated"] + [f"static:{p}:{d}" + (f":{m}" if m else "")
                         for p in range(ENGINES + 1) for d in range(ENGINES + 1 - p)
                         for m in [ENGINES - p - d] if 0 < m < ENGINES or (m == 0 and p and d)]
POLICIES = [*FIXED, "prorsa", "oracle"]


def write_phase_trace(path: Path, blocks: int, block: int, long: int, decode: int, tool_s: float,
                      first: str = "prefill-heavy", jitter: float = 0.0) -> None:
    """`jitter` > 0: each turn decodes a count drawn uniformly within that share either side of
    its kind's (seeded by the trajectory's place in the trace). With none, every trajectory of a
    block is the same, so a policy that treats them alike runs each block in lockstep."""
    import random

    from prorsa.agent.trace import TrajectorySpec, TurnSpec, write_trace

    kinds = {"prefill-heavy": (long, 64), "decode-heavy": (256, decode)}
    other = "decode-heavy" if first == "prefill-heavy" else "prefill-heavy"
    trajectories = []
    for b in range(blocks):
        family = first if b % 2 == 0 else other
        appended, decoded = kinds[family]
        for i in range(block):
            n = b * block + i
            draw = random.Random(n)
            turns = tuple(TurnSpec(appended, max(1, round(decoded * (1 + jitter * draw.uniform(-1, 1)))),
                                   tool_s if t < 3 else 0.0, t == 3) for t in range(4))
            trajectories.append(TrajectorySpec(f"b{b}-t{i}", family, n, 0, 0, turns, seed=n))
    write_trace(path, trajectories)


def config(trace: Path, ep: int, concurrency: int, trajectories: int, sticky_overload: float | str | None = "cost"):
    from prorsa.config.pipeline import PipelineConfig

    return PipelineConfig.model_validate({
        "name": "phases", "seed": 0, "policy": "colocated",
        "engines": {"backend": "emulated", "count": ENGINES, "slots": 32 * ep, "gpu": "h200",
                    "model": "qwen3-30b-a3b", "ep": ep},
        "workload": {"trace": str(trace), "mode": "async", "concurrency": concurrency,
                     "trajectories": trajectories},
        "runtime": {"sticky_overload": sticky_overload},
    })  # fmt: skip


def run(job: tuple) -> tuple:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    trace, ep, concurrency, trajectories, overload, policy = job
    s = simulate(resolve(config(Path(trace), ep, concurrency, trajectories, overload)), policy).summary
    return policy, s["trajectories_per_s"], s["role_switches"], s["makespan_s"]


def reused(path: str | None, rerun: list[str]) -> dict[str, tuple]:
    """FILE's rows as run() returns them, but the policies of `rerun`; {} without --reuse."""
    if path is None:
        return {}
    try:
        rows = json.loads(Path(path).read_text())["rows"]
        kept = {r["policy"]: (r["policy"], r["trajectories_per_s"], r["switches"], r["makespan_s"]) for r in rows}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: --reuse {path}: not a phases.py results file ({e})")
    missing = [p for p in FIXED if p not in kept]
    if missing:
        sys.exit(f"error: --reuse {path}: no row for {', '.join(missing[:3])}: run without --reuse")
    return {p: r for p, r in kept.items() if p not in rerun}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=4, help="blocks of trajectories, the kinds alternating")
    ap.add_argument("--block", type=int, default=128, help="trajectories a block")
    ap.add_argument("--long", type=int, default=8192, help="tokens a prefill-heavy turn appends")
    ap.add_argument("--decode", type=int, default=2048, help="tokens a decode-heavy turn decodes")
    ap.add_argument("--tool-s", type=float, default=1.0, help="seconds a tool call takes")
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="each turn's decode drawn within this share either side of its kind's (0: all alike)")
    ap.add_argument("--ep", type=int, default=4, help="expert-parallel ranks an engine")
    ap.add_argument("--concurrency", type=int, default=64, help="trajectories in flight")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sticky-overload", default="cost", metavar="X|cost|none",
                    help="runtime.sticky_overload: when a turn leaves its trajectory's engines (cost: "
                         "when the move pays for its recompute; X: past X times the least-loaded "
                         "engine's turns; none: never for load)")
    ap.add_argument("--out", default="benchmarks/results/phases.json")
    ap.add_argument("--reuse", metavar="FILE",
                    help="an earlier results file of the same settings: its fixed splits are kept")
    ap.add_argument("--rerun", default="prorsa,oracle", help="with --reuse: the policies simulated again")
    args = ap.parse_args()
    for name in ("blocks", "block", "long", "decode", "ep", "concurrency", "workers"):
        if getattr(args, name) < 1:
            sys.exit(f"error: --{name} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.jitter < 1:
        sys.exit(f"error: --jitter must be at least 0 and under 1, got {args.jitter}")
    rerun = args.rerun.split(",")
    if any(r not in POLICIES for r in rerun):
        sys.exit(f"error: --rerun: policies of this table, not {args.rerun!r}")
    from prorsa.config.pipeline import sticky_overload_from

    try:
        overload = sticky_overload_from(args.sticky_overload)
    except ValueError as e:
        sys.exit(f"error: --sticky-overload: {e}")
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "phases.jsonl"
        write_phase_trace(trace, args.blocks, args.block, args.long, args.decode, args.tool_s, jitter=args.jitter)
        n = args.blocks * args.block
        kept = reused(args.reuse, rerun)
        jobs = [(str(trace), args.ep, args.concurrency, n, overload, p) for p in POLICIES
                if p not in kept or p == "colocated"]
        print(f"{len(jobs)} simulations of {n} trajectories", file=sys.stderr)
        with Pool(args.workers) as pool:
            res = {r[0]: r for r in pool.map(run, jobs, chunksize=1)}
    if "colocated" in kept:
        reuse_holds(args.reuse, "colocated", kept["colocated"][1], res["colocated"][1])
    res = kept | res
    base = res["colocated"][1]
    best = max(FIXED, key=lambda p: res[p][1])
    shown = ["colocated", *sorted(FIXED[1:], key=lambda p: -res[p][1])[:5], "prorsa", "oracle"]
    table = Table(title=f"alternating demand: {args.blocks} blocks of {args.block}, "
                        f"{args.long}-token appends / {args.decode}-token decodes, EP{args.ep}, "
                        f"sticky overload {args.sticky_overload}")
    for col in ("policy", "traj/s", "vs colocated", "vs best fixed", "switches"):
        table.add_column(col, justify="right")
    rows = []
    for p in POLICIES:
        _, tput, switches, makespan = res[p]
        mark = "*" if p == best else ""
        if p in shown:
            table.add_row(p + mark, f"{tput:.3f}", f"{tput / base:.3f}", f"{tput / res[best][1]:.3f}", str(switches))
        rows.append({"policy": p, "trajectories_per_s": tput, "vs_colocated": tput / base,
                     "vs_best_fixed": tput / res[best][1], "switches": switches, "makespan_s": makespan})
    Console(width=120).print(table)
    command = "python benchmarks/phases.py " + " ".join(sys.argv[1:])
    print(f"command: {command}")
    Path(args.out).write_text(json.dumps({"command": command, "best_fixed": best, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
