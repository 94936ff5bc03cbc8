"""`prorsa sweep --cluster slurm.yaml`: simulations on batch jobs (run here by the fake batch system),
a job lost mid-sweep costs no point, an interrupted sweep cancels its jobs, and a rerun computes
only the points the first one did not finish, into one Dataset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

BASE = {
    "name": "tiny", "seed": 0, "policy": "colocated",
    "engines": {"backend": "emulated", "count": 3, "slots": 8, "gpu": "h200", "model": "qwen3-8b"},
    "workload": {"family": "search", "mode": "sync", "prompts": 6, "group_size": 2, "max_turns": 2},
}
SEEDS = 30  # enough points that a sweep interrupted after its third cannot have finished on a slow host
SWEEP = {"base": "tiny.yaml", "axes": {"policy": ["colocated", "prorsa"], "seed": list(range(SEEDS))}}
POINTS = 2 * SEEDS


def files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(BASE))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(SWEEP))
    spec = tmp_path / "slurm.yaml"
    spec.write_text(yaml.safe_dump({"kind": "slurm", "scheduler": {"host": "127.0.0.1"}, "start_timeout_s": 120,
                                    "sweep": {"jobs": 2, "cpus": 1, "memory": "1GiB"}}))
    return sweep, spec


def start(sweep: Path, spec: Path, out: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "prorsa.cli", "sweep", str(sweep), "--cluster", str(spec),
                             "--output", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_points(out: Path, n: int, proc: subprocess.Popen, timeout: float = 180) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        done = len(list((out / "points").glob("*.json")))
        if done >= n:
            return done
        time.sleep(0.05)
    raise AssertionError(f"{n} points not written; sweep ended with {proc.poll()}")


def complete(out: Path) -> bool:
    ds = xr.load_dataset(out / "sweep.nc")
    return ds.sizes["seed"] == SEEDS and bool(np.isfinite(ds.makespan_s).all())


@pytest.mark.slow
def test_a_job_lost_mid_sweep_costs_no_point(tmp_path, fake_batch):
    sweep, spec = files(tmp_path)
    out = tmp_path / "out"
    proc = start(sweep, spec, out, fake_batch.env())
    try:
        wait_for_points(out, 2, proc)
        jobs = fake_batch.jobs()
        assert len(jobs) == 2 and all(fake_batch.alive(j) for j in jobs)
        # the node dies: the job's processes go without a word to the scheduler
        os.killpg(int((fake_batch.state / f"{jobs[0]}.pid").read_text()), signal.SIGKILL)
        assert len(list((out / "points").glob("*.json"))) < POINTS, "the sweep finished before the job was lost"
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert f"{POINTS} simulated, 0 already done, 0 failed" in stdout
    assert complete(out)
    assert not any(fake_batch.alive(j) for j in jobs) and fake_batch.cancelled(jobs[1])


def interrupted(sweep: Path, spec: Path, out: Path, env: dict, after: int) -> tuple[subprocess.Popen, str, str]:
    proc = start(sweep, spec, out, env)
    try:
        wait_for_points(out, after, proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc, stdout, stderr


@pytest.mark.slow
def test_an_interrupted_sweep_cancels_its_jobs_and_a_rerun_finishes_it(tmp_path, fake_batch):
    sweep, spec = files(tmp_path)
    # A loaded host can keep this test from looking while the sweep writes a burst of finished
    # points, and the sweep may be done before the signal lands: then it must have finished whole
    # (exit 0, every point), and the interrupt is tried again on a fresh sweep.
    for attempt in range(3):
        out = tmp_path / f"out{attempt}"
        proc, stdout, stderr = interrupted(sweep, spec, out, fake_batch.env(), 3)
        if proc.returncode != 0:
            break
        assert f"{POINTS} simulated, 0 already done, 0 failed" in stdout and complete(out), stdout + stderr
    assert proc.returncode == 2 and stderr.startswith("error: interrupted; finished points are kept"), stderr
    assert "Traceback" not in stderr
    first_jobs = fake_batch.jobs()
    assert not any(fake_batch.alive(j) for j in first_jobs) and all(fake_batch.cancelled(j) for j in first_jobs)
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "points").glob("*.json")}
    assert 3 <= len(kept) < POINTS

    rerun = start(sweep, spec, out, fake_batch.env())
    stdout, stderr = rerun.communicate(timeout=240)
    assert rerun.returncode == 0, stdout + stderr
    assert f"{POINTS - len(kept)} simulated, {len(kept)} already done, 0 failed" in stdout
    assert all((out / "points" / name).stat().st_mtime_ns == t for name, t in kept.items())  # not redone
    assert complete(out)
    second_jobs = [j for j in fake_batch.jobs() if j not in first_jobs]
    assert len(second_jobs) == 2 and all(fake_batch.cancelled(j) and not fake_batch.alive(j) for j in second_jobs)


def test_a_refused_sweep_submission_is_one_error_line(tmp_path, fake_batch):
    (fake_batch.bin / "sbatch").unlink()
    (fake_batch.bin / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2\nexit 1\n")
    (fake_batch.bin / "sbatch").chmod(0o755)
    sweep, spec = files(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "sweep", str(sweep), "--cluster", str(spec),
                           "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          env=fake_batch.env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == f"error: {spec}: slurm job submission failed: sbatch: error: QOSMaxSubmitJobPerUserLimit\n"


def test_ctrl_c_interrupts_whichever_imported_dask_jobqueue_first():
    """dask_jobqueue sets SIGINT to sys.exit() as it is imported: a sweep interrupted under that
    handler ended with exit 0, its jobs still queued. Imported before prorsa's job module, the
    handler is its; the sweep puts Ctrl-C back once its job cluster is up."""
    code = ("import signal, dask_jobqueue\n"
            "from prorsa.cluster.jobs import ctrl_c_interrupts\n"
            "before = getattr(signal.getsignal(signal.SIGINT), '__module__', None)\n"
            "ctrl_c_interrupts()\n"
            "print(before, signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["dask_jobqueue.runner", "True"]
