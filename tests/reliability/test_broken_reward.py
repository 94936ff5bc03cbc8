"""A reward that raises on every trajectory is an error the run says, not NaNs it keeps quiet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_reward_that_always_raises_ends_the_run_non_zero_with_its_error(tmp_path):
    (tmp_path / "my_rewards.py").write_text("def broken(task, response):\n    raise RuntimeError('reward bug')\n")
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "prorsa.cli", "run", "pipelines/math-tir-tools.yaml", "environment.reward=my_rewards:broken",
         "runtime.dashboard_address=null", f"output_dir={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "error: the reward raised on 8 trajectories (every one)" in text and "RuntimeError: reward bug" in text
    assert "Traceback" not in text
    summary = json.loads(next(out.glob("math-tir-tools-*/summary.json")).read_text())
    assert summary["reward_errors"] == 8 and summary["reward_mean"] is None
    assert summary["trajectories_completed"] == 8  # the rollout itself is kept


def test_a_tool_that_fails_on_every_call_is_said_on_the_console_and_counted(tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "prorsa.cli", "run", "pipelines/math-tir-tools.yaml", "environment.tools=[python]",
         "environment.sandbox.wall_s=0.001", "runtime.dashboard_address=null", f"output_dir={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text  # the rollout went on, each error the model's observation
    summary = json.loads(next(out.glob("math-tir-tools-*/summary.json")).read_text())
    calls = summary["tool_calls"]
    assert calls and "ok" not in calls, calls
    said = ", ".join(f"{status} {n}" for status, n in calls.items())
    assert f"warning: every tool call failed ({said})" in text, text
