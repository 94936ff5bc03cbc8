"""Steps that stop waiting for their tail, in the simulator: plain synchronous steps, partial
rollouts (over-sampled steps ended once `prompts` GRPO groups are whole, the rest carried into the
next step) and asynchronous rollout with a staleness bound, side by side on coding agents.

Cells: MoE, 4 engines of Qwen3-30B-A3B with expert parallelism 8 (an engine is a DP-attention group
of 8 H200s, 32 slots a rank; 32 GPUs); dense, 16 engines of Qwen3-8B, one H200 each, 32 slots.
Policy colocated in every run, so the drivers alone differ. Workload `coding-agent` (turns mean 40,
uncapped), 4 steps of 32 prompts x 8 samples, a 5 s weight update between steps (every prefix
cache dropped).

    sync           a step ends with its last trajectory
    partial:X      partial_rollout {over_sample: X, carry: true}: at X = 0.25, 40 groups a step, the
                   first 32 whole are trained, the other 8 go on under the next version
                   (max_staleness 1: a group whose first turn lags the trained version by more is dropped)
    cut:X          the same with carry: false: the other 8 are cancelled as the step ends
    overlap:X      partial:X with overlap: as a group becomes whole, the next step's next group
                   starts at once (under this step's version), so the tail keeps 40 groups running
    async    256 in flight, 1,024 trajectories, an update every 256 finished; a trajectory trained
             more than 1 version behind its first turn is counted as dropped (the simulator has no
             learner to gate starts, so none is held back: rollout runs ahead freely)

Figures per run: trained trajectories per second of makespan and its ratio to plain sync; the
same ratio in trained (generated) tokens per second, lower where a mode trains short trajectories
more often than plain sync does (what it stops waiting for is the long ones); the share of
trained tokens from a version older than the one trained, and the largest lag; each step's end;
and, for plain sync, each step's makespan lower bound (sim/bounds.py; the bound is of a step of
B x G fresh trajectories, so it bounds plain sync only).

Recorded traces (--trace FILE, repeatable or comma-separated; results in partial-rollout-traces.json
unless --out says otherwise): the same runs with the family replaced by a recorded agent's
trajectories, imported by the project's importer (`prorsa trace import`'s import_trace), so any
format it reads will do. How a trace becomes GRPO groups:

    each recorded trajectory is a prompt, and its group is G samples replaying its recorded lengths
    (turns, appends, decodes, tool times), each with a seed of its own (token ids of their own,
    so samples share only the prompt's cached prefix, as a real group does)

A GRPO group is G samples of one task, and a trace holds one recording a task: the recorded
lengths are that task's shape. The replay's own slot order would fill a group with G different
recorded tasks, whose whole-group time is the longest of G unrelated trajectories: a spread no
group of one prompt has, which would flatter every mode that stops waiting for it. The cost of
this choice is the other extreme: a group's members differ only in how they are served, never in
what they do, so the tail inside a group is understated. Steps draw the recorded trajectories
in order, cycling (a step of 32 prompts from 20 recorded tasks plays 12 of them twice).

Releases are dropped (every prompt of a step starts at its start: the recorded starts are when
someone launched a session, not part of a training step). Gaps stamped start to start hold the
recorded model's own time; the simulator plays that time itself, so --decode-tps takes it out
(ImportOptions.decode_tps): `fastest`, the default, subtracts completion tokens / the fastest rate
any of the trace's own gaps implies (the slowest model under which no recorded gap is shorter than
its decode: the most model time taken out without flooring a gap at 0); a number, that rate; 0,
gaps as recorded. Gaps a format measures as the tool's own time are never changed.

The traces in benchmarks/traces/ (sources and licences in its README) are small enough to run at
the family's size, 4 steps of 32 prompts x 8 on both cells: the three of them, sync, partial:0.25
and async, take about a minute and a half on one core.

    .venv/bin/python benchmarks/partial_rollout.py --workers 1 --trace benchmarks/traces/lmcache_miniswe.jsonl
        --trace benchmarks/traces/lmcache_magagent.jsonl
        --trace benchmarks/traces/tracelab_examples_claude_codex.jsonl

    .venv/bin/python benchmarks/partial_rollout.py [--models moe,dense] [--modes sync,partial:0.25,async]
                                                   [--prompts 32] [--steps 4] [--workers 2] [--out FILE]
                                                   [--trace FILE[,FILE...]] [--decode-tps fastest|RATE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

from paper import save
from progress import each_done

# model -> (profile, engines, ep, slots an engine)
MODELS = {"moe": ("qwen3-30b-a3b", 4, 8, 256), "dense": ("qwen3-8b", 16, 1, 32)}
GROUP, UPDATE_S, STALENESS = 8, 5.0, 1
MODES = "sync,partial:0.25,partial:0.5,cut:0.25,overlap:0.25,async"
TRACE_MODES = "sync,partial:0.25,async"


def config(model: str, mode: str, prompts: int, steps: int, seed: int, trace: str | None = None):
    """`trace`: a grouped trace file (grouped()) replayed instead of the coding-agent family."""
    from prorsa.config.pipeline import PipelineConfig

    name, count, ep, slots = MODELS[model]
    batch = prompts * GROUP
    kind, _, over = mode.partition(":")
    workload = {"family": "coding-agent", "mode": "async" if mode == "async" else "sync", "prompts": prompts,
                "group_size": GROUP, "steps": steps, "weight_update_s": UPDATE_S}
    if trace is not None:
        workload = {k: v for k, v in workload.items() if k != "family"} | {"trace": trace}
    if mode == "async":
        workload |= {"concurrency": batch, "trajectories": steps * batch}
    return PipelineConfig.model_validate({
        "name": f"partial-{model}-{mode.replace(':', '-')}", "seed": seed, "policy": "colocated",
        "engines": {"backend": "emulated", "count": count, "slots": slots, "gpu": "h200", "model": name, "ep": ep},
        "workload": workload,
        **({"partial_rollout": {"over_sample": float(over), "carry": kind != "cut", "overlap": kind == "overlap",
                                "max_staleness": STALENESS}}
           if kind in ("partial", "cut", "overlap") else {}),
    })  # fmt: skip


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    model, mode, prompts, steps, seed, trace, *policy = job  # policy: colocated unless given
    sim = simulate(resolve(config(model, mode, prompts, steps, seed, trace and trace[1])), *policy)
    rs = sim.recorder.trajectories
    batch = prompts * GROUP
    if mode == "async":
        trained, steps_end = async_trained(rs, batch)
    else:
        # plain sync tags no versions in the simulator: every turn is its step's, by construction
        trained = [(r, r.spec.step, [r.spec.step] * len(r.turns)) if r.trained_step is None else
                   (r, r.trained_step, [t.policy_version for t in r.turns]) for r in rs if r.status == "completed"]
        steps_end = [max(r.end_s for r, k, _ in trained if k == s) for s in range(steps)]
    tokens = sum(t.decode_tokens for r, _, _ in trained for t in r.turns)
    older = sum(t.decode_tokens for r, k, vs in trained for t, v in zip(r.turns, vs) if v < k)
    return {**({"trace": trace[0]} if trace else {}), "model": model, "mode": mode, "prompts": prompts,
            "steps": steps, "seed": seed,
            "makespan_s": round(sim.makespan_s, 2), "trained": len(trained),
            "trained_per_s": round(len(trained) / sim.makespan_s, 4),
            "dropped": len(rs) - len(trained), "trained_tokens": tokens,
            "older_token_share": round(older / tokens, 4) if tokens else 0.0,
            "largest_lag": max((k - vs[0] for _, k, vs in trained if vs), default=0),
            "step_end_s": [round(t, 2) for t in steps_end], "sim_wall_s": sim.summary["sim_wall_s"]} | (
                {"policy": policy[0], "switches": sim.summary["role_switches"]} if policy else {})


def async_trained(rs: list, batch: int) -> tuple[list, list[float]]:
    """Batches in finishing order; version v is in the engines from the v-th batch's last finish
    (the update is counted as instant); a trajectory trained at version k whose first turn was sent
    under a version more than STALENESS older is dropped."""
    done = sorted((r for r in rs if r.status == "completed"), key=lambda r: r.end_s)
    ends = [done[i + batch - 1].end_s for i in range(0, len(done) - batch + 1, batch)]

    def version_at(t: float) -> int:
        return sum(e <= t for e in ends[:-1])  # no update follows the last batch

    trained = []
    for i, r in enumerate(done[:len(ends) * batch]):
        k, vs = i // batch, [version_at(t.start_s) for t in r.turns]
        if k - vs[0] <= STALENESS:
            trained.append((r, k, vs))
    return trained, ends


def step_bounds(model: str, prompts: int, steps: int, seed: int, trace: str | None = None) -> list[float]:
    """Plain sync's bound for each step: the bound over k steps less that over k - 1."""
    from prorsa.sim.bounds import lower_bound
    from prorsa.rollout.context import resolve

    totals = [0.0] + [lower_bound(resolve(config(model, "sync", prompts, k, seed, trace))).makespan_s
                      for k in range(1, steps + 1)]
    return [round(b - a, 2) for a, b in zip(totals, totals[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="moe,dense")
    ap.add_argument("--modes", help=f"sync, partial:X (over_sample X, carried), cut:X (over_sample X, cancelled), "
                    "overlap:X (partial:X, the next step's groups started as this step's become whole), "
                    f"async (default: {MODES}; with --trace: {TRACE_MODES})")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", help="default: benchmarks/results/partial-rollout.json, with --trace "
                    "benchmarks/results/partial-rollout-traces.json")
    ap.add_argument("--trace", action="append", default=[], metavar="FILE[,FILE...]",
                    help="recorded agent runs to replay instead of the family (any format `prorsa trace import` "
                    "reads), each trajectory a prompt of G samples; repeatable")
    ap.add_argument("--decode-tps", default="fastest", metavar="fastest|RATE",
                    help="take completion tokens / RATE (the recorded model's own time) out of gaps stamped "
                    "start to start; fastest: the fastest rate the trace's own gaps imply; 0: gaps as recorded")
    args = ap.parse_args()
    sources = [f for given in args.trace for f in given.split(",") if f]
    models = args.models.split(",")
    modes = (args.modes or (TRACE_MODES if sources else MODES)).split(",")
    out = args.out or f"benchmarks/results/partial-rollout{'-traces' if sources else ''}.json"
    if "sync" not in modes:
        sys.exit("error: --modes: sync is the baseline every ratio is taken against; keep it")
    if bad := [m for m in modes if m not in ("sync", "async") and not _over_sample(m)]:
        sys.exit(f"error: --modes: {bad[0]!r}: expected sync, async, partial:X, cut:X or overlap:X (X >= 0)")
    if unknown := [m for m in models if m not in MODELS]:
        sys.exit(f"error: --models: {unknown[0]!r}: expected {' or '.join(MODELS)}")
    decode_tps = _decode_tps(args.decode_tps)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="partial-traces-") as tmp:
        # (name, what its cell records, the grouped file the pipelines replay); None: the family
        traces = [_import(src, decode_tps, Path(tmp)) for src in sources] or [None]
        if len({t and t[0] for t in traces}) < len(traces):  # points and cells are told apart by name
            sys.exit(f"error: --trace: two files named alike ({', '.join(sources)}); rename one")
        jobs = [(m, md, args.prompts, args.steps, args.seed, t and (t[0], t[2])) for t in traces
                for m in models for md in modes]
        with Pool(args.workers) as pool:
            points = list(each_done(pool, run_point, jobs, lambda p: f"{p.get('trace', 'coding-agent')} "
                                    f"{p['model']} {p['mode']}: {p['trained_per_s']:.4f} trained/s"))
        names = [t and t[0] for t in traces]
        # as asked, not as done
        points.sort(key=lambda p: (names.index(p.get("trace")), models.index(p["model"]), modes.index(p["mode"])))
        cells = []
        for t in traces:
            for m in models:
                by = {p["mode"]: p for p in points if p["model"] == m and p.get("trace") == (t and t[0])}
                base = by["sync"]["trained_per_s"]
                cells.append({**(t[1] if t else {}), "model": m,
                              "step_bound_s": step_bounds(m, args.prompts, args.steps, args.seed, t and t[2]),
                              "vs_sync": {md: round(by[md]["trained_per_s"] / base, 3) for md in modes},
                              # counted in tokens too: a mode that trains short trajectories first
                              # gains less in tokens than in trajectories
                              "tokens_vs_sync": {md: round(_tokens_per_s(by[md]) / _tokens_per_s(by["sync"]), 3)
                                                 for md in modes}})
    show(points, cells)
    save("partial_rollout.py", t0, cells, points, out)


def _tokens_per_s(point: dict) -> float:
    return point["trained_tokens"] / point["makespan_s"]


def _decode_tps(given: str) -> float | None:
    """--decode-tps as a rate; None for `fastest` (found per trace)."""
    if given == "fastest":
        return None
    try:
        rate = float(given)
    except ValueError:
        rate = -1.0
    if not rate >= 0 or rate == float("inf"):
        sys.exit(f"error: --decode-tps: {given!r}: expected fastest or a rate >= 0 (tokens/s)")
    return rate


def _import(src: str, decode_tps: float | None, tmp: Path) -> tuple[str, dict, str]:
    """A recorded trace, read by the project's importer and written as GRPO groups of GROUP:
    (its name, what its cell records of it, the grouped trace file). Exits naming the file on bad input."""
    from prorsa.agent.importers import FORMATS, ImportOptions, TraceError, import_trace
    from prorsa.agent.trace import write_trace

    try:
        fmt, specs = import_trace(src, options=ImportOptions(releases="none"))  # checks it all, as recorded
        if decode_tps is None:
            decode_tps = fastest_rate(FORMATS[fmt].read(Path(src), None))
        if decode_tps:
            _, specs = import_trace(src, fmt, ImportOptions(decode_tps=decode_tps, releases="none"))
    except TraceError as e:
        sys.exit(f"error: --trace: {e}")
    name = Path(src).name.split(".")[0]
    path = tmp / f"{len(list(tmp.iterdir()))}-{name}.jsonl"  # two sources of one name stay apart
    write_trace(path, grouped(specs, GROUP))
    turns = [t for s in specs for t in s.turns]
    return name, {"trace": name, "source": src, "format": fmt, "recorded": len(specs), "turns": len(turns),
                  "decode_tps": round(decode_tps, 1),
                  "tool_s_mean": round(sum(t.tool_latency_s for t in turns if not t.done) /
                                       max(1, sum(not t.done for t in turns)), 3)}, str(path)


def fastest_rate(runs: list) -> float:
    """The fastest decode rate any gap that holds the model's own time implies (its completion
    tokens over the gap); 0 when no gap holds it (every gap is the tool's own)."""
    return max((t.gap_decode_tokens / t.gap_s for r in runs for t in r.turns[:-1]
                if t.gap_decode_tokens and t.gap_s > 0), default=0.0)


def grouped(specs: list, g: int) -> list:
    """Each trajectory as a prompt of g samples with its lengths, consecutive, so the replay's
    slots (prompt-major, g a prompt) put one recorded trajectory's samples in one group."""
    return [replace(s, traj_id=f"{s.traj_id}.g{k}", prompt_index=i, group_index=k,
                    seed=(s.seed + 2654435761 * k) % 2**32)  # a sample's token ids of its own
            for i, s in enumerate(specs) for k in range(g)]


def _over_sample(mode: str) -> bool:
    kind, _, x = mode.partition(":")
    try:
        return kind in ("partial", "cut", "overlap") and float(x) >= 0
    except ValueError:
        return False


def show(points: list[dict], cells: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    traced = any("trace" in p for p in points)
    table = Table(title=f"{'recorded traces' if traced else 'coding-agent'}, colocated: trained trajectories per "
                  "second (simulated, body seconds)")
    for col in ("trace" if traced else "", "model", "mode", "makespan s", "trained/s", "vs sync", "tokens/s vs sync",
                "dropped", "older tokens", "largest lag", "step ends s", "step bounds s (sync)"):
        if col:
            table.add_column(col, justify="left" if col in ("trace", "model", "mode") else "right")
    vs = {(c.get("trace"), c["model"]): c for c in cells}
    for p in points:
        c, md = vs[p.get("trace"), p["model"]], p["mode"]
        table.add_row(*((p["trace"],) if traced else ()), p["model"], md, f"{p['makespan_s']:.0f}",
                      f"{p['trained_per_s']:.3f}", f"{c['vs_sync'][md]:.2f}", f"{c['tokens_vs_sync'][md]:.2f}",
                      str(p["dropped"]), f"{p['older_token_share']:.1%}", str(p["largest_lag"]),
                      " ".join(f"{t:.0f}" for t in p["step_end_s"]),
                      " ".join(f"{b:.0f}" for b in c["step_bound_s"]) if md == "sync" else "")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
