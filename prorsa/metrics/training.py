"""What a training run's directory says about learning (a pipeline with `train:`).

    by_version(run_dir) -> DataFrame | None   per policy version: trajectories, mean reward, and
                                               the span of the rollouts it generated (makespan)
    updates(run_dir) -> DataFrame | None       train.jsonl: one row per weight update
    loss_name(pipeline) -> str                 what train.jsonl's `loss` is: GRPO's, or the named
                                               trainer's own (train.trainer), in words

None when the run did no training (one policy version, no train.jsonl).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

TRAIN_LOG = "train.jsonl"  # written by train/learner.py


def updates(run_dir: Path) -> pd.DataFrame | None:
    path = Path(run_dir) / TRAIN_LOG
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return pd.DataFrame(rows) if rows else None


def by_version(run_dir: Path) -> pd.DataFrame | None:
    path = Path(run_dir) / "trajectories.parquet"
    if updates(run_dir) is None or "policy_version" not in pq.read_schema(path).names:
        return None
    t = pq.read_table(path, columns=["policy_version", "status", "reward", "start_s", "end_s"]).to_pandas()
    g = t.groupby("policy_version")
    out = pd.DataFrame({
        "trajectories": g.size(),
        "completed": g["status"].apply(lambda s: int((s == "completed").sum())),
        "reward_mean": g["reward"].apply(lambda r: float(np.nanmean(r)) if r.notna().any() else np.nan),
        "rollout_start_s": g["start_s"].min(),
        "rollout_end_s": g["end_s"].max(),
    })
    out["makespan_s"] = out["rollout_end_s"] - out["rollout_start_s"]
    return out.reset_index()


def loss_name(pipeline: dict | None) -> str:
    """A trainer of the user's (train.trainer "module:Class") reports its own loss, whatever it is."""
    train = (pipeline or {}).get("train") or {}
    trainer = train.get("trainer")
    if not trainer:
        return f"{str(train.get('algorithm', 'grpo')).upper()} loss"
    return f"{trainer.rpartition(':')[2]} loss"
