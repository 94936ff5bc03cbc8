"""Faults on real components (LocalCluster, emulated engines): the run finishes with every
trajectory exactly once, or the fault is recorded where the trajectory says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq

from runs import assert_exactly_once, expected_specs, write_pipeline

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
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), "--output", str(out)],
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
    # each call gave up at its timeout (plus the caller's grace), not at the tool's hour
    assert max(t["tool_s"] for t in tool_turns) < 3.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["tool_calls"] == {"timeout": len(tool_turns)}
    print(f"run with {len(tool_turns)} hung tool calls took {took:.1f} s")
