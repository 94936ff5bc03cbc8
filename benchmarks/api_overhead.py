"""The Python API's overhead against `prorsa run` on the same workload, side by side.

Both roll out the same synchronous steps (the same trajectories: the workload is a function of the
seed) on emulated engines, on the same cluster shape:
  run   `prorsa run PIPELINE` in a subprocess; its summary's makespan (the rollout, start-up excluded)
  api   prorsa.Rollout(PIPELINE) in a subprocess: generate() once per step, timed from the first
        call to the end of the last (start-up excluded, as for `run`)
Repeats alternate the two, so a machine that slows down slows both; medians are stored.

    .venv/bin/python benchmarks/api_overhead.py [--repeats 5] [--output benchmarks/results/api-overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PIPELINE = """\
name: api-overhead
seed: 7
policy: static:2:1
engines: {backend: emulated, count: 3, slots: 16, time_scale: 0.25}
workload: {family: swe, mode: sync, prompts: 4, group_size: 4, steps: 3, max_turns: 4, token_scale: 0.3,
           tool_time_scale: 0.2, weight_update_s: 0}
runtime: {turn_shape: driver, metrics_interval_s: 0.5, dashboard_address: null}
"""


def one_api(pipeline: Path) -> dict:
    import prorsa

    with prorsa.Rollout(pipeline) as rollout:
        t0 = time.perf_counter()
        out = [t for _ in range(rollout.cfg.workload.steps) for t in rollout.generate()]
        makespan = time.perf_counter() - t0
    return {"makespan_s": makespan, "completed": sum(t.status == "completed" for t in out), "trajectories": len(out)}


def one_run(pipeline: Path, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), f"output_dir={out}"],
                          capture_output=True, text=True, cwd=REPO, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"prorsa run failed: {proc.stderr[-2000:]}")
    (run_dir,) = out.iterdir()
    s = json.loads((run_dir / "summary.json").read_text())
    return {"makespan_s": s["makespan_s"], "completed": s["trajectories_completed"],
            "trajectories": s["trajectories_completed"] + s["trajectories_failed"]}


def measure(kind: str, pipeline: Path, tmp: Path) -> dict:
    if kind == "run":
        return one_run(pipeline, tmp / f"runs-{time.monotonic_ns()}")
    proc = subprocess.run([sys.executable, __file__, "--one", str(pipeline)], capture_output=True, text=True,
                          cwd=REPO, timeout=900, env=os.environ | {"PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"the API run failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--output", type=Path)
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a subprocess: one API measurement
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_api(args.one)))
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        pipeline = tmp / "pipeline.yaml"
        pipeline.write_text(PIPELINE)
        runs: dict[str, list[dict]] = {"run": [], "api": []}
        for r in range(args.repeats):
            for kind in ("run", "api") if r % 2 == 0 else ("api", "run"):
                runs[kind].append(measure(kind, pipeline, tmp))
                print(f"repeat {r} {kind}: {runs[kind][-1]['makespan_s']:.3f} s", flush=True)
    medians = {k: statistics.median(x["makespan_s"] for x in v) for k, v in runs.items()}
    doc = {
        "command": "python benchmarks/api_overhead.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%F"), "machine": f"{os.cpu_count()} cores, shared",
        "pipeline": PIPELINE, "repeats": args.repeats,
        "doors": {k: {"makespans_s": [round(x["makespan_s"], 4) for x in v], "median_s": round(medians[k], 4),
                      "completed": [x["completed"] for x in v], "trajectories": v[0]["trajectories"]}
                  for k, v in runs.items()},
        "api_overhead": round(medians["api"] / medians["run"] - 1, 4),
    }
    print(f"median makespan: prorsa run {medians['run']:.3f} s, Python API {medians['api']:.3f} s "
          f"({doc['api_overhead']:+.1%})")
    if args.output:
        args.output.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
