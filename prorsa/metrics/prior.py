"""An earlier run's workload, measured: the prior a later run's policy may plan its opening from.

    read_prior(path) -> ExpectConfig   means over the completed trajectories of a run directory
                                       (its trajectories.parquet), a `prorsa sim --output` folder
                                       (every run in it), or a trajectories.parquet file
    prior_trajectories(path, limit)    the completed trajectories of the first run there, as
                                       they ran (TrajectorySpec: what the policy may rehearse)
    PriorError                         the path holds no run, or no completed trajectory

What a run observed of itself is all it saves: per trajectory, what each turn appended and
decoded, how long each tool call took, and how many turns it ran. The same means a pipeline may
declare (`prior:` as a mapping), so a measured prior and a declared one are one type.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.config.pipeline import ExpectConfig

_FILE = "trajectories.parquet"


class PriorError(ValueError):
    pass


def prior_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if (path / _FILE).is_file():
        return [path / _FILE]
    base = path / "runs" if (path / "runs").is_dir() else path
    return sorted(base.glob(f"*/{_FILE}"))


def read_prior(path: str | Path) -> ExpectConfig:
    path = Path(path)
    if not path.exists():
        raise PriorError(f"{path}: no such run directory")
    files = prior_files(path)
    if not files:
        raise PriorError(f"{path}: not a run directory (no {_FILE} in it or in its runs)")
    try:
        tables = [pq.read_table(f, columns=["status", "turns"]) for f in files]
    except (OSError, pa.ArrowException) as err:
        raise PriorError(f"{path}: unreadable {_FILE} ({err})") from None
    turns = [t.filter(pc.equal(t["status"], "completed"))["turns"] for t in tables]
    n = sum(len(c) for c in turns)
    if n == 0:
        raise PriorError(f"{path}: no completed trajectory to learn from")
    prompt, obs, dec, tool, count = [], [], [], [], []
    for chunk in turns:
        lists = chunk.combine_chunks()
        lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(lists)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        first = np.zeros(len(flat), bool)
        first[starts[lengths > 0]] = True
        last = np.zeros(len(flat), bool)
        last[(starts + lengths - 1)[lengths > 0]] = True
        appended = pc.struct_field(flat, "prefill_tokens").to_numpy(zero_copy_only=False)
        prompt.append(appended[first])
        obs.append(appended[~first])
        dec.append(pc.struct_field(flat, "decode_tokens").to_numpy(zero_copy_only=False))
        tool.append(pc.struct_field(flat, "tool_s").to_numpy(zero_copy_only=False)[~last])
        count.append(lengths[lengths > 0])

    def mean(parts: list[np.ndarray], default: float) -> float:
        x = np.concatenate(parts).astype(float)
        return float(x.mean()) if len(x) else default

    return ExpectConfig(prompt_tokens=mean(prompt, 0.0), observation_tokens=mean(obs, 0.0),
                        decode_tokens=max(mean(dec, 1.0), 1.0), tool_s=mean(tool, 0.0),
                        turns=max(mean(count, 1.0), 1.0))


def prior_trajectories(path: str | Path, limit: int = 4096) -> tuple[TrajectorySpec, ...]:
    """Up to `limit` completed trajectories of the first run under `path`, its last step's first."""
    files = prior_files(Path(path))
    if not files:
        raise PriorError(f"{path}: not a run directory (no {_FILE} in it or in its runs)")
    cols = ["traj_id", "family", "step", "prompt_index", "group_index", "status", "turns"]
    try:
        rows = pq.read_table(files[0], columns=cols).to_pylist()
    except (OSError, pa.ArrowException) as err:
        raise PriorError(f"{path}: unreadable {_FILE} ({err})") from None
    done = sorted((r for r in rows if r["status"] == "completed" and r["turns"]),
                  key=lambda r: (-r["step"], r["prompt_index"], r["group_index"]))[:limit]
    out = []
    for i, r in enumerate(done):
        turns = r["turns"]
        out.append(TrajectorySpec(
            traj_id=r["traj_id"], family=r["family"], prompt_index=r["prompt_index"], group_index=r["group_index"],
            step=r["step"], seed=i, turns=tuple(
                TurnSpec(t["prefill_tokens"], t["decode_tokens"], 0.0 if k == len(turns) - 1 else t["tool_s"],
                         k == len(turns) - 1) for k, t in enumerate(turns))))
    return tuple(out)
