"""An engine spanning nodes on a LocalCluster, each node's server a recording fake (fake_servers,
conftest.py): a leader worker and a headless follower worker that meet through the scheduler,
start together, fail together and restart together."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from distributed.utils import get_ip

from prorsa.cluster.local import EngineStartFailed, start_local_cluster
from prorsa.cluster.nodes import follower_name
from prorsa.config.pipeline import PipelineConfig
from prorsa.roles import Role
from tests.cluster.test_batch_run import cluster_file, expect_all_cancelled, prorsa

def _pipeline(tmp_path) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"vocab_size": 32}')
    return {
        "name": "span", "policy": "colocated", "runtime": {"dashboard_address": None},
        "engines": {"backend": "vllm", "count": 1, "model": "tiny-moe", "gpu": "cpu",
                    "vllm": {"model": str(model), "data_parallel_size": 2, "enable_expert_parallel": True,
                             "cores_per_engine": 2, "node_ranks": 1, "start_timeout_s": 60}},
    }  # fmt: skip


def _cfg(tmp_path) -> PipelineConfig:
    return PipelineConfig.model_validate(_pipeline(tmp_path))


def _launches(record: Path) -> list[dict]:
    runs = [json.loads(p.read_text()) for p in record.glob("*.json")]
    return sorted(runs, key=lambda r: "--headless" in r["args"])


async def _wait_launches(record: Path, n: int, timeout_s: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while len(_launches(record)) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return _launches(record)


def _arg(run: dict, name: str) -> str:
    return run["args"][run["args"].index(name) + 1]


def test_the_leader_and_a_headless_follower_meet_on_the_leaders_port(tmp_path, fake_servers):
    record = fake_servers

    async def main():
        async with await start_local_cluster(_cfg(tmp_path), [Role.MIXED], tmp_path / "run") as cluster:
            workers = cluster.scheduler.workers.values()
            follower = next(w for w in workers if w.name == follower_name(0, 1))
            assert follower.resources == {"prefill": 0, "decode": 0, "env": 0}  # no leg lands there

    asyncio.run(main())
    leader, follower = _launches(record)
    assert "--headless" not in leader["args"] and _arg(follower, "--data-parallel-start-rank") == "1"
    for run in (leader, follower):
        assert _arg(run, "--data-parallel-size") == "2" and _arg(run, "--data-parallel-size-local") == "1"
        assert _arg(run, "--data-parallel-address") == "127.0.0.1" and run["env"]["PRORSA_CPU_DP"] == "1"
    assert _arg(leader, "--data-parallel-rpc-port") == _arg(follower, "--data-parallel-rpc-port")
    # each node binds its own rank to its own core
    assert (leader["env"]["VLLM_CPU_OMP_THREADS_BIND"], follower["env"]["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")


def test_a_follower_that_dies_starting_fails_the_run_in_one_line(tmp_path, fake_servers, monkeypatch):
    monkeypatch.setenv("FAKE_HEADLESS_EXIT", "3")

    async def main():
        async with await start_local_cluster(_cfg(tmp_path), [Role.MIXED], tmp_path / "run"):
            pass

    with pytest.raises(EngineStartFailed) as failed:
        asyncio.run(main())
    message = str(failed.value)
    assert "\n" not in message and "node 1 of engine-0" in message and "exited with code 3" in message, message


def test_a_follower_that_dies_running_brings_the_engine_back_with_it(tmp_path, fake_servers):
    record = fake_servers

    async def main():
        async with await start_local_cluster(_cfg(tmp_path), [Role.MIXED], tmp_path / "run"):
            _, follower = await _wait_launches(record, 2)
            os.kill(follower["pid"], signal.SIGKILL)
            await _wait_launches(record, 4)

    asyncio.run(main())
    runs = _launches(record)
    leaders, followers = runs[:2], runs[2:]
    assert len(runs) == 4 and ["--headless" in r["args"] for r in runs] == [False, False, True, True]
    ports = {_arg(r, "--data-parallel-rpc-port") for r in leaders}
    assert len(ports) == 2 and ports == {_arg(r, "--data-parallel-rpc-port") for r in followers}


# --- from batch jobs: the leader is engine-0's job, the follower a job of its own -----------------

def _batch_run(tmp_path, env: dict):
    pipeline = _pipeline(tmp_path) | {
        "seed": 1, "workload": {"family": "swe", "mode": "sync", "prompts": 1, "group_size": 2, "steps": 1,
                                "max_turns": 2, "token_scale": 0.1, "tool_time_scale": 0.05}}
    pipeline["runtime"] |= {"metrics_interval_s": 0.2, "tool_threads": 2}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline))
    # the scheduler on this machine's outward address: the workers' too, and the nodes meet there
    cluster = cluster_file(tmp_path, "slurm", scheduler={"host": get_ip()}, engines={"cpus": 1, "memory": "1GiB"})
    return prorsa("run", str(tmp_path / "p.yaml"), "--cluster", str(cluster), f"output_dir={tmp_path / 'runs'}",
                  env=env, timeout=240)


def test_from_batch_jobs_a_follower_job_meets_its_leader_and_a_rollout_completes(tmp_path, fake_batch,
                                                                                 job_fake_servers):
    proc = _batch_run(tmp_path, fake_batch.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {j: fake_batch.script(j).split("--name ")[1].split()[0] for j in fake_batch.jobs()}
    assert sorted(names.values()) == ["engine-0", "node-1-of-engine-0", "tools-0"]
    follower = next(j for j, name in names.items() if name == "node-1-of-engine-0")
    assert "--resources prefill=0,decode=0,env=0" in fake_batch.script(follower)
    leader, headless = _launches(job_fake_servers)
    assert "--headless" not in leader["args"] and _arg(headless, "--data-parallel-start-rank") == "1"
    for option in ("--data-parallel-address", "--data-parallel-rpc-port"):
        assert _arg(leader, option) == _arg(headless, option)
    # the leader job's own host, as another node would reach it, not the loopback
    assert _arg(leader, "--data-parallel-address") == get_ip()
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == 2 and summary["trajectories_failed"] == 0
    expect_all_cancelled(fake_batch, fake_batch.jobs())


def test_from_batch_jobs_a_follower_that_dies_fails_the_run_in_one_line(tmp_path, fake_batch, job_fake_servers):
    proc = _batch_run(tmp_path, fake_batch.env() | {"FAKE_HEADLESS_EXIT": "3"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert "node 1 of engine-0" in proc.stderr and "exited with code 3" in proc.stderr, proc.stderr
    expect_all_cancelled(fake_batch, fake_batch.jobs())
