"""Rollout batches in a trainer-neutral file: parquet, one row per trajectory, plain columns.

    write_batch(path, samples, advantages) -> Path   written under a temporary name, then renamed
    read_batch(path) -> [ExportedSample]

Columns (the schema's metadata says `format: prorsa-rollout-batch`, `version: 1`):

    traj_id           string
    group             string         trajectories sharing a prompt (advantages are relative to it)
    policy_version    int32          the weights that generated the trajectory
    token_ids         list<int32>    prompt, generated turns and tool observations, in order
    loss_mask         list<int8>     1 on tokens the policy generated
    rollout_logprobs  list<float32>  the engine's logprob per token, 0.0 where loss_mask is 0
    reward            float64
    advantage         float32        what prorsa's GRPO computed (group-normalised)

This is the shape verl's and OpenRLHF's experience batches are built from (input ids, an action
or response mask, old logprobs, per-sequence advantages) and what a TRL trainer can take as a
dataset with `datasets.Dataset.from_parquet`: nothing here needs prorsa to read it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from prorsa.train.samples import Sample

FORMAT, VERSION = "prorsa-rollout-batch", "1"
SCHEMA = pa.schema([
    ("traj_id", pa.string()), ("group", pa.string()), ("policy_version", pa.int32()),
    ("token_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
    ("rollout_logprobs", pa.list_(pa.float32())), ("reward", pa.float64()), ("advantage", pa.float32()),
], metadata={"format": FORMAT, "version": VERSION})


@dataclass(frozen=True)
class ExportedSample:
    sample: Sample
    advantage: float


def write_batch(path: str | Path, samples: Sequence[Sample], advantages: Sequence[float]) -> Path:
    if len(samples) != len(advantages):
        raise ValueError(f"{len(samples)} samples but {len(advantages)} advantages")
    path = Path(path)
    rows = [{"traj_id": s.traj_id, "group": s.group, "policy_version": s.policy_version,
             "token_ids": list(s.token_ids), "loss_mask": list(s.loss_mask),
             "rollout_logprobs": list(s.rollout_logprobs), "reward": s.reward, "advantage": a}
            for s, a in zip(samples, advantages)]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_batch(path: str | Path) -> list[ExportedSample]:
    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    if meta.get(b"format") != FORMAT.encode():
        raise ValueError(f"{path}: not a {FORMAT} file (schema metadata format={meta.get(b'format')!r})")
    if meta.get(b"version") != VERSION.encode():
        raise ValueError(f"{path}: {FORMAT} version {meta.get(b'version', b'?').decode()}, this reader knows {VERSION}")
    return [ExportedSample(Sample(tuple(r["token_ids"]), tuple(r["loss_mask"]), tuple(r["rollout_logprobs"]),
                                  r["reward"], r["group"], r["policy_version"], r["traj_id"]), r["advantage"])
            for r in table.to_pylist()]
