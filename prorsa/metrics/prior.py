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

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from prorsa.agent.trace import TrajectorySpec, turns_as_ran, workload_means
from prorsa.config.workload import ExpectConfig

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
    """Means over the completed trajectories of every run under `path`."""
    files = _files(Path(path))
    specs = [s for f in files for s in _completed(f, path)]
    if not specs:
        raise PriorError(f"{path}: no completed trajectory to learn from")
    means = workload_means(specs)
    return ExpectConfig(**means | {"decode_tokens": max(means["decode_tokens"], 1.0), "turns": max(means["turns"], 1.0)})


def prior_trajectories(path: str | Path, limit: int = 4096) -> tuple[TrajectorySpec, ...]:
    """Up to `limit` completed trajectories of the first run under `path`, its last step's first."""
    done = sorted(_completed(_files(Path(path))[0], path), key=lambda s: (-s.step, s.prompt_index, s.group_index))
    return tuple(replace(s, seed=i) for i, s in enumerate(done[:limit]))


def _files(path: Path) -> list[Path]:
    if not path.exists():
        raise PriorError(f"{path}: no such run directory")
    files = prior_files(path)
    if not files:
        raise PriorError(f"{path}: not a run directory (no {_FILE} in it or in its runs)")
    return files


def _completed(file: Path, path: str | Path) -> list[TrajectorySpec]:
    """The completed trajectories of one trajectories.parquet, as they ran."""
    cols = ["traj_id", "family", "step", "prompt_index", "group_index", "status", "turns"]
    try:
        rows = pq.read_table(file, columns=cols).to_pylist()
    except (OSError, pa.ArrowException) as err:
        raise PriorError(f"{path}: unreadable {_FILE} ({err})") from None
    return [TrajectorySpec(traj_id=r["traj_id"], family=r["family"], prompt_index=r["prompt_index"],
                           group_index=r["group_index"], step=r["step"], seed=0,
                           turns=turns_as_ran([(t["prefill_tokens"], t["decode_tokens"], t["tool_s"]) for t in r["turns"]]))
            for r in rows if r["status"] == "completed" and r["turns"]]
