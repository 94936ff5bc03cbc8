"""`prorsa run --cluster tcp://HOST:PORT`: a scheduler and workers started by hand (`dask scheduler`,
`dask worker --name engine-<i> --resources ...`); prorsa gives each engine its initial role and its
engine, runs the pipeline, and leaves the workers as it found them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from distributed import Client

PIPELINE = {
    "name": "adopted", "seed": 4, "policy": "static:1:1",
    "engines": {"backend": "emulated", "count": 2, "slots": 4, "time_scale": 0.05},
    "workload": {"family": "search", "mode": "sync", "prompts": 2, "group_size": 2, "max_turns": 2,
                 "tool_time_scale": 0.05},
    "runtime": {"metrics_interval_s": 0.2, "dashboard_address": None},
}


def _engine_or_none(dask_worker):
    plugin = dask_worker.plugins.get("prorsa-engine")
    return None if plugin is None else getattr(plugin, "engine", None)


@pytest.fixture
def hand_made_cluster(tmp_path):
    """A scheduler and three workers as a user would start them; every engine worker declares the
    decode role (the policy wants engine-0 to prefill)."""
    scheduler_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.time() + 60
    while not scheduler_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    address = json.loads(scheduler_file.read_text())["address"]
    workers = {"engine-0": "prefill=0,decode=4,env=0", "engine-1": "prefill=0,decode=4,env=0",
               "tools-0": "prefill=0,decode=0,env=16"}
    for name, resources in workers.items():
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--name", name,
                                       "--nthreads", "16" if name.startswith("tools") else "4", "--no-nanny",
                                       "--no-dashboard", "--resources", resources],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        with Client(address, timeout=30) as client:
            client.wait_for_workers(3, timeout=60)
            yield address, client
    finally:
        # the workers first, while their scheduler still answers: a worker told to stop after its
        # scheduler has gone can hang in `closing` (the teardown took 60 s waiting on two of them)
        for p in [*procs[1:], procs[0]]:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)


@pytest.mark.slow
def test_a_pipeline_runs_on_a_running_scheduler_and_leaves_it_as_it_was(tmp_path, hand_made_cluster):
    address, client = hand_made_cluster
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump(PIPELINE))
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), "--cluster", address,
                           f"output_dir={out}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = out.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == 4 and summary["trajectories_failed"] == 0
    turns = [t for r in pq.read_table(run_dir / "trajectories.parquet").to_pylist() for t in r["turns"]]
    # the policy's roles, not the ones the workers were started with
    assert {t["prefill_engine"] for t in turns} == {"engine-0"}
    assert {t["decode_engine"] for t in turns} == {"engine-1"}

    # the workers stay; their engines are stopped and work stealing is back
    assert len(client.scheduler_info()["workers"]) == 3
    assert set(client.run(_engine_or_none).values()) == {None}
    assert client.run_on_scheduler(lambda dask_scheduler: "stealing" in dask_scheduler.periodic_callbacks)


@pytest.mark.slow  # four processes to start
def test_missing_workers_are_named_in_one_error_line(tmp_path, hand_made_cluster):
    address, _ = hand_made_cluster
    spec = tmp_path / "scheduler.yaml"
    spec.write_text(yaml.safe_dump({"kind": "address", "address": address, "start_timeout_s": 1}))
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump(PIPELINE | {"engines": PIPELINE["engines"] | {"count": 3},
                                                   "policy": "static:2:1"}))
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), "--cluster", str(spec),
                           f"output_dir={tmp_path / 'runs'}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {spec}: 1 worker(s) did not join within 1 s: engine-2\n"
    assert list((tmp_path / "runs").iterdir()) == []  # a start that failed leaves no half-made run


@pytest.mark.slow  # the connection attempt runs to its 10 s timeout
def test_an_address_that_does_not_answer_is_one_error_line(tmp_path):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump(PIPELINE))
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), "--cluster",
                           "tcp://127.0.0.1:9", f"output_dir={tmp_path / 'runs'}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: tcp://127.0.0.1:9: cannot connect to tcp://127.0.0.1:9 (")
    assert list((tmp_path / "runs").iterdir()) == []  # a start that failed leaves no half-made run
