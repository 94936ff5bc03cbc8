"""A `prorsa serve` run's folder: the conversations it served, replayed as a trace.

Each served conversation is a row of the run's trajectories.parquet (metrics/outputs.py): per
turn, the tokens its request appended (`prefill_tokens`: the first prompt, then what each later
request added after the model's reply), the tokens the model generated, and `tool_s`, the
seconds from a reply to the client's next request: the client's own time (its tools, its agent
loop), taken as is. The conversation's `start_s` (on the run's clock) is its release. Only
completed conversations replay; a serve run's reward is the client's, so none is kept.
"""

from __future__ import annotations

from pathlib import Path

from prorsa.agent.importers.common import Progress, RecordedRun, RecordedTurn, TraceError

NAME = "serve"
SUMMARY = "a prorsa serve (or run) folder: its trajectories.parquet"

FILE = "trajectories.parquet"
_COLUMNS = ["traj_id", "status", "start_s", "turns"]


def parquet_of(path: Path) -> Path:
    return path / FILE if path.is_dir() else path


def read(path: Path, progress: Progress | None = None) -> list[RecordedRun]:
    import pyarrow as pa  # here: the other formats, and the CLI's --help, need none of it
    import pyarrow.parquet as pq

    file = parquet_of(path)
    if not file.is_file():
        raise TraceError(f"{path}: not a run folder (no {FILE} in it)")
    try:
        rows = pq.read_table(file, columns=_COLUMNS).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{file}: unreadable ({exc})") from None
    runs = []
    for i, row in enumerate(rows):
        if progress is not None:
            progress(1)
        if row["status"] != "completed" or not row["turns"]:
            continue
        turns = tuple(RecordedTurn(t["prefill_tokens"], t["decode_tokens"], t["tool_s"] or 0.0, 0) for t in row["turns"])
        runs.append(RecordedRun(row["traj_id"], turns, row["start_s"], f"{file}: row {i}"))
    if not runs:
        raise TraceError(f"{file}: no completed conversation to replay")
    return runs


def count(path: Path) -> int:
    """Rows to read, for a progress bar."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(parquet_of(path)).metadata.num_rows
