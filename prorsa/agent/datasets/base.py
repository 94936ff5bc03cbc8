"""The task record every dataset yields, the dataset registry, and JSONL files of tasks.

    Task(task_id, family, prompt, answer, calls, tests, meta)   one problem (frozen)
    Task.to_dict() / Task.from_dict(d)                          the JSONL form, exact round trip
    DATASETS, @register("name"), make_dataset(name, n, seed)    n tasks, the same for the same seed
    write_jsonl(tasks, path) / read_jsonl(path)

`calls` is a reference solution as tool calls: replay mode runs them for real, so its tool
latency and observation lengths are real. Generators use their own random.Random(seed): no
global state, no downloads.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prorsa.agent.tools.base import ToolCall


@dataclass(frozen=True)
class Task:
    task_id: str  # unique within a dataset, stable for a seed: "<family>-<seed>-<index>"
    family: str  # the dataset's name: math-tir | search | swe-lite
    prompt: str  # what the model is asked
    answer: str  # the reference answer (swe-lite: the fixed source)
    calls: tuple[ToolCall, ...] = ()  # a reference solution, as tool calls in order
    tests: tuple[str, ...] = ()  # Python snippets that must run without error (swe-lite)
    meta: Mapping[str, Any] = field(default_factory=dict)  # family-specific, JSON-like values

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "family": self.family, "prompt": self.prompt,
                "answer": self.answer, "calls": [c.to_dict() for c in self.calls],
                "tests": list(self.tests), "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Task:
        calls = tuple(ToolCall(c["name"], c.get("arguments", {}), c.get("call_id", "")) for c in d.get("calls", ()))
        return cls(d["task_id"], d["family"], d["prompt"], d["answer"], calls,
                   tuple(d.get("tests", ())), d.get("meta", {}))


DATASETS: dict[str, Callable[[int, int], list[Task]]] = {}
_BUILTINS = ("prorsa.agent.datasets.math_tir", "prorsa.agent.datasets.search",
             "prorsa.agent.datasets.swe_lite", "prorsa.agent.datasets.arith")


def register(name: str) -> Callable[[Callable[[int, int], list[Task]]], Callable[[int, int], list[Task]]]:
    def add(make: Callable[[int, int], list[Task]]) -> Callable[[int, int], list[Task]]:
        DATASETS[name] = make
        return make

    return add


def make_dataset(name: str, n: int, seed: int = 0) -> list[Task]:
    for module in _BUILTINS:  # cached after the first call
        importlib.import_module(module)
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}: expected one of {sorted(DATASETS)}")
    if n < 0:
        raise ValueError(f"dataset size must be >= 0, got {n}")
    return DATASETS[name](n, seed)


def write_jsonl(tasks: Iterable[Task], path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task.to_dict(), sort_keys=True) + "\n")
    tmp.replace(path)


def read_jsonl(path: str | Path) -> list[Task]:
    with Path(path).open(encoding="utf-8") as f:
        return [Task.from_dict(json.loads(line)) for line in f if line.strip()]
