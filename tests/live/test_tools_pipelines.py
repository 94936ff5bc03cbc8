"""The shipped tool pipelines run end to end on the LocalCluster with real tool calls.

Each trajectory's tool calls are the dataset task's reference calls, run on the tool worker: the
parquet must show every trajectory once, a real status and latency for every call, observation
lengths as the next turn's append, and a reward."""

import asyncio
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from prorsa.agent.datasets import Task, write_jsonl
from prorsa.agent.tools import ToolCall
from prorsa.config.load import load_pipeline
from prorsa.live.run import run_live
from prorsa.rollout.context import resolve
from prorsa.sim.run import lend
from prorsa.rollout.drivers import expected_trajectories

REPO = Path(__file__).resolve().parents[2]
STATUSES = {"ok", "error", "timeout", "crash", "truncated"}


def run(path: Path, out: Path, overrides: dict | None = None) -> tuple[dict, list[dict]]:
    cfg = load_pipeline(path, {"runtime.dashboard_address": None, **(overrides or {})})
    summary = asyncio.run(run_live(resolve(cfg), out, Console(quiet=True), lend=lend))
    rows = pq.read_table(out / "trajectories.parquet").to_pylist()
    expected = expected_trajectories(cfg.workload)
    assert summary["trajectories_completed"] == expected and summary["trajectories_failed"] == 0
    assert len(rows) == expected and len({r["traj_id"] for r in rows}) == expected
    for r in rows:
        assert r["status"] == "completed" and [t["turn"] for t in r["turns"]] == list(range(len(r["turns"])))
        *called, last = r["turns"]
        for t, nxt in zip(called, r["turns"][1:]):
            assert t["tool_status"] in STATUSES and t["tool_name"]
            assert t["tool_s"] > 0 and t["observation"]
            assert nxt["prefill_tokens"] == t["observation_tokens"] > 0  # the observation is the append
        assert last["tool_name"] == "" and last["observation_tokens"] is None  # no call after the answer
        assert r["task_id"] and not math.isnan(r["reward"]) and r["reward_error"] == ""
    return summary, rows


@pytest.mark.parametrize("name,tool", [("math-tir", "python"), ("search", "search"), ("swe-lite", "python")])
def test_tool_pipeline_runs_real_calls(tmp_path, name, tool):
    summary, rows = run(REPO / "pipelines" / f"{name}-tools.yaml", tmp_path)
    calls = [t for r in rows for t in r["turns"] if t["tool_name"]]
    assert calls and {t["tool_name"] for t in calls} == {tool}
    assert summary["tool_calls"] == {"ok": len(calls)}  # the reference solutions all run cleanly
    # a trajectory that made a call replayed a correct solution: full reward
    assert all(r["reward"] == 1.0 for r in rows if len(r["turns"]) > 1 and name != "search")
    assert summary["reward_mean"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows), abs=1e-4)
    if name == "swe-lite":  # the observation is the tests' report
        assert all(t["observation"].startswith("PASS 0") for t in calls)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written.pop("units")["tool_calls"] == "calls, by status" and written == summary  # the file adds the units


def test_failing_calls_become_statuses_not_failures(tmp_path):
    """Calls that crash, hang, fail or flood end as observations with their status; the
    trajectory goes on and is scored."""
    programs = {
        "ok": "print(6 * 7)",
        "error": "raise SystemExit(3)",
        "crash": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        "timeout": "while True:\n    pass",
        "truncated": "print('x' * 5000)",
    }
    tasks = [Task(f"t-{i}", "custom", "What is 6 x 7?", "42",
                  tuple(ToolCall("python", {"code": code}) for code in programs.values()))
             for i in range(2)]
    write_jsonl(tasks, tmp_path / "tasks.jsonl")
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        (REPO / "pipelines" / "math-tir-tools.yaml").read_text()
        .replace("dataset: math-tir", f"dataset: {tmp_path / 'tasks.jsonl'}")
        .replace("tools: [python, calculator]", "tools: [python]")
        .replace("sandbox: {wall_s: 5, cpu_s: 5}", "sandbox: {wall_s: 3, cpu_s: 5}")
        .replace("max_observation_tokens: 256", "max_observation_tokens: 64"))
    out = tmp_path / "run"
    out.mkdir()
    summary, rows = run(pipeline, out, {"workload.max_turns": 6, "workload.group_size": 1,
                                        "workload.family": "swe", "engines.time_scale": 0.01})
    seen = {t["tool_status"]: t for r in rows for t in r["turns"] if t["tool_name"]}
    long = [r for r in rows if len(r["turns"]) == 6]
    assert long, "the turn draws give no trajectory of 6 turns; pick another seed"
    # turn k ran program k: each status shows up where the task put it
    for r in long:
        assert [t["tool_status"] for t in r["turns"][:5]] == list(programs)
    assert "[killed by SIGKILL]" in seen["crash"]["observation"]
    assert "timed out" in seen["timeout"]["observation"] and seen["timeout"]["tool_s"] >= 1.0
    assert seen["truncated"]["observation_tokens"] <= 64 + 30  # budget, cut marker, template
    assert set(summary["tool_calls"]) == set(programs)
    # the last call's output was the flood, not 42: exact match says 0
    assert all(r["reward"] == 0.0 for r in long)
