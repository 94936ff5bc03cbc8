"""Ctrl-C as a terminal sends it, to the whole process group, at each stage of a run, with the
Dask workers in this process and in processes of their own: exit 2, one error line, no
traceback from any process (the Nannies' workers included), and no process of the run left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prorsa.live.interrupt import HARD_STOP_S

from runs import finish, output, start, wait_for, write_pipeline

HANG_S = HARD_STOP_S + 50.0  # a guard against a hang, not a speed bound


def _alive_in_group(pgid: int) -> list[str]:
    """The group's processes that still run (a zombie has ended; reaping it is its parent's)."""
    ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True)
    return [line for line in ps.stdout.splitlines() if line.split()[1][0] != "Z"]


def _interrupt(tmp_path, stage: str, processes: bool) -> tuple[subprocess.Popen, str]:
    runtime = ", processes: true" if processes else ""
    pipeline = write_pipeline(tmp_path / "p.yaml", time_scale=2.0, runtime=runtime)
    out = tmp_path / "runs"
    proc = start("run", str(pipeline), f"output_dir={out}")
    try:
        if stage == "imports":  # the command is loading; no run folder yet
            time.sleep(0.5)
        elif stage == "start":  # the folder is made; the cluster (and its worker processes) starting
            wait_for(lambda: next(out.glob("rel-*"), None), 120, proc, every=0.01)
        else:  # mid-rollout: a first trajectory is saved (output_batch: 1), others are running
            wait_for(lambda: any(out.glob("rel-*/manifest.json")), 180, proc, every=0.01)
        assert proc.poll() is None, output(proc)
        os.killpg(proc.pid, signal.SIGINT)
        text = finish(proc, timeout=HANG_S)
        left = wait_for(lambda: not _alive_in_group(proc.pid) or None, 30, every=0.2) and []
    finally:
        if proc.poll() is None or _alive_in_group(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert left == []
    return proc, text


@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "processes"])
@pytest.mark.parametrize("stage", ["imports", "start", "mid"])
def test_ctrl_c_to_the_group_ends_a_run_quietly_at_every_stage(tmp_path, stage, processes):
    proc, text = _interrupt(tmp_path, stage, processes)
    assert proc.returncode == 2, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text
    assert "distributed.worker - INFO" not in text  # the workers log what the driver does
    if stage == "mid":
        assert errors[0].startswith("error: interrupted; finished trajectories kept in "), errors
    else:
        assert errors[0].startswith("error: interrupted"), errors


@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "processes"])
def test_ctrl_c_during_the_write_out_finishes_it_and_exits_2(tmp_path, processes):
    # the write-out runs after the cluster closed: the signal reaches the driver alone, as it sends
    # it itself at the write-out's first call (killed_in_write_out.py)
    # tools at a fifth of the trace's 0.25 s: the run only has to reach its write-out
    pipeline = write_pipeline(tmp_path / "p.yaml", time_scale=0.05, tool_scale=0.2,
                              runtime=", processes: true" if processes else "")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "killed_in_write_out.py"), "1", "run",
                           str(pipeline), "--output", str(out)], capture_output=True, text=True, timeout=300,
                          env=os.environ | {"WRITE_OUT_SIGNAL": "SIGINT"})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert [line for line in text.splitlines() if line.startswith("error: ")] == [
        f"error: interrupted as the run ended; it is complete in {out}"], text
    assert json.loads((out / "manifest.json").read_text())["complete"]
    assert (out / "summary.json").exists() and (out / "metrics.nc").exists()
