"""Recorded agent runs into Prorsa traces (agent/trace.py), one small reader per format.

    FORMATS[name]                     the registry: name -> Format (summary, claims, read)
    detect(path) -> name              the format by content: a folder's files, else the first record
    work(path, name) -> int | None    units a reader will report to its progress callback (bytes of a
                                      file, files or rows of a folder; None: unknown, e.g. gzip)
    import_trace(path, name, options, progress) -> (name, [TrajectorySpec])
                                      read, check and convert; TraceError (one line naming the file,
                                      the line or record, and the field) for anything it cannot use

What every format becomes: per model call, the tokens it appended (its prompt less the previous
call's prompt and completion; a context reset starts afresh), the tokens it decoded, and the
gap to the next call as the tool time. Each reader's docstring says what its gaps measure; gaps
that hold the model's own time (start to start, or end to end) are taken as they are unless
ImportOptions.decode_tps subtracts an estimate of it (common.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prorsa.agent.importers import dynamo, llmservingsim, openai_log, serve_run, sweagent, turns
from prorsa.agent.importers.common import ImportOptions, Progress, RecordedRun, Source, TraceError, to_specs
from prorsa.agent.trace import TrajectorySpec

__all__ = ["FORMATS", "ImportOptions", "TraceError", "detect", "import_trace", "work"]


@dataclass(frozen=True)
class Format:
    name: str  # what --format takes
    summary: str  # one line for --help
    claims: Callable[[object], bool]  # does this first record look like ours (auto-detection)
    read: Callable[[Path, Progress | None], list[RecordedRun]]


def _never(_: object) -> bool:
    return False  # a serve run is a folder or a .parquet file: found by name, not by a record


# Order matters for detection: the most specific shapes first (a per-turn line also has no usage).
FORMATS: dict[str, Format] = {m.NAME: Format(m.NAME, m.SUMMARY, m.claims, m.read) for m in (
    sweagent, llmservingsim, dynamo, turns, openai_log)}
FORMATS[serve_run.NAME] = Format(serve_run.NAME, serve_run.SUMMARY, _never, serve_run.read)


def _head(path: Path) -> object:
    """The first record: a JSONL file's first line, else the whole (pretty-printed) document."""
    src = Source(path)
    try:
        return next(iter(src.lines()), None)[1]  # type: ignore[index]
    except TraceError:
        return src.document()  # a JSON document over several lines (trajectory files)
    except TypeError:
        raise TraceError(f"{path}: the file is empty") from None


def detect(path: Path) -> str:
    if path.is_dir():
        if (path / serve_run.FILE).is_file():
            return serve_run.NAME
        if sweagent.files_in(path):
            return sweagent.NAME
        raise TraceError(f"{path}: a folder with neither {serve_run.FILE} nor trajectory files (*.traj.json)")
    if path.suffix == ".parquet":
        return serve_run.NAME
    head = _head(path)
    for fmt in FORMATS.values():
        if fmt.claims(head):
            return fmt.name
    fields = ", ".join(list(head)[:8]) if isinstance(head, dict) else type(head).__name__
    raise TraceError(f"{path}: cannot tell the format from its first record ({fields}); "
                     f"name it with --format ({', '.join(FORMATS)})")


def work(path: Path, name: str) -> int | None:
    if name == serve_run.NAME:
        return serve_run.count(path)
    if path.is_dir():
        return len(sweagent.files_in(path))
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return None if gzipped else path.stat().st_size


def import_trace(path: str | Path, name: str = "auto", options: ImportOptions = ImportOptions(),
                 progress: Progress | None = None) -> tuple[str, list[TrajectorySpec]]:
    """The trajectories recorded at `path`, and the format they were read as."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file or folder")
    name = detect(path) if name == "auto" else name
    if name not in FORMATS:
        raise TraceError(f"unknown trace format {name!r}; known: auto, {', '.join(FORMATS)}")
    runs = FORMATS[name].read(path, progress)
    try:
        return name, to_specs(runs, options)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}" if str(exc) == "no trajectories found" else str(exc)) from None
