"""Faults on real components (LocalCluster, emulated engines): the run finishes with every
trajectory exactly once, or the fault is recorded where the trajectory says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from runs import assert_exactly_once, expected_specs, finish, kill_group, start, wait_for, write_pipeline

NAPPING_TOOL = '''
import time


def nap() -> str:
    """A call that takes a moment, so a kill finds some in flight."""
    time.sleep(0.2)
    return "rested"
'''

HANGING_TOOLS = '''
import asyncio
import time


def hang() -> str:
    """Never returns in time: a sync tool stuck in a system call."""
    time.sleep(3600)
    return "late"


async def hang_async() -> str:
    """Never returns in time: an async tool awaiting forever."""
    await asyncio.sleep(3600)
    return "late"
'''


def test_a_tool_that_hangs_past_its_timeout_becomes_a_timeout_observation(tmp_path):
    (tmp_path / "hangtool.py").write_text(HANGING_TOOLS)
    calls = [{"name": "hang", "arguments": {}}, {"name": "hang_async", "arguments": {}}]
    (tmp_path / "tasks.jsonl").write_text("".join(
        json.dumps({"task_id": f"h{i}", "family": "hang", "prompt": "wait", "answer": "never", "calls": calls}) + "\n"
        for i in range(4)))
    pipeline = write_pipeline(tmp_path / "p.yaml", extra=(
        "environment: {dataset: tasks.jsonl, tools: ['hangtool:hang', 'hangtool:hang_async'], "
        "tool_timeout_s: 0.3}\n"))
    specs = expected_specs(pipeline)
    out = tmp_path / "runs"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), f"output_dir={out}"],
                          capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHONPATH": str(tmp_path)})
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = out.iterdir()
    rows = assert_exactly_once(run_dir, specs)
    tool_turns = [t for r in rows for t in r["turns"][:-1]]
    assert len(tool_turns) == sum(len(s.turns) - 1 for s in specs.values()) > 0
    assert {t["tool_status"] for t in tool_turns} == {"timeout"}
    assert {t["tool_name"] for t in tool_turns} == {"hang", "hang_async"}
    # each call gave up at its 0.3 s timeout, not at the tool's hour (which the run's own timeout
    # above would not have waited for); the observation names the limit that ended it
    said = {t["observation"] for t in tool_turns}
    assert said == {f"Error: {name} timed out after 0.3 s" for name in ("hang", "hang_async")}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tool_calls"] == {"timeout": len(tool_turns)}
    print(f"run with {len(tool_turns)} hung tool calls took {took:.1f} s")


def _pid(run_dir, worker: str) -> int | None:
    try:
        return int((run_dir / ("tools" if worker.startswith("tools") else "engines") / f"{worker}.pid").read_text())
    except (OSError, ValueError):
        return None


def _committed(run_dir) -> int:
    try:
        return json.loads((run_dir / "manifest.json").read_text())["trajectories"]
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.slow  # worker processes start and stop: ~40 s
@pytest.mark.parametrize("engine", ["engine-0", "engine-2"])  # a prefill engine; the one decode engine
def test_killing_an_engine_worker_process_mid_rollout_loses_no_trajectory(tmp_path, engine):
    pipeline = write_pipeline(tmp_path / "p.yaml", runtime=", processes: true, turn_retries: 3")
    specs = expected_specs(pipeline)
    out = tmp_path / "runs"
    proc = start("run", str(pipeline), f"output_dir={out}")
    try:
        run_dir = wait_for(lambda: next(iter(out.glob("rel-*")), None), 60, proc)
        pid = wait_for(lambda: _pid(run_dir, engine), 60, proc)
        wait_for(lambda: _committed(run_dir) >= 2, 60, proc)
        os.kill(pid, signal.SIGKILL)
        output = finish(proc, 180)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    # (the worker processes' own logs may show the dropped connection's traceback; the run's are clean)
    assert proc.returncode == 0 and "error:" not in output, output
    assert _committed(run_dir) > 2 and _pid(run_dir, engine) != pid  # killed mid-run, and restarted
    assert_exactly_once(run_dir, specs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == len(specs) and summary["trajectories_failed"] == 0
    assert summary["legs_rescued"] >= 0
    print(f"{engine} killed: {summary['turns_retried']} turns retried, {summary['legs_rescued']} legs re-bound, "
          f"makespan {summary['makespan_s']:.1f} s")


@pytest.mark.slow  # worker processes start and stop: ~40 s
def test_killing_a_tool_worker_process_mid_rollout_loses_no_trajectory(tmp_path):
    (tmp_path / "naptool.py").write_text(NAPPING_TOOL)
    calls = [{"name": "nap", "arguments": {}}]
    (tmp_path / "tasks.jsonl").write_text("".join(
        json.dumps({"task_id": f"n{i}", "family": "nap", "prompt": "rest", "answer": "rested", "calls": calls}) + "\n"
        for i in range(4)))
    pipeline = write_pipeline(tmp_path / "p.yaml", runtime=", processes: true, turn_retries: 3, tool_workers: 1",
                              extra="environment: {dataset: tasks.jsonl, tools: ['naptool:nap']}\n")
    specs = expected_specs(pipeline)
    out = tmp_path / "runs"
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    proc = start("run", str(pipeline), f"output_dir={out}", env={"PYTHONPATH": path})
    try:
        run_dir = wait_for(lambda: next(iter(out.glob("rel-*")), None), 60, proc)
        pid = wait_for(lambda: _pid(run_dir, "tools-0"), 60, proc)
        wait_for(lambda: _committed(run_dir) >= 2, 60, proc)
        os.kill(pid, signal.SIGKILL)  # the only tool worker: every tool call waits for its restart
        output = finish(proc, 180)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    assert proc.returncode == 0 and "error:" not in output, output
    assert _committed(run_dir) > 2 and _pid(run_dir, "tools-0") not in (None, pid)  # killed mid-run, restarted
    rows = assert_exactly_once(run_dir, specs)
    assert {t["tool_status"] for r in rows for t in r["turns"][:-1]} == {"ok"}  # a lost call ran again
