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
    async    256 in flight, 1,024 trajectories, an update every 256 finished; a trajectory trained
             more than 1 version behind its first turn is counted as dropped (the simulator has no
             learner to gate starts, so none is held back: rollout runs ahead freely)

Figures per run: trained trajectories per second of makespan and its ratio to plain sync; the
share of trained (generated) tokens from a version older than the one trained, and the largest lag;
each step's end; and, for plain sync, each step's makespan lower bound (sim/bounds.py; the bound is
of a step of B x G fresh trajectories, so it bounds plain sync only).

    .venv/bin/python benchmarks/partial_rollout.py [--models moe,dense] [--modes sync,partial:0.25,async]
                                                   [--prompts 32] [--steps 4] [--workers 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool

from paper import save
from progress import each_done

# model -> (profile, engines, ep, slots an engine)
MODELS = {"moe": ("qwen3-30b-a3b", 4, 8, 256), "dense": ("qwen3-8b", 16, 1, 32)}
GROUP, UPDATE_S, STALENESS = 8, 5.0, 1
MODES = "sync,partial:0.25,partial:0.5,cut:0.25,async"


def config(model: str, mode: str, prompts: int, steps: int, seed: int):
    from prorsa.config.pipeline import PipelineConfig

    name, count, ep, slots = MODELS[model]
    batch = prompts * GROUP
    kind, _, over = mode.partition(":")
    workload = {"family": "coding-agent", "mode": "async" if mode == "async" else "sync", "prompts": prompts,
                "group_size": GROUP, "steps": steps, "weight_update_s": UPDATE_S}
    if mode == "async":
        workload |= {"concurrency": batch, "trajectories": steps * batch}
    return PipelineConfig.model_validate({
        "name": f"partial-{model}-{mode.replace(':', '-')}", "seed": seed, "policy": "colocated",
        "engines": {"backend": "emulated", "count": count, "slots": slots, "gpu": "h200", "model": name, "ep": ep},
        "workload": workload,
        **({"partial_rollout": {"over_sample": float(over), "carry": kind == "partial", "max_staleness": STALENESS}}
           if kind in ("partial", "cut") else {}),
    })  # fmt: skip


def run_point(job: tuple) -> dict:
    from prorsa.sim.run import simulate

    model, mode, prompts, steps, seed = job
    sim = simulate(config(model, mode, prompts, steps, seed))
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
    return {"model": model, "mode": mode, "prompts": prompts, "steps": steps, "seed": seed,
            "makespan_s": round(sim.makespan_s, 2), "trained": len(trained),
            "trained_per_s": round(len(trained) / sim.makespan_s, 4),
            "dropped": len(rs) - len(trained), "trained_tokens": tokens,
            "older_token_share": round(older / tokens, 4) if tokens else 0.0,
            "largest_lag": max((k - vs[0] for _, k, vs in trained if vs), default=0),
            "step_end_s": [round(t, 2) for t in steps_end], "sim_wall_s": sim.summary["sim_wall_s"]}


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


def step_bounds(model: str, prompts: int, steps: int, seed: int) -> list[float]:
    """Plain sync's bound for each step: the bound over k steps less that over k - 1."""
    from prorsa.sim.bounds import lower_bound

    totals = [0.0] + [lower_bound(config(model, "sync", prompts, k, seed)).makespan_s for k in range(1, steps + 1)]
    return [round(b - a, 2) for a, b in zip(totals, totals[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="moe,dense")
    ap.add_argument("--modes", default=MODES, help="sync, partial:X (over_sample X, carried), cut:X (over_sample "
                    "X, cancelled), async")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/partial-rollout.json")
    args = ap.parse_args()
    models, modes = args.models.split(","), args.modes.split(",")
    if "sync" not in modes:
        sys.exit("error: --modes: sync is the baseline every ratio is taken against; keep it")
    if bad := [m for m in modes if m not in ("sync", "async") and not _over_sample(m)]:
        sys.exit(f"error: --modes: {bad[0]!r}: expected sync, async, partial:X or cut:X (X >= 0)")
    t0 = time.perf_counter()
    jobs = [(m, md, args.prompts, args.steps, args.seed) for m in models for md in modes]
    with Pool(args.workers) as pool:
        points = list(each_done(pool, run_point, jobs, lambda p: f"{p['model']} {p['mode']}: "
                                f"{p['trained_per_s']:.4f} trained/s"))
    points.sort(key=lambda p: (models.index(p["model"]), modes.index(p["mode"])))  # as asked, not as done
    cells = []
    for m in models:
        by = {p["mode"]: p for p in points if p["model"] == m}
        base = by["sync"]["trained_per_s"]
        cells.append({"model": m, "step_bound_s": step_bounds(m, args.prompts, args.steps, args.seed),
                      "vs_sync": {md: round(by[md]["trained_per_s"] / base, 3) for md in modes}})
    show(points, cells)
    save("partial_rollout.py", t0, cells, points, args.out)


def _over_sample(mode: str) -> bool:
    kind, _, x = mode.partition(":")
    try:
        return kind in ("partial", "cut") and float(x) >= 0
    except ValueError:
        return False


def show(points: list[dict], cells: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="coding-agent, colocated: trained trajectories per second (simulated, body seconds)")
    for col in ("model", "mode", "makespan s", "trained/s", "vs sync", "dropped", "older tokens", "largest lag",
                "step ends s", "step bounds s (sync)"):
        table.add_column(col, justify="left" if col in ("model", "mode") else "right")
    vs = {c["model"]: c for c in cells}
    for p in points:
        c = vs[p["model"]]
        table.add_row(p["model"], p["mode"], f"{p['makespan_s']:.0f}", f"{p['trained_per_s']:.3f}",
                      f"{c['vs_sync'][p['mode']]:.2f}", str(p["dropped"]), f"{p['older_token_share']:.1%}",
                      str(p["largest_lag"]), " ".join(f"{t:.0f}" for t in p["step_end_s"]),
                      " ".join(f"{b:.0f}" for b in c["step_bound_s"]) if p["mode"] == "sync" else "")
    Console(width=180).print(table)


if __name__ == "__main__":
    main()
