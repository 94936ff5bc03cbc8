"""Does the RL loop still learn with partial rollouts on? `pipelines/rl-toy.yaml` (a tiny Llama on
3 vLLM CPU engines learns to call the calculator; tests/live/test_rl_loop.py holds it to learning
with over_sample 0.25), run as a user would with `partial_rollout: {over_sample: X, carry: true}`.

Per trained step (the step whose batch trained a trajectory; plain sync: its own step): the mean
reward and the share of first turns that call the calculator, the first and last four steps'
means, and what was dropped (cancelled in the last step, or past max_staleness). One run: the
engines' batching varies the samples run to run (four plain runs: the call share rose from
0.31-0.43 to 0.65-0.88).

With --weight-sync memory the new weights reach the engines through shared memory instead of a model
directory on disk (train.weight_sync); every update's save (the trainer's part: a directory written,
or the region filled) and push (the engines loading it) is kept from train.jsonl.

    .venv/bin/python benchmarks/rl_toy.py [--over-sample 0.25] [--weight-sync disk] [--steps 16]
        [--out benchmarks/results/rl-toy-partial.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
EDGE = 4  # steps averaged at each end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--over-sample", type=float, default=0.25, help="partial_rollout.over_sample (0: plain sync)")
    ap.add_argument("--weight-sync", choices=("disk", "memory"), default="disk", help="train.weight_sync")
    ap.add_argument("--steps", type=int, default=None, help="workload.steps (default: the pipeline's 16)")
    ap.add_argument("--out", default="benchmarks/results/rl-toy-partial.json")
    args = ap.parse_args()
    if args.over_sample < 0:
        sys.exit(f"error: --over-sample: at least 0, not {args.over_sample}")
    partial = [f"partial_rollout={{over_sample: {args.over_sample}, carry: true}}"] if args.over_sample else []
    extra = [f"train.weight_sync={args.weight_sync}"] + ([f"workload.steps={args.steps}"] if args.steps else [])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rl-toy-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", "pipelines/rl-toy.yaml", *partial, *extra,
                               "runtime.dashboard_address=null", f"output_dir={tmp}"], cwd=ROOT, text=True)
        if proc.returncode:
            sys.exit(f"error: the run failed ({proc.returncode})")
        (run_dir,) = Path(tmp).iterdir()
        rows = pq.read_table(run_dir / "trajectories.parquet").to_pylist()
        summary = json.loads((run_dir / "summary.json").read_text())
        updates = [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines()]
    trained = [r for r in rows if (r["trained_step"] if partial else r["step"]) is not None
               and r["status"] == "completed"]
    steps = sorted({r["trained_step"] if partial else r["step"] for r in trained})
    per = []
    for s in steps:
        batch = [r for r in trained if (r["trained_step"] if partial else r["step"]) == s]
        per.append({"step": s, "trajectories": len(batch),
                    "reward_mean": round(sum(r["reward"] for r in batch) / len(batch), 4),
                    "call_share": round(sum(bool(r["turns"][0]["tool_name"]) for r in batch) / len(batch), 4),
                    "older_turns": sum(t["policy_version"] < s for r in batch for t in r["turns"])})

    def mean(key: str, part: list[dict]) -> float:
        return round(sum(p[key] for p in part) / len(part), 4)

    result = {"command": "python benchmarks/rl_toy.py " + " ".join(sys.argv[1:]), "over_sample": args.over_sample,
              "weight_sync": args.weight_sync,
              "updates": [{k: u[k] for k in ("version", "save_s", "push_s")} for u in updates],
              "per_step": per, "dropped": len(rows) - len(trained), "makespan_s": summary["makespan_s"],
              "first": {k: mean(k, per[:EDGE]) for k in ("reward_mean", "call_share")},
              "last": {k: mean(k, per[-EDGE:]) for k in ("reward_mean", "call_share")}}
    print(json.dumps({k: v for k, v in result.items() if k != "per_step"}, indent=1),
          f"({time.perf_counter() - t0:.0f} s)")
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
