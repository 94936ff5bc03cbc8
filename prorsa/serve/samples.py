"""Served conversations back from a run folder, as a trainer takes them.

    served_samples(run_dir, tokenizer) -> [Sample]   one per saved conversation (train/samples.py
                                                     Sample: token ids, loss mask, rollout logprobs)

A served trajectory in trajectories.parquet (the schema every run writes, metrics/outputs.py):
`prompt_ids` is the first request's prompt, each turn's `token_ids` and `logprobs` what the model
generated, and each turn's `observation` the text the next request added (serve/transcript.py),
tokenized alone when it was served, so the same tokenizer gives its ids again:

    prompt_ids | turn_0.token_ids | encode(turn_0.observation) | turn_1.token_ids | ...
        0      |        1         |             0              |        1         |

The reward is NaN (the client's trainer scores the conversation); `group` is the session.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from prorsa.train.samples import Sample, SequenceBuilder


def served_sample(row: dict[str, Any], tokenizer: Any) -> Sample:
    b = SequenceBuilder(row["prompt_ids"])
    for t in row["turns"]:
        b.generated(t["token_ids"] or [], t["logprobs"] or None, row["traj_id"])  # None: NaN, the trainer's to compute
        if t["observation"]:
            b.appended(tokenizer.encode(t["observation"], add_special_tokens=False))
    return b.sample(math.nan, row["task_id"], row["policy_version"] or 0, row["traj_id"])


def served_samples(run_dir: str | Path, tokenizer: Any) -> list[Sample]:
    rows = pq.read_table(Path(run_dir) / "trajectories.parquet").to_pylist()
    return [served_sample(r, tokenizer) for r in rows if r["status"] == "completed" and r["turns"]]
