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

from prorsa.cluster.local import EngineStartFailed, start_local_cluster
from prorsa.cluster.nodes import follower_name
from prorsa.config.pipeline import PipelineConfig
from prorsa.roles import Role

def _cfg(tmp_path) -> PipelineConfig:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"vocab_size": 32}')
    return PipelineConfig.model_validate({
        "name": "span", "policy": "colocated", "runtime": {"dashboard_address": None},
        "engines": {"backend": "vllm", "count": 1, "model": "tiny-moe", "gpu": "cpu",
                    "vllm": {"model": str(model), "data_parallel_size": 2, "enable_expert_parallel": True,
                             "cores_per_engine": 2, "node_ranks": 1, "start_timeout_s": 60}},
    })  # fmt: skip


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
