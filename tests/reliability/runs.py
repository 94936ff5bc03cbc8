"""Helpers for the reliability tests: a small time-scaled pipeline, `prorsa run` as a real
process, and what a run directory must hold when every trajectory is there exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from prorsa.agent.workload import Workload
from prorsa.config.load import load_pipeline

PIPELINE = """\
name: {name}
seed: 5
policy: static:2:1
engines: {{backend: emulated, count: 3, slots: 8, time_scale: {time_scale}}}
workload: {{trace: trace.jsonl, mode: {mode}, prompts: 4, group_size: 2, steps: 2,
           concurrency: 4, trajectories: 16, tool_time_scale: {tool_scale}}}
runtime: {{metrics_interval_s: 0.2, dashboard_address: null, output_batch: 1{runtime}}}
"""


# three vLLM CPU engines of the tiny model, 1 prefill : 2 decode, started with a loaded CI machine's patience
VLLM_ENGINES = """\
policy: static:2:1
engines:
  backend: vllm
  count: 3
  slots: 16
  gpu: cpu
  model: tiny
  vllm: {dtype: float32, device: cpu, max_model_len: 2048, cores_per_engine: 1, start_timeout_s: 900}
"""


def write_trace(path: Path, trajectories: int = 16, tool_s: float = 0.25) -> None:
    """Trajectories of 1-4 turns with fixed tool latencies: they finish at different, known times
    (a family's heavy-tailed tools would make a test's duration a draw)."""
    lines = []
    for i in range(trajectories):
        n = 1 + i % 4
        for k in range(n):
            lines.append(json.dumps({"traj": f"t{i}", "turn": k, "appended_tokens": 300 if k == 0 else 60,
                                     "decode_tokens": 20 + 5 * k, "tool_latency_s": 0.0 if k == n - 1 else tool_s,
                                     "done": k == n - 1}))
    path.write_text("\n".join(lines) + "\n")


def write_pipeline(path: Path, name="rel", mode="sync", time_scale=0.05, tool_scale=1.0, runtime="",
                   extra="", tool_s: float = 0.25) -> Path:
    """A pipeline replaying a trace beside it (16 trajectories, sync 2 x 4 x 2 or async)."""
    write_trace(path.parent / "trace.jsonl", tool_s=tool_s)
    path.write_text(PIPELINE.format(name=name, mode=mode, time_scale=time_scale, tool_scale=tool_scale,
                                    runtime=runtime) + extra)
    return path


def expected_specs(pipeline: Path) -> dict:
    """traj_id -> TrajectorySpec: what a run of the pipeline must roll out, drawn from its seed."""
    cfg = load_pipeline(pipeline)
    w = Workload.from_config(cfg.workload, cfg.seed)
    if cfg.workload.mode == "sync":
        specs = [s for step in range(cfg.workload.steps) for s in w.trajectories_for_step(step)]
    else:
        specs = [w.trajectory(i) for i in range(cfg.workload.trajectories)]
    return {s.traj_id: s for s in specs}


def prorsa(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", *args], capture_output=True, text=True,
                          timeout=timeout)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`prorsa ...` in its own process group, so a kill reaches every process it started. Its output
    goes to a file, not a pipe: a pipe nobody reads while the test waits fills with the workers'
    logs (64 KiB) and then blocks the run at its next log line."""
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=os.environ | (env or {}))
    proc.log = log
    return proc


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for a started run to end; its output."""
    proc.wait(timeout=timeout)
    return output(proc)


def output(proc: subprocess.Popen) -> str:
    """A started process's output so far; only once it has ended (the file's offset is shared)."""
    proc.log.seek(0)
    return proc.log.read()


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process ended early ({proc.returncode}): {output(proc)}")
        time.sleep(every)
    raise AssertionError(f"not reached within {timeout} s")


def assert_exactly_once(run_dir: Path, specs: dict) -> list[dict]:
    """Every expected trajectory exactly once, completed, each turn as its spec says."""
    rows = pq.read_table(run_dir / "trajectories.parquet").to_pylist()
    ids = [r["traj_id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicated: {sorted(i for i in set(ids) if ids.count(i) > 1)}"
    assert set(ids) == set(specs), f"missing {sorted(set(specs) - set(ids))}, extra {sorted(set(ids) - set(specs))}"
    for r in rows:
        spec = specs[r["traj_id"]]
        assert r["status"] == "completed", (r["traj_id"], r["error"])
        assert [t["decode_tokens"] for t in r["turns"]] == [t.decode_tokens for t in spec.turns], r["traj_id"]
        assert [t["turn"] for t in r["turns"]] == list(range(len(spec.turns)))
    return rows
