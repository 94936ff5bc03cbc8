"""The control plane at scale: the demand a cluster puts on one Dask scheduler and one driver,
beside the capacity one of each gives, for 64 to 4,096 GPUs, dense and MoE.

Demand, from the simulator: the paper's SWE cell (pipelines/sim-paper.yaml as
configs/sweeps/paper.yaml runs it: a synchronous step, 8 trajectories a GPU, up to 12 turns, 64
slots an engine; dense Qwen3-8B on one H200 an engine, MoE Qwen3-30B-A3B as EP8 DP-attention engines
of 8 H200s) simulated at --simulate GPUs with the trajectories scaled with them, policy --policy.
A row's demand is its turns over the step's makespan (mean) and its busiest --window s (peak);
scheduler tasks/s are turns/s x the Dask tasks a live turn costs (TASKS_PER_TURN). The sizes in
--gpus past the largest simulated one are extrapolated from it per GPU: turns/s and trajectories
in flight in proportion to the GPUs.

Capacity, from control_plane.py --processes (scheduler and every worker a process of its own,
emulated engines at time scale 0): each measured run's scheduler and driver CPU seconds, counted
from the moment every worker had joined, fitted by least squares (`fit`) as a background share of
a core over the run's wall time plus a cost a turn:
    CPU s = r x wall s + turns x (a + b x engines + c x trajectories in flight / 1,000) ms
On a loaded machine a run's turns/s is low and the background is a large part of its CPU; dividing
it by the turns would charge it to them. The fits give a row's CPU a turn at its engines and
trajectories (runs and fits both stored). Capacity = the turns/s the rest of one core carries
((1 - r) / CPU a turn); utilisation = r + demand x CPU a turn; headroom = capacity / demand,
against the peak (and, beside it, the mean). The headline: the largest row whose scheduler and
driver both have >= 2x headroom at the peak, per model, and the most GPUs that keep it (at the
peak and at the mean); past it, the cells (one scheduler and driver per group of engines, same
load a GPU) a row would take to have it. The default --measured files were written by
control_plane.py --processes 4,8,16,32 --sizes 256, then 8, 16 and 32 engines at --sizes 1024
(each file stores its command; scale.json lists them).

    .venv/bin/python benchmarks/scale.py [--simulate 64,256,1024] [--gpus 64,256,1024,4096]
        [--measured control-plane results, comma-separated] [--out benchmarks/results/scale.json]

Table building (`build`) is plain arithmetic on the stored inputs, standard library only;
tests/test_benchmark_scale.py runs it on a tiny input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import subprocess
import sys
from pathlib import Path

# The Dask tasks a live turn costs in the driver shape with a prefill pool (prorsa/live/runtime.py
# DaskTurnRunner._attempt -> live/tasks.py leg_graph + tool_graph): prefill-, decode- and turn-<traj>-<k>.
# A colocated or decode-local turn is two (generate-/local- and the turn task); a migration adds a warm-.
TASKS_PER_TURN = 3
MODELS = {"dense": ("qwen3-8b", 1), "moe": ("qwen3-30b-a3b", 8)}  # profile, GPUs (EP ranks) an engine
PER_GPU = 8  # trajectories a GPU: the paper cell's 32 prompts x 8 samples on 32 GPUs
GROUP = 8
SLOTS = 64
MAX_TURNS = 12
HEADROOM_GOAL = 2.0


# ------------------------------------------------------------------------------------ demand (sim)

def sim_config(gpus: int, model: str, policy: str):
    from prorsa.config.pipeline import PipelineConfig

    name, ep = MODELS[model]
    trajectories = PER_GPU * gpus
    return PipelineConfig.model_validate({
        "name": f"scale-{model}-{gpus}", "seed": 0, "policy": policy,
        "engines": {"backend": "emulated", "count": gpus // ep, "slots": SLOTS, "gpu": "h200", "model": name,
                    "ep": ep},
        "workload": {"family": "swe", "mode": "sync", "prompts": trajectories // GROUP, "group_size": GROUP,
                     "steps": 1, "max_turns": MAX_TURNS},
    })  # fmt: skip


def peak_rate(ends: list[float], window: float) -> float:
    """The most events in any `window` seconds (a window starting at an event), per second."""
    ends = sorted(ends)
    best, lo = 0, 0
    for hi, t in enumerate(ends):
        while ends[lo] < t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best / window


def simulate_point(gpus: int, model: str, policy: str, window: float) -> dict:
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    cfg = sim_config(gpus, model, policy)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    run = simulate(resolve(cfg), policy)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    s = run.summary
    ends = [t.end_s for traj in run.recorder.trajectories for t in traj.turns]
    return {"gpus": gpus, "model": model, "engines": cfg.engines.count, "policy": policy,
            "trajectories": cfg.workload.prompts * cfg.workload.group_size, "turns": s["turns"],
            "makespan_s": s["makespan_s"], "completed": s["trajectories_completed"],
            "peak_turns_per_s": peak_rate(ends, window), "window_s": window,
            "sim_cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)}


# --------------------------------------------------------------------------------- capacity (fit)

def measured_points(paths: list[Path]) -> list[dict]:
    """control_plane.py --processes results: one point per run, its scheduler's and driver's CPU
    seconds from the moment every worker had joined, its wall time and turns."""
    points = []
    for path in paths:
        doc = json.loads(path.read_text())
        for row in doc["rows"]:
            for run in row["runs"]:
                points.append({
                    "source": path.name, "engines": row["engines"], "trajectories": row["trajectories"],
                    "turns": run["turns"], "turns_per_s": run["turns_per_s"], "run_wall_s": run["run_wall_s"],
                    "scheduler_cpu_s": run["scheduler_cpu_s_after_join"], "driver_cpu_s": run["driver_cpu_s_after_join"],
                    "scheduler_idle_cpu_share": run["scheduler_idle_cpu_share"],
                    "scheduler_rss_mib": run.get("scheduler_rss_mib")})
    return points


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the normal equations of a least-squares fit)."""
    a = [row[:] + [x] for row, x in zip(m, v)]
    n = len(a)
    for i in range(n):
        p = max(range(i, n), key=lambda r: abs(a[r][i]))
        a[i], a[p] = a[p], a[i]
        if abs(a[i][i]) < 1e-9 * max(1.0, max(abs(x) for x in a[i][:n])):
            raise ValueError("the measured points do not pin the fit (vary engines, trajectories and run length)")
        for r in range(i + 1, n):
            f = a[r][i] / a[i][i]
            a[r] = [x - f * y for x, y in zip(a[r], a[i])]
    out = [0.0] * n
    for i in reversed(range(n)):
        out[i] = (a[i][n] - sum(a[i][j] * out[j] for j in range(i + 1, n))) / a[i][i]
    return out


TERMS = ("r", "a", "b", "c")  # background share; ms a turn: base, a engine, a thousand trajectories


def fit(points: list[dict], process: str) -> dict:
    """Least squares of a process's CPU seconds over a run (after every worker joined) as a share of
    a core the whole run (its background: heartbeats, periodic callbacks, the control loop) plus a
    cost a turn that grows with engines and trajectories in flight:
        CPU s = r x wall s + turns x (a + b x engines + c x trajectories / 1,000) / 1,000.
    Each run is weighted by 1 / its CPU s (relative errors). A growth term (b, c) the runs put below
    0 is not resolved by them: it is held at 0 and the rest refitted (named in "held_at_zero")."""
    rows = [(p[f"{process}_cpu_s"], (p["run_wall_s"], p["turns"] / 1e3, p["turns"] * p["engines"] / 1e3,
                                     p["turns"] * p["trajectories"] / 1e6)) for p in points]
    free, held = list(TERMS), []
    while True:
        idx = [TERMS.index(t) for t in free]
        xs = [tuple(xr[i] / y for i in idx) for y, xr in rows]  # every row divided by its CPU s
        m = [[sum(x[i] * x[j] for x in xs) for j in range(len(idx))] for i in range(len(idx))]
        v = [sum(x[i] for x in xs) for i in range(len(idx))]
        k = dict(zip(free, _solve(m, v)))
        below = [t for t in ("b", "c") if t in free and k[t] < 0]
        if not below:
            break
        worst = min(below, key=lambda t: k[t])
        free.remove(worst)
        held.append(worst)
    f = {t: k.get(t, 0.0) for t in TERMS}
    f["held_at_zero"] = held
    f["worst_relative_error"] = max(abs(sum(f[t] * x for t, x in zip(TERMS, xr)) - y) / y for y, xr in rows)
    return f


def pairs(points: list[dict], process: str, background: float) -> list[dict]:
    """A check on the fit's growth terms: for each engine count measured at two trajectory counts,
    the CPU a turn the second run added over the first, its background (`background` x the wall
    time it added) taken off: (CPU s - background x wall s) difference over the turns difference."""
    out = []
    for e in sorted({p["engines"] for p in points}):
        runs = sorted((p for p in points if p["engines"] == e), key=lambda p: p["turns"])
        if len(runs) >= 2 and runs[-1]["turns"] > runs[0]["turns"]:
            lo, hi = runs[0], runs[-1]
            extra = hi[f"{process}_cpu_s"] - lo[f"{process}_cpu_s"] - background * (hi["run_wall_s"] - lo["run_wall_s"])
            out.append({"engines": e, "trajectories": [lo["trajectories"], hi["trajectories"]],
                        "cpu_ms_per_turn": 1e3 * extra / (hi["turns"] - lo["turns"])})
    return out


def predict(f: dict, engines: float, trajectories: float) -> float:
    ms = f["a"] + f["b"] * engines + f["c"] * trajectories / 1e3
    if ms <= 0:
        raise ValueError(f"the fit predicts {ms:.3f} ms a turn at {engines:g} engines, {trajectories:g} trajectories")
    return ms


def use(fits: dict, engines: float, trajectories: float, peak: float) -> dict:
    """What one scheduler and one driver carry at `engines`, `trajectories` in flight and `peak`
    turns/s: per process its CPU a turn (ms), background share of a core (the fit's r), capacity
    (turns/s on the rest of one core), utilisation (background + peak x CPU a turn) and headroom
    (capacity / peak)."""
    out = {}
    for k in ("scheduler", "driver"):
        ms = predict(fits[k], engines, trajectories)
        background = max(0.0, fits[k]["r"])
        capacity = max(0.0, 1.0 - background) * 1e3 / ms
        out[k] = {"cpu_ms_per_turn": ms, "background_share": background, "capacity_turns_per_s": capacity,
                  "utilisation": background + peak * ms / 1e3, "headroom": capacity / peak}
    return out


def served(fits: dict, engines: float, trajectories: float, peak: float, goal: float) -> bool:
    return all(u["headroom"] >= goal for u in use(fits, engines, trajectories, peak).values())


def largest(fits: dict, ref: dict, goal: float, peak: bool = True, limit: int = 1 << 17) -> int:
    """The most GPUs (whole engines) at which one scheduler and one driver keep >= `goal` headroom,
    at `ref`'s demand (peak, else mean) and trajectories a GPU (a simulated point); 0 if not even
    one engine."""
    per_engine = ref["gpus"] // ref["engines"]
    rate = ref["peak_turns_per_s"] if peak else ref["turns"] / ref["makespan_s"]
    best = 0
    for gpus in range(per_engine, limit + 1, per_engine):
        share = gpus / ref["gpus"]
        if not served(fits, ref["engines"] * share, ref["trajectories"] * share, rate * share, goal):
            break
        best = gpus
    return best


# ------------------------------------------------------------------------------------ the table

def cells_needed(fits: dict, engines: float, trajectories: float, peak: float, goal: float) -> int | None:
    """The fewest cells (equal groups of the engines, each with its own scheduler and driver and its
    share of the trajectories and turns) in which every scheduler and driver has >= `goal` headroom;
    None if not even one engine a cell would."""
    for k in range(1, int(engines) + 1):
        if served(fits, engines / k, trajectories / k, peak / k, goal):
            return k
    return None


def build(doc: dict) -> dict:
    """The table's rows and headline from the stored inputs: doc["demand"] (simulated points),
    doc["gpus"], doc["measured"] (control-plane points) -> {"fits", "rows", "headline"}."""
    fits = {k: fit(doc["measured"], k) for k in ("scheduler", "driver")}
    for k in ("scheduler", "driver"):
        fits[k]["pairs"] = pairs(doc["measured"], k, fits[k]["r"])
    rows, headline = [], {}
    for model in doc["models"]:
        sims = sorted((d for d in doc["demand"] if d["model"] == model), key=lambda d: d["gpus"])
        ref = sims[-1]
        for gpus in doc["gpus"]:
            sim = next((d for d in sims if d["gpus"] == gpus), None)
            src = sim or ref
            scale = gpus / src["gpus"]
            engines = src["engines"] * scale
            trajectories = src["trajectories"] * scale
            peak = src["peak_turns_per_s"] * scale
            row = {"gpus": gpus, "model": model, "engines": round(engines), "trajectories": round(trajectories),
                   "demand": "simulated" if sim else f"extrapolated from {ref['gpus']:,}",
                   "turns_per_s_mean": src["turns"] / src["makespan_s"] * scale, "turns_per_s_peak": peak,
                   "tasks_per_s_peak": peak * doc["tasks_per_turn"]}
            row |= use(fits, engines, trajectories, peak)
            for k in ("scheduler", "driver"):  # against the step's mean demand
                row[k]["headroom_mean"] = row[k]["capacity_turns_per_s"] / row["turns_per_s_mean"]
            row["ok"] = served(fits, engines, trajectories, peak, doc["headroom_goal"])
            row["cells"] = cells_needed(fits, engines, trajectories, peak, doc["headroom_goal"])
            rows.append(row)
        fine = [r for r in rows if r["model"] == model and r["ok"]]
        headline[model] = {"largest_row": max((r["gpus"] for r in fine), default=None),
                           "largest_gpus": largest(fits, ref, doc["headroom_goal"]),
                           "largest_gpus_mean": largest(fits, ref, doc["headroom_goal"], peak=False)}
    return {"fits": fits, "rows": rows, "headline": headline}


# ------------------------------------------------------------------------------------------ main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", default="64,256,1024", help="GPU counts to simulate")
    ap.add_argument("--gpus", default="64,256,1024,4096", help="the table's cluster sizes")
    ap.add_argument("--models", default="dense,moe")
    ap.add_argument("--policy", default="prorsa")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of the peak demand's window")
    ap.add_argument("--measured", default=",".join(
        f"benchmarks/results/control-plane-scale-{x}.json" for x in ("256", "1024", "1024-16", "1024-32")),
                    help="control_plane.py --processes results files, comma-separated")
    ap.add_argument("--out", default="benchmarks/results/scale.json")
    ap.add_argument("--_point", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._point:
        gpus, model = args._point
        print(json.dumps(simulate_point(int(gpus), model, args.policy, args.window)))
        return

    demand = []
    for model in args.models.split(","):
        for gpus in (int(g) for g in args.simulate.split(",")):
            out = subprocess.run([sys.executable, __file__, "--_point", str(gpus), model, "--policy", args.policy,
                                  "--window", str(args.window)], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"error: simulating {model} on {gpus} GPUs: {out.stderr.strip().splitlines()[-1:]}")
            d = json.loads(out.stdout.strip().splitlines()[-1])
            demand.append(d)
            print(f"{model} {gpus} GPUs: {d['turns']} turns in {d['makespan_s']:.0f} s, peak "
                  f"{d['peak_turns_per_s']:.1f} turns/s ({d['sim_cpu_s']:.0f} s CPU)", file=sys.stderr, flush=True)
    paths = [Path(p) for p in args.measured.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {"command": "python benchmarks/scale.py " + " ".join(sys.argv[1:]),
           "date": datetime.date.today().isoformat(), "commit": commit,
           "machine": f"{platform.machine()}, shared 2-core", "tasks_per_turn": TASKS_PER_TURN,
           "headroom_goal": HEADROOM_GOAL, "per_gpu_trajectories": PER_GPU, "max_turns": MAX_TURNS,
           "policy": args.policy, "models": args.models.split(","),
           "gpus": [int(g) for g in args.gpus.split(",")], "demand": demand,
           "measured_from": [{"file": p.name, "command": json.loads(p.read_text())["command"]} for p in paths],
           "measured": measured_points(paths)}
    doc |= build(doc)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["rows"]:
        print(f"{r['gpus']} {r['model']}: peak {r['turns_per_s_peak']:.0f} turns/s, scheduler "
              f"{r['scheduler']['cpu_ms_per_turn']:.2f} ms/turn headroom {r['scheduler']['headroom']:.2f}, "
              f"driver {r['driver']['cpu_ms_per_turn']:.2f} ms/turn headroom {r['driver']['headroom']:.2f}")
    print(f"headline: {doc['headline']}; wrote {args.out}")


if __name__ == "__main__":
    main()
