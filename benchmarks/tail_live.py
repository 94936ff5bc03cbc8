"""A scheduling mechanism live on vLLM CPU engines, beside the simulator's prediction for the same runs.

`--mechanism priority` (admission by predicted remainder, the default) or `migrate` (a trajectory
moves while its tool runs, its next engine warmed meanwhile; both ways then route by the cost rule
in the driver turn shape, so only the mechanism differs).

The quickstart pipeline (3 vLLM CPU engines, a tiny model made locally) changed so that turns queue
for admission: colocated engines of 2 slots each (`engines.slots` is each engine worker's Dask
resource, so at most 2 of its turns run at once and the rest wait in the worker's queue, ordered by
the turn's priority), up to 8 turns a trajectory; 2 sync steps of 16 trajectories, 5-6 on each
engine. That is also a workload where the simulator predicts a gain for its seed 0.

1. Live, the mechanism (`scheduling.<mechanism>`) off and on, `--repeats` times each, interleaved (off on, on off, ...)
   so that the shared machine's load drifts over both alike (`prorsa run`, as fidelity_vllm.py runs
   it); or `--runs DIR...` to read existing run directories (on or off read from each pipeline.json).
2. Simulated both ways with the pipeline's own profile (`engines.gpu`, one engine calibrated alone),
   and with that profile corrected to the off runs, their turns pooled (fidelity_vllm.py's
   fit, calibration/from_runs.py): the on runs are then a prediction the fit never saw. The
   fit corrects vLLM CPU engines through their host load, so it only ever slows them: where the
   live engines run faster than the profile it ends at the profile's speed, not converged.
3. How the simulator's ratio moves with the workload's seed (`--sim-seeds`): a sync step of this
   size ends with a handful of trajectories, so one seed's prediction is one draw.

Reported: makespan medians and off / on (> 1: the mechanism shortened the run), and per turn the seconds
it waited: its wall time less prefill, KV transfer, decode and tool time (so the engine's own
queue, the Dask worker's queue for a slot and the dispatch), for every turn and for the turns of
each step's longest quarter of trajectories (by decode tokens: the same trajectories in every run),
which is whom priority should serve first, and by the trajectory that ended each step (the one the
step waited for). A live turn's `queue_s` is vLLM's own queue, which the
2 Dask slots keep near empty; the simulator's engines hold the queue themselves.

    .venv/bin/python benchmarks/tail_live.py [--mechanism priority|migrate] [--repeats 3] [--seed 0]
        [--keep DIR] [--runs RUN...] [--sim-seeds 8] [--output benchmarks/results/tail-live[-migrate].json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))

from fidelity_vllm import ROOT, live_run  # noqa: E402

PIPELINE = ROOT / "pipelines/quickstart.yaml"
# what changes in the quickstart: turns queue for admission on every engine
OVERRIDES = {"policy": "colocated", "engines": {"slots": 2}, "workload": {"max_turns": 8}}
# what a mechanism needs beside it, off and on alike
NEEDS = {"priority": {}, "migrate": {"runtime": {"sticky_overload": "cost", "turn_shape": "driver"}}}
LONG_SHARE = 0.25  # the longest quarter of each step's trajectories


def variant(raw: dict, mechanism: str, on: bool, seed: int) -> dict:
    out = dict(raw) | {"seed": seed, "scheduling": {mechanism: on}}
    for k, v in (OVERRIDES | NEEDS[mechanism]).items():
        out[k] = (dict(raw.get(k) or {}) | v) if isinstance(v, dict) else v
    return out


def long_ids(rows: list[dict]) -> set[str]:
    """Each step's longest quarter of trajectories by decode tokens (at least one a step)."""
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    out: set[str] = set()
    for rs in by_step.values():
        rs = sorted(rs, key=lambda r: (-sum(t["decode_tokens"] for t in r["turns"]), r["traj_id"]))
        out |= {r["traj_id"] for r in rs[: max(1, round(len(rs) * LONG_SHARE))]}
    return out


def waited(t: dict) -> float:
    """A turn's wall seconds outside prefill, KV transfer, decode and its tool: queues and dispatch."""
    busy = sum(t.get(k) or 0.0 for k in ("prefill_s", "transfer_s", "decode_s", "tool_s"))
    return max(t["end_s"] - t["start_s"] - busy, 0.0)


def turn_figures(rows: list[dict]) -> dict:
    """Mean seconds a turn waited, over all turns, the longest quarter's and the rest's; the seconds
    the trajectory that ended each step waited, summed over the steps; vLLM's or the emulated
    engine's own queue (queue_s) a turn beside them."""
    long = long_ids(rows)
    groups: dict[str, list[dict]] = {"all": [], "long": [], "rest": []}
    for r in rows:
        for t in r["turns"]:
            groups["all"].append(t)
            groups["long" if r["traj_id"] in long else "rest"].append(t)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    last: dict[int, dict] = {}
    for r in rows:
        if r["step"] not in last or r["end_s"] > last[r["step"]]["end_s"]:
            last[r["step"]] = r
    return {"turns": len(groups["all"]),
            "waited_last_s": sum(waited(t) for r in last.values() for t in r["turns"]),
            "engine_queue_s": mean([t["queue_s"] or 0.0 for t in groups["all"]]),
            **{f"waited_{g}_s": mean([waited(t) for t in ts]) for g, ts in groups.items()}}


def simulated(cfg, gpu: str, scratch: Path) -> dict:
    from prorsa.calibration.from_runs import simulate_with

    makespan, rows = simulate_with(cfg, gpu, scratch)
    return {"makespan_s": makespan, **turn_figures(rows)}


def with_mechanism(cfg, mechanism: str, on: bool):
    return cfg.model_copy(update={"scheduling": cfg.scheduling.model_copy(update={mechanism: on})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", type=Path, default=PIPELINE, help="the pipeline OVERRIDES change")
    ap.add_argument("--mechanism", choices=sorted(NEEDS), default="priority", help="the scheduling option measured")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="live runs each way")
    ap.add_argument("--runs", nargs="+", type=Path, metavar="RUN", help="existing live run directories, both ways")
    ap.add_argument("--keep", type=Path, help="leave the live run directories here (default: deleted)")
    ap.add_argument("--sim-seeds", type=int, default=8, help="workload seeds the simulator's ratio is shown over")
    ap.add_argument("--output", type=Path, help="default: benchmarks/results/tail-live.json, or "
                    "tail-live-<mechanism>.json for another mechanism than priority")
    args = ap.parse_args()
    mech = args.mechanism
    args.output = args.output or ROOT / "benchmarks/results" / (
        "tail-live.json" if mech == "priority" else f"tail-live-{mech}.json")

    from rich.console import Console
    from rich.table import Table

    from prorsa.calibration.from_runs import describe, fit_to_run, fitted_profile, load_live_run

    raw = yaml.safe_load(args.pipeline.read_text())
    live: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = args.keep.resolve() if args.keep else tmp / "runs"
        dirs = list(args.runs or [])
        if not dirs:
            for prio in (False, True):
                (tmp / f"tail-live-{'on' if prio else 'off'}.yaml").write_text(
                    yaml.safe_dump(variant(raw, mech, prio, args.seed), sort_keys=False))
            for r in range(args.repeats):
                for prio in ((False, True) if r % 2 == 0 else (True, False)):
                    load = os.getloadavg()[0]
                    t0 = time.time()
                    d = live_run(tmp / f"tail-live-{'on' if prio else 'off'}.yaml", args.seed, out / f"r{r}")
                    dirs.append(d)
                    live.append({"load_before": round(load, 2), "wall_s": round(time.time() - t0, 1)})
        else:
            live = [{} for _ in dirs]
        cfgs = {}
        pooled_off: list[dict] = []
        for i, d in enumerate(dirs):
            cfg, summary, rows = load_live_run(Path(d))
            prio = getattr(cfg.scheduling, mech)
            cfgs.setdefault(prio, cfg)
            if not prio:
                pooled_off += rows
            live[i] |= {"order": i, "on": prio, "seed": cfg.seed, "makespan_s": summary["makespan_s"],
                        "turns_migrated": summary.get("turns_migrated", 0), **turn_figures(rows)}
            print(f"live {i}: {mech} {'on' if prio else 'off'}, makespan {summary['makespan_s']:.1f} s",
                  file=sys.stderr)
        if set(cfgs) != {False, True}:
            sys.exit(f"error: need live runs with scheduling.{mech} off and on")
        cfg = cfgs[False]
        gpu = cfg.engines.gpu
        header = (f"{gpu} corrected to {sum(not r['on'] for r in live)} {mech}-off run(s) of the "
                  f"tail-live pipeline by benchmarks/tail_live.py, {time.strftime('%F')}")
        fits = fit_to_run(cfg, pooled_off, tmp / "fit", header)
        fitted = str(fitted_profile(cfg, tmp / "fit"))
        sim = {name: {way: simulated(with_mechanism(cfg, mech, prio), profile, tmp / f"sim-{name}-{way}")
                      for way, prio in (("off", False), ("on", True))}
               for name, profile in (("calibrated", gpu), ("fitted", fitted))}
        seeds = {name: [] for name in sim}
        for s in range(args.sim_seeds):
            c = cfg.model_copy(update={"seed": s})
            for name, profile in (("calibrated", gpu), ("fitted", fitted)):
                m = [simulated(with_mechanism(c, mech, p), profile, tmp / f"seed-{name}-{s}-{p}")["makespan_s"]
                     for p in (False, True)]
                seeds[name].append({"seed": s, "off_s": m[0], "on_s": m[1], "ratio": m[0] / m[1]})

    way = {False: "off", True: "on"}
    med = {w: {k: statistics.median(r[k] for r in live if way[r["on"]] == w)
               for k in ("makespan_s", "engine_queue_s", "waited_all_s", "waited_long_s", "waited_rest_s",
                        "waited_last_s")}
           for w in ("off", "on")}
    live_ratio = med["off"]["makespan_s"] / med["on"]["makespan_s"]

    console = Console(width=160)
    t = Table(title=f"scheduling.{mech}, live vLLM CPU engines vs simulated: {args.pipeline.stem} "
                    f"with {json.dumps(OVERRIDES)}, seed {cfg.seed} (makespan, s)")
    for col in (f"scheduling.{mech}", "live runs", "live median", f"sim ({gpu})", "sim (fitted to off)"):
        t.add_column(col, justify="right")
    for w in ("off", "on"):
        runs = " ".join(f"{r['makespan_s']:.1f}" for r in live if way[r["on"]] == w)
        t.add_row(w, runs, f"{med[w]['makespan_s']:.2f}", f"{sim['calibrated'][w]['makespan_s']:.2f}",
                  f"{sim['fitted'][w]['makespan_s']:.2f}")
    t.add_row("off / on", "", f"{live_ratio:.3f}",
              *(f"{sim[n]['off']['makespan_s'] / sim[n]['on']['makespan_s']:.3f}" for n in ("calibrated", "fitted")))
    console.print(t)
    q = Table(title="seconds waited (wall less prefill, transfer, decode, tool), a turn; live: median of runs")
    for col in ("turns", "live off", "live on", "sim off", "sim on", "fitted off", "fitted on"):
        q.add_column(col, justify="right")
    for key, label in (("waited_all_s", "all"), ("waited_long_s", "longest quarter"), ("waited_rest_s", "the rest"),
                       ("engine_queue_s", "engine queue only"), ("waited_last_s", "last to end, a step (sum)")):
        q.add_row(label, f"{med['off'][key]:.3f}", f"{med['on'][key]:.3f}",
                  *(f"{sim[n][w][key]:.3f}" for n in ("calibrated", "fitted") for w in ("off", "on")))
    console.print(q)
    for name, rs in seeds.items():
        console.print(f"sim ({name}) off / on over seeds 0-{args.sim_seeds - 1}: "
                      + " ".join(f"{r['ratio']:.3f}" for r in rs)
                      + f" (median {statistics.median(r['ratio'] for r in rs):.3f})")
    history = describe(fits)
    print("\n".join(history))
    command = "python benchmarks/tail_live.py " + " ".join(sys.argv[1:])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "command": command.strip(), "date": time.strftime("%F"), "machine": f"{os.cpu_count()} cores, shared",
        "pipeline": args.pipeline.name, "mechanism": mech, "overrides": OVERRIDES | NEEDS[mech], "seed": cfg.seed, "profile": gpu,
        "live": live, "live_median": med, "live_ratio": live_ratio, "sim": sim, "sim_seeds": seeds,
        "corrections": history}, indent=1) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
