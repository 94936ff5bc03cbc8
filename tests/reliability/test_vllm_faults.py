"""Real vLLM engines killed mid-rollout, two ways, in one run: the API server process (its worker
restarts it) and the Dask worker process hosting the engine (its Nanny starts a new worker, which
starts a new server; the orphaned server stops itself). Either way the turns they held are re-run
from their token history and the run ends with every trajectory exactly once."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from runs import VLLM_ENGINES, assert_exactly_once, expected_specs, finish, kill_group, start, wait_for

# slow, and skipped without vLLM (tests/conftest.py); an engine restarted on a loaded machine takes minutes
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

PIPELINE = "name: kill\nseed: 4\n" + VLLM_ENGINES.replace("{", "{{").replace("}", "}}") + """\
workload: {{family: swe, mode: sync, prompts: 4, group_size: 4, steps: 3, max_turns: 3,
           token_scale: 0.1, max_context: 1536, tool_time_scale: 0.2}}
runtime: {{tool_workers: 1, metrics_interval_s: 0.5, dashboard_address: null, output_batch: 1,
          turn_retries: 3, processes: true}}
"""
_PID = re.compile(r"^# prorsa: server pid (\d+)$", re.M)


def _server_pids(run_dir: Path, engine: str) -> list[int]:
    try:
        return [int(p) for p in _PID.findall((run_dir / "engines" / f"{engine}.log").read_text(errors="replace"))]
    except OSError:
        return []


def _launches(run_dir: Path, engine: str) -> str:
    """The engine log's own lines and its errors, for a failure message."""
    try:
        text = (run_dir / "engines" / f"{engine}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(line for line in text.splitlines() if "# prorsa:" in line or "rror" in line)[-4000:]


def _all_stopped(pids: list[int], within_s: float = 30.0) -> bool:
    """No process group of these servers is left once the run has ended (an orphaned server
    notices its owner is gone within a second and stops itself after a grace period)."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for pid in pids:
            try:
                os.killpg(pid, 0)
                left.append(pid)
            except ProcessLookupError:
                pass
        if not left or time.monotonic() > deadline:
            return not left
        time.sleep(1.0)


def _worker_pid(run_dir: Path, engine: str) -> int | None:
    try:
        return int((run_dir / "engines" / f"{engine}.pid").read_text())
    except (OSError, ValueError):
        return None


def _committed(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "manifest.json").read_text())["trajectories"]
    except (OSError, ValueError, KeyError):
        return 0


def _why_failed(run_dir: Path) -> str:
    """The errors the failed trajectories recorded (the output's tail may not reach them)."""
    try:
        rows = pq.read_table(run_dir / "trajectories.parquet", columns=["traj_id", "status", "error"]).to_pylist()
    except (OSError, ValueError, KeyError):
        return ""
    return "".join(f"{r['traj_id']}: {r['error']}\n" for r in rows if r["status"] != "completed")


def _run_and_kill(tmp_path: Path, *victims) -> tuple[Path, dict, list[int]]:
    """`prorsa run` on 3 engines; SIGKILL victim(run_dir) for each victim in turn, the first once 4
    trajectories are committed, each next once 4 more are (so the run has moved on past a restart)."""
    pipeline = tmp_path / "kill.yaml"
    pipeline.write_text(PIPELINE.format())
    specs = expected_specs(pipeline)
    out = tmp_path / "runs"
    proc = start("run", str(pipeline), f"output_dir={out}")
    killed: list[int] = []
    try:
        run_dir = wait_for(lambda: next(iter(out.glob("kill-*")), None), 120, proc)
        after = 4
        for victim in victims:
            wait_for(lambda: _committed(run_dir) >= after, 900, proc, every=0.5)
            killed.append(victim(run_dir))
            os.kill(killed[-1], signal.SIGKILL)
            after = _committed(run_dir) + 4
        output = finish(proc, 1200)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    lines = output.splitlines()
    noise = [i for i, line in enumerate(lines) if "error:" in line or "Traceback" in line]
    # each traceback with what follows it, so a failure says where it came from
    shown = "\n---\n".join("\n".join(lines[i:i + 40]) for i in noise[:3])
    assert proc.returncode == 0 and not noise, _why_failed(run_dir) + (shown[-8000:] or output[-4000:])
    assert_exactly_once(run_dir, specs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == len(specs) and summary["trajectories_failed"] == 0
    return run_dir, summary, killed


def test_killing_vllm_servers_and_engine_worker_processes_mid_rollout_loses_no_trajectory(tmp_path):
    # one run, three kills, each once the run has moved on past the restart before it (a kill
    # costs a restart of minutes; a run each would cost minutes more): the one decode engine's API
    # server (its worker restarts it), then that engine's worker process (its Nanny starts a new
    # worker, which starts a new server), then a prefill engine's worker
    victims = (("server", "engine-2"), ("worker", "engine-2"), ("worker", "engine-0"))
    before: list[list[int]] = []  # each victim's servers as it was killed

    def kill(how, engine):
        def pid(run_dir):
            before.append(_server_pids(run_dir, engine))
            if how == "server":  # its engine core and workers are orphaned
                return before[-1][-1]
            return _worker_pid(run_dir, engine)
        return pid

    run_dir, summary, killed = _run_and_kill(tmp_path, *(kill(*v) for v in victims))
    for (how, engine), pid, earlier in zip(victims, killed, before):
        pids = _server_pids(run_dir, engine)
        if how == "worker":
            assert _worker_pid(run_dir, engine) not in (None, pid)  # a new worker process hosts the engine
        # a new server after the kill (a launch that lost a port race or a restart by the health
        # watch on a loaded machine may come between); the killed or orphaned one is not reused
        assert len(pids) > len(earlier) and pids[:len(earlier)] == earlier, _launches(run_dir, engine)
        assert not set(earlier) & set(pids[len(earlier):]), _launches(run_dir, engine)
    for engine in {e for _, e in victims}:  # nothing of any server outlives the run
        assert _all_stopped(_server_pids(run_dir, engine)), _launches(run_dir, engine)
    print(f"{', '.join(' '.join(v) for v in victims)} killed: {summary['turns_retried']} turns retried, "
          f"{summary['legs_rescued']} legs re-bound, makespan {summary['makespan_s']:.1f} s")
