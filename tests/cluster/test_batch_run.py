"""`prorsa run --cluster` on SLURM and PBS, end to end: a batch system on this machine runs each job
script as submitted (conftest.py), so real worker processes start from the rendered scripts, join
the scheduler prorsa started, host their engines, run the pipeline, and are cancelled afterwards."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from prorsa.cluster.engine_host import engine_here
from prorsa.cluster.launch import open_run_cluster
from prorsa.config.cluster import load_cluster
from prorsa.config.load import load_pipeline
from prorsa.control.policy import make_policy

PIPELINE = {
    "name": "batch", "seed": 1, "policy": "static:2:1",
    "engines": {"backend": "emulated", "count": 3, "slots": 8, "time_scale": 0.05},
    "workload": {"family": "swe", "mode": "sync", "prompts": 2, "group_size": 2, "steps": 1, "max_turns": 3,
                 "token_scale": 0.5, "tool_time_scale": 0.05},
    "runtime": {"metrics_interval_s": 0.2, "dashboard_address": None, "tool_threads": 4},
}


RESOURCES = {"engine-0": "prefill=8,decode=0,env=0", "engine-1": "prefill=8,decode=0,env=0",
             "engine-2": "prefill=0,decode=8,env=0", "tools-0": "prefill=0,decode=0,env=4"}


def cluster_file(tmp_path: Path, kind: str, **extra) -> Path:
    spec = {"kind": kind, "scheduler": {"host": "127.0.0.1"}, "start_timeout_s": 120,
            "engines": {"gpus": 1, "cpus": 2, "memory": "2GiB"}, "tools": {"cpus": 1, "memory": "1GiB"},
            "jobs": {"walltime": "00:20:00"}} | extra
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def pipeline_file(tmp_path: Path, **workload) -> Path:
    data = json.loads(json.dumps(PIPELINE))
    data["workload"].update(workload)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def prorsa(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prorsa.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def expect_all_cancelled(batch, jobs: list[str]) -> None:
    deadline = time.time() + 60  # scancel waits for the process group itself; a hang guard, not a speed bound
    while any(batch.alive(j) for j in jobs) and time.time() < deadline:
        time.sleep(0.2)
    assert all(batch.cancelled(j) for j in jobs), [j for j in jobs if not batch.cancelled(j)]
    assert not any(batch.alive(j) for j in jobs)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_a_pipeline_runs_on_batch_jobs_and_they_are_cancelled_after(tmp_path, fake_batch, kind):
    out = tmp_path / "runs"
    proc = prorsa("run", str(pipeline_file(tmp_path)), "--cluster", str(cluster_file(tmp_path, kind)),
                  f"output_dir={out}", env=fake_batch.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr

    jobs = fake_batch.jobs()
    assert len(jobs) == 4  # 3 engines + 1 tool worker
    scripts = {j: fake_batch.script(j) for j in jobs}
    names = {j: s.split("--name ")[1].split()[0] for j, s in scripts.items()}
    assert sorted(names.values()) == ["engine-0", "engine-1", "engine-2", "tools-0"]
    scheduler = proc.stdout.split("scheduler: ")[1].split()[0]
    for job, name in names.items():
        assert f"dask_worker {scheduler} --name {name}" in scripts[job]
        # every job's worker joined the one scheduler prorsa started
        assert re.search(r"Registered to:\s+(\S+)", fake_batch.output(job)).group(1) == scheduler
        gpu_request = "#SBATCH --gres=gpu:1" if kind == "slurm" else "#PBS -l select=1:ncpus=2:ngpus=1:mem="
        assert (gpu_request in scripts[job]) == name.startswith("engine-")
        assert f"--resources {RESOURCES[name]}" in scripts[job]
    expect_all_cancelled(fake_batch, jobs)
    assert "cancelled jobs" in proc.stdout

    (run_dir,) = out.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == 4 and summary["trajectories_failed"] == 0
    turns = [t for r in pq.read_table(run_dir / "trajectories.parquet").to_pylist() for t in r["turns"]]
    assert {t["prefill_engine"] for t in turns} <= {"engine-0", "engine-1"}
    assert {t["decode_engine"] for t in turns} == {"engine-2"}


def test_engine_and_tool_jobs_join_with_their_roles_resources_and_engines(tmp_path, fake_batch):
    cfg = load_pipeline(pipeline_file(tmp_path))
    spec = load_cluster(cluster_file(tmp_path, "slurm"))
    roles = make_policy(cfg.policy).initial_roles(cfg.engines.count)

    async def inspect() -> tuple[dict, dict, dict]:
        async with open_run_cluster(spec, cfg, roles, tmp_path / "run") as run:
            info = await run.client.scheduler.identity(n_workers=-1)
            workers = {w["name"]: (w["resources"], w["nthreads"]) for w in info["workers"].values()}
            engines = await run.client.run(lambda dask_worker: engine_here(dask_worker).engine_id,
                                           workers=[a for a, w in info["workers"].items()
                                                    if w["name"].startswith("engine-")])
            return workers, engines, dict(run.jobs)

    workers, engines, jobs = asyncio.run(inspect())
    assert workers == {
        "engine-0": ({"prefill": 8, "decode": 0, "env": 0}, 8),
        "engine-1": ({"prefill": 8, "decode": 0, "env": 0}, 8),
        "engine-2": ({"prefill": 0, "decode": 8, "env": 0}, 8),
        "tools-0": ({"prefill": 0, "decode": 0, "env": 4}, 4),
    }
    assert sorted(engines.values()) == ["engine-0", "engine-1", "engine-2"]  # each job hosts its own
    assert sorted(jobs.values()) == fake_batch.jobs()
    expect_all_cancelled(fake_batch, list(jobs.values()))


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_an_interrupted_run_cancels_its_jobs(tmp_path, fake_batch, sig):
    longer = pipeline_file(tmp_path, prompts=8, group_size=4, steps=50, tool_time_scale=1.0)
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "run", str(longer), "--cluster",
                             str(cluster_file(tmp_path, "slurm")), f"output_dir={tmp_path / 'runs'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=fake_batch.env())
    try:
        seen = ""
        deadline = time.time() + 180
        while "engines ready" not in seen and time.time() < deadline and proc.poll() is None:
            seen += proc.stdout.readline()
        assert "engines ready" in seen, seen + proc.stderr.read()
        jobs = fake_batch.jobs()
        assert len(jobs) == 4 and all(fake_batch.alive(j) for j in jobs)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2 and err.startswith("error: interrupted"), err
    assert "Traceback" not in err + out
    expect_all_cancelled(fake_batch, jobs)


@pytest.mark.slow
def test_a_job_that_never_joins_is_one_error_line_and_cancelled(tmp_path, fake_batch):
    # a prologue that never returns: the job is queued (here: running) but its worker never starts
    spec = cluster_file(tmp_path, "slurm", start_timeout_s=3, jobs={"prologue": ["sleep 600"]})
    proc = prorsa("run", str(pipeline_file(tmp_path)), "--cluster", str(spec), f"output_dir={tmp_path / 'runs'}",
                  env=fake_batch.env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: {spec}: 4 worker(s) did not join within 3 s: engine-0 (job ")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    expect_all_cancelled(fake_batch, fake_batch.jobs())


def test_no_sbatch_on_path_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    spec = cluster_file(tmp_path, "slurm")
    proc = prorsa("run", str(pipeline_file(tmp_path)), "--cluster", str(spec), f"output_dir={tmp_path / 'runs'}",
                  env=dict(__import__("os").environ))
    assert proc.returncode == 2
    assert proc.stderr == f"error: {spec}: kind slurm: sbatch not found on PATH (run prorsa where jobs can be " \
                          "submitted)\n"


def test_a_refused_submission_is_one_error_line(tmp_path, fake_batch):
    # the site's sbatch says no (an account without GPU hours, say)
    (fake_batch.bin / "sbatch").unlink()
    (fake_batch.bin / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
                                           "Invalid account or account/partition combination specified' >&2\n"
                                           "exit 1\n")
    (fake_batch.bin / "sbatch").chmod(0o755)
    spec = cluster_file(tmp_path, "slurm")
    proc = prorsa("run", str(pipeline_file(tmp_path)), "--cluster", str(spec), f"output_dir={tmp_path / 'runs'}",
                  env=fake_batch.env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (f"error: {spec}: slurm job submission failed: sbatch: error: Batch job submission "
                           "failed: Invalid account or account/partition combination specified\n")
