"""A vLLM server process killed mid-rollout: its worker restarts it, the turns it held are re-run
elsewhere from their token history, and the run ends with every trajectory exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from runs import assert_exactly_once, expected_specs, kill_group, start, wait_for

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
VICTIM = "engine-2"  # the one decode engine: every trajectory's decodes run there

PIPELINE = """\
name: kill
seed: 4
policy: static:2:1
engines:
  backend: vllm
  count: 3
  slots: 16
  gpu: cpu
  model: tiny
  vllm: {dtype: float32, device: cpu, max_model_len: 2048, cores_per_engine: 1}
workload: {family: swe, mode: sync, prompts: 4, group_size: 4, steps: 3, max_turns: 3,
           token_scale: 0.1, max_context: 1536, tool_time_scale: 0.2}
runtime: {tool_workers: 1, metrics_interval_s: 0.5, dashboard_address: null, output_batch: 1,
          turn_retries: 3}
"""
_PID = re.compile(r"^# prorsa: server pid (\d+)$", re.M)


def _server_pids(run_dir: Path) -> list[int]:
    try:
        return [int(p) for p in _PID.findall((run_dir / "engines" / f"{VICTIM}.log").read_text(errors="replace"))]
    except OSError:
        return []


def _committed(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "manifest.json").read_text())["trajectories"]
    except (OSError, ValueError, KeyError):
        return 0


def test_killing_a_vllm_server_mid_rollout_loses_no_trajectory(tmp_path):
    pipeline = tmp_path / "kill.yaml"
    pipeline.write_text(PIPELINE)
    specs = expected_specs(pipeline)
    out = tmp_path / "runs"
    proc = start("run", str(pipeline), "--output", str(out))
    try:
        run_dir = wait_for(lambda: next(iter(out.glob("kill-*")), None), 120, proc)
        wait_for(lambda: _committed(run_dir) >= 4, 900, proc, every=0.5)
        (pid,) = _server_pids(run_dir)
        os.kill(pid, signal.SIGKILL)  # the API server; its engine core and workers are orphaned
        output, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    noise = [line for line in output.splitlines() if "error:" in line or "Traceback" in line]
    assert proc.returncode == 0 and not noise, "\n".join(noise)[-4000:] or output[-4000:]
    pids = _server_pids(run_dir)
    assert len(pids) == 2 and pids[0] == pid != pids[1], pids  # killed once, restarted once
    with pytest.raises(ProcessLookupError):  # nothing of the killed server is left running
        os.killpg(pid, 0)
    assert_exactly_once(run_dir, specs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == len(specs) and summary["trajectories_failed"] == 0
    print(f"{VICTIM}'s server killed after 4 trajectories: {summary['turns_retried']} turns retried, "
          f"makespan {summary['makespan_s']:.1f} s")
