"""Tasks from a Hugging Face dataset on disk, mapped to Task fields by a declared column mapping.

    hf_tasks(path, columns, split) -> [Task]   read the dataset, one Task per row
    DatasetError                                 one line that starts with the field at fault
                                                 (dataset, split, columns.<field>); never a traceback

What is read (no hub: every path is local, and the library is told so):
    a directory saved with `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (a DatasetDict: `split`)
    a .parquet, .jsonl, .json or .csv file, or a directory of them (`load_dataset` with its builder)

The mapping (config/environment.py TaskColumns) names the column of each field: `prompt` always,
`answer`, `task_id`, `calls` and `tests` when the dataset has them. A `calls` value is a list of
{name, arguments} records or the same as JSON text; replay mode runs them (agent/environment.py).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from prorsa.agent.datasets.base import Task
from prorsa.agent.tools.base import ToolCall

_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
_FIELDS = ("prompt", "answer", "task_id", "calls", "tests")


class DatasetError(ValueError):
    """A dataset that cannot be read, or a mapping that does not fit it."""


class Columns(Protocol):  # config/environment.py TaskColumns; agent/ reads it without the schema
    prompt: str
    answer: str | None
    task_id: str | None
    calls: str | None
    tests: str | None


def hf_tasks(path: str | Path, columns: Columns, split: str = "train") -> list[Task]:
    path = Path(path)
    table = _load(path, split)
    names = set(table.column_names)
    for field in _FIELDS:
        col = getattr(columns, field)
        if col is not None and col not in names:
            raise DatasetError(f"columns.{field}: no column {col!r} in {path} "
                               f"(its columns: {', '.join(sorted(names))})")
    family = path.stem if path.is_file() else path.name
    tasks = [_task(row, i, columns, family) for i, row in enumerate(table)]
    if not tasks:
        raise DatasetError(f"dataset: {path}: the dataset holds no rows")
    dup = next((i for i, n in Counter(t.task_id for t in tasks).items() if n > 1), None)
    if dup is not None:
        raise DatasetError(f"columns.task_id: {dup!r} names more than one row; task ids must be unique")
    return tasks


def _load(path: Path, split: str):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # nothing is downloaded: a path is a path
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    if not path.exists():
        raise DatasetError(f"dataset: {path}: no such file or directory")
    try:
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            loaded = datasets.load_from_disk(str(path))
        elif path.is_file():
            builder = _BUILDERS.get(path.suffix)
            if builder is None:
                raise DatasetError(f"dataset: {path}: expected a save_to_disk directory or a "
                                   f"{'/'.join(sorted(_BUILDERS))} file")
            loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
        else:
            loaded = datasets.load_dataset(str(path))
    except DatasetError:
        raise
    except Exception as e:  # the library's many kinds, each one line here
        raise DatasetError(f"dataset: {path}: not a readable dataset ({type(e).__name__}: {_first_line(e)})") from None
    if isinstance(loaded, Mapping):  # a DatasetDict
        if split not in loaded:
            raise DatasetError(f"split: no split {split!r} in {path} (its splits: {', '.join(sorted(loaded))})")
        loaded = loaded[split]
    return loaded


def _task(row: Mapping[str, Any], index: int, columns: Columns, family: str) -> Task:
    prompt = row[columns.prompt]
    if not isinstance(prompt, str):
        raise DatasetError(f"columns.prompt: row {index}: expected text, got {type(prompt).__name__}")
    answer = "" if columns.answer is None else row[columns.answer]
    task_id = f"{family}-{index}" if columns.task_id is None else str(row[columns.task_id])
    return Task(task_id, family, prompt, "" if answer is None else str(answer),
                _calls(row, index, columns.calls), _tests(row, index, columns.tests))


def _calls(row: Mapping[str, Any], index: int, column: str | None) -> tuple[ToolCall, ...]:
    if column is None or row[column] is None:
        return ()
    value = row[column]
    try:
        records = json.loads(value) if isinstance(value, str) else value
        return tuple(ToolCall(c["name"], dict(c.get("arguments") or {})) for c in records)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise DatasetError(f"columns.calls: row {index}: expected a list of {{name, arguments}} "
                           f"(or its JSON), got {_first_line(e) or type(value).__name__}") from None


def _tests(row: Mapping[str, Any], index: int, column: str | None) -> tuple[str, ...]:
    if column is None or row[column] is None:
        return ()
    value = row[column]
    if isinstance(value, str) or not all(isinstance(t, str) for t in value):
        raise DatasetError(f"columns.tests: row {index}: expected a list of Python snippets")
    return tuple(value)


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""
