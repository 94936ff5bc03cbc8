"""The RL loop end to end on vLLM CPU engines: `prorsa run` with a `train:` section warms the tiny
model up, rolls out, takes GRPO steps and loads each new version into every engine in place."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from prorsa.train.export import read_batch

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def _run(pipeline: Path, out: Path, timeout: float) -> Path:
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), f"output_dir={out}"],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-4000:] + proc.stderr[-4000:]
    (run_dir,) = out.iterdir()
    return run_dir


def _updates(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines()]


# What the test asks of learning, from pipelines/rl-toy.yaml as shipped (fixed seed; the engines'
# batching still varies the samples run to run). Four runs: mean reward per step 0.032, 0.037,
# 0.044 and 0.038 over the first four steps, 0.101, 0.081, 0.069 and 0.085 over the last four;
# first turns calling the calculator 0.31 -> 0.88, 0.36 -> 0.80, 0.43 -> 0.65 and 0.38 -> 0.80.
# The bars sit under the slowest of them and well above what a policy that does not learn shows:
# a four-step mean over 256 samples varies by about 0.03 in the call share (binomial, p ~ 0.4)
# and about 0.004 in the reward: two such means of an unchanged policy differ by 0.15 (3.4 standard
# deviations of their difference) or 0.015 (2.7) rarely, and by both more rarely still.
FIRST_LAST = 4
MIN_REWARD_GAIN = 0.015
MIN_CALL_GAIN = 0.15


def test_rl_toy_learns_to_call_the_calculator(tmp_path):
    """pipelines/rl-toy.yaml as a user runs it: the warm-up, then 16 steps of rollout on vLLM
    engines, each tagged with the version that made it, a GRPO update between steps pushed into
    every engine, the batches exported, the report's training section; and the policy learns:
    the mean reward over the last steps beats the first steps' by MIN_REWARD_GAIN."""
    cfg = yaml.safe_load((ROOT / "pipelines" / "rl-toy.yaml").read_text())
    steps, batch = cfg["workload"]["steps"], cfg["workload"]["prompts"] * cfg["workload"]["group_size"]
    run_dir = _run(ROOT / "pipelines" / "rl-toy.yaml", tmp_path / "runs", timeout=2700)
    t = pq.read_table(run_dir / "trajectories.parquet", columns=["step", "policy_version", "reward", "turns"]).to_pandas()
    assert len(t) == steps * batch and t["reward"].notna().all()
    assert (t["policy_version"] == t["step"]).all()  # sync: step k is rolled out by version k
    ups = _updates(run_dir)
    assert [u["version"] for u in ups] == list(range(1, steps))
    assert all(u["trajectories"] == batch and u["max_staleness"] == 0 and u["push_s"] > 0 for u in ups)
    assert all(np.isfinite(u["loss"]) for u in ups)
    assert (run_dir / "weights" / f"v{steps - 1}" / "model.safetensors").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train"]["policy_versions"] == steps - 1
    exported = read_batch(run_dir / "batches" / "v0.parquet")
    assert len(exported) == batch and {e.sample.policy_version for e in exported} == {0}
    assert all(sum(e.sample.loss_mask) > 0 for e in exported)

    reward = t.groupby("step")["reward"].mean().to_numpy()
    t["called"] = [bool(turns[0]["tool_name"]) for turns in t["turns"]]
    called = t.groupby("step")["called"].mean().to_numpy()
    print(f"reward per step: {np.round(reward, 3).tolist()}")
    print(f"first turns calling the calculator: {np.round(called, 2).tolist()}")
    first, last = reward[:FIRST_LAST].mean(), reward[-FIRST_LAST:].mean()
    assert last >= first + MIN_REWARD_GAIN, (first, last)
    assert called[-FIRST_LAST:].mean() >= called[:FIRST_LAST].mean() + MIN_CALL_GAIN

    report = subprocess.run([sys.executable, "-m", "prorsa.cli", "report", str(run_dir)],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    text = (run_dir / "report" / "report.md").read_text()
    assert "### Training" in text and (run_dir / "report" / "reward.png").is_file()


def test_async_training_keeps_every_trained_trajectory_within_max_staleness(tmp_path):
    """Async, with the trainer on a Dask worker of its own (train.placement: worker)."""
    cfg = yaml.safe_load((ROOT / "pipelines" / "rl-toy.yaml").read_text())
    cfg["name"] = "rl-async"
    cfg["policy"] = "static:1:1"
    cfg["engines"]["count"] = 2
    cfg["workload"] |= {"mode": "async", "prompts": 2, "group_size": 4, "concurrency": 16, "trajectories": 48}
    cfg["train"] |= {"sft_steps": 0, "max_staleness": 1, "placement": "worker"}
    pipeline = tmp_path / "async.yaml"
    pipeline.write_text(yaml.safe_dump(cfg))
    run_dir = _run(pipeline, tmp_path / "runs", timeout=900)
    t = pq.read_table(run_dir / "trajectories.parquet", columns=["traj_id", "policy_version"]).to_pandas()
    assert len(t) == 48 and t["traj_id"].is_unique
    ups = _updates(run_dir)
    assert len(ups) >= 3  # the gate held rollout back while updates ran, so versions moved on
    assert all(u["max_staleness"] <= 1 for u in ups)
    trained = sum(u["trajectories"] for u in ups)
    assert trained + sum(u["dropped_stale"] for u in ups) <= len(t)
    # every trained trajectory's own version, against the trainer's version when it was trained
    for u in ups:
        batch = read_batch(run_dir / "batches" / f"v{u['version'] - 1}.parquet") if u["trajectories"] else []
        assert all(u["version"] - 1 - e.sample.policy_version <= 1 for e in batch)
    assert t["policy_version"].max() >= 2
