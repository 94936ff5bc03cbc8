"""The device plan: the node's GPUs found as dask-cuda finds them, cut into one slice per engine,
refused when the engines do not fit; an engine worker's server sees its slice and nothing else."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path

import pytest

from prorsa.cluster.devices import DevicePlanError, gpus_for_slot, node_devices, nvml_gpu_count, plan_node
from prorsa.cluster.engine_host import EngineHost
from prorsa.config.layout import EngineLayout
from prorsa.config.pipeline import EnginesConfig
from prorsa.engine.vllm.errors import EngineUnavailable
from prorsa.roles import Role


def _fake_nvml(monkeypatch, count: int | None, calls: list | None = None):
    """pynvml with `count` GPUs; None: a machine without a driver (nvmlInit raises)."""
    class NVMLError(Exception):
        pass

    def init():
        if count is None:
            raise NVMLError("NVML Shared Library Not Found")
        if calls is not None:
            calls.append("init")

    def shutdown():
        if calls is not None:
            calls.append("shutdown")

    fake = types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=init, nvmlShutdown=shutdown,
                                 nvmlDeviceGetCount=lambda: count)
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_nvml_counts_the_gpus_and_shuts_down(monkeypatch):
    calls = []
    _fake_nvml(monkeypatch, 8, calls)
    assert nvml_gpu_count() == 8 and calls == ["init", "shutdown"]
    _fake_nvml(monkeypatch, None)
    assert nvml_gpu_count() == 0  # no driver: no discovery
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert nvml_gpu_count() == 0


def test_the_node_list_comes_from_the_pipeline_then_cuda_visible_devices_then_nvml(monkeypatch):
    _fake_nvml(monkeypatch, 4)
    assert node_devices(("3", "1"), {"CUDA_VISIBLE_DEVICES": "0"}) == (("3", "1"), "engines.devices")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aa, 5,2"}  # dask-cuda takes UUIDs and keeps the order
    assert node_devices(None, env) == (("GPU-aa", "5", "2"), "CUDA_VISIBLE_DEVICES")
    assert node_devices(None, {}) == (("0", "1", "2", "3"), "NVML")
    assert node_devices(None, {"CUDA_VISIBLE_DEVICES": ""}) == ((), "CUDA_VISIBLE_DEVICES")  # none visible


def test_each_engine_takes_its_own_consecutive_slice():
    plan = plan_node(tuple("76543210"), "NVML", EngineLayout(tp=2), engines=3)
    assert [plan.for_slot(k) for k in range(3)] == [("7", "6"), ("5", "4"), ("3", "2")]
    with pytest.raises(IndexError):
        plan.for_slot(3)


@pytest.mark.parametrize(("devices", "layout", "engines", "message"), [
    ((), EngineLayout(), 1, "no GPU was found (NVML); list the node's GPUs in engines.devices"),
    (tuple("0123"), EngineLayout(tp=2, dp=4), 1, "an engine of tp 2 x dp 4 = 8 GPUs is larger than the node's 4 GPUs"),
    (tuple("012345"), EngineLayout(tp=4), 1, "the node's 6 GPUs (NVML) do not divide into engines of tp 4 x dp 1"),
    (tuple("01234567"), EngineLayout(tp=2), 5, "engines.count: 5 engines x 2 GPUs = 10 GPUs, but the node has 8"),
])
def test_engines_that_do_not_fit_are_refused(devices, layout, engines, message):
    with pytest.raises(DevicePlanError) as err:
        plan_node(devices, "NVML", layout, engines)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cpu_engines_get_no_gpus(monkeypatch):
    _fake_nvml(monkeypatch, 8)
    assert gpus_for_slot(EnginesConfig(backend="vllm"), 0, 3) is None
    assert gpus_for_slot(EnginesConfig(backend="emulated"), 0, 3) is None


FAKE_SERVER = """#!/bin/sh
# records how the engine worker launched it, then fails the start
env > "$RECORD_DIR/env.$$"
echo "$@" > "$RECORD_DIR/args.$$"
exit 3
"""


def _launch_recorded(tmp_path, monkeypatch, engines: EnginesConfig, index: int) -> tuple[dict, str]:
    """EngineHost.setup as a worker runs it, the server's interpreter replaced by a script that
    writes down its environment and arguments."""
    record = tmp_path / f"record-{index}"
    record.mkdir()
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_SERVER)
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    monkeypatch.setenv("RECORD_DIR", str(record))
    host = EngineHost(index, Role.DECODE, engines, str(tmp_path / "run"))
    with pytest.raises(EngineUnavailable, match="exited with code 3"):
        asyncio.run(host.setup(types.SimpleNamespace(address="inproc://w")))
    env_file = next(record.glob("env.*"))
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return env, next(record.glob("args.*")).read_text()


@pytest.fixture()
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"vocab_size": 32}')
    return d


def test_an_engine_worker_starts_its_server_on_its_own_gpus(tmp_path, monkeypatch, model_dir):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    engines = EnginesConfig(backend="vllm", count=2, devices=[4, 5, 6, 7],
                            vllm={"device": "cuda", "model": str(model_dir), "tensor_parallel_size": 2,
                                  "start_timeout_s": 60})
    env, args = _launch_recorded(tmp_path, monkeypatch, engines, index=1)
    assert env["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert "--tensor-parallel-size 2" in args and "--gpu-memory-utilization" in args


def test_a_cpu_engine_worker_sets_no_gpus(tmp_path, monkeypatch, model_dir):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    engines = EnginesConfig(backend="vllm", count=2, vllm={"model": str(model_dir), "start_timeout_s": 60})
    env, args = _launch_recorded(tmp_path, monkeypatch, engines, index=0)
    assert "CUDA_VISIBLE_DEVICES" not in env and env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "--kv-cache-memory-bytes" in args


def test_a_local_cluster_starts_each_engine_server_on_its_own_gpus(tmp_path, monkeypatch, model_dir, fake_servers):
    """Two 2-GPU engines of a local run on a node listing four GPUs: the engine workers launch
    their servers (the interpreter swapped for one that runs a recording fake server) with
    CUDA_VISIBLE_DEVICES 0,1 and 2,3."""
    from prorsa.cluster.local import start_local_cluster
    from prorsa.config.pipeline import PipelineConfig

    record = fake_servers
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = PipelineConfig.model_validate({
        "name": "gpus", "policy": "static:1:1", "runtime": {"dashboard_address": None},
        "engines": {"backend": "vllm", "count": 2, "devices": [0, 1, 2, 3],
                    "vllm": {"device": "cuda", "model": str(model_dir), "tensor_parallel_size": 2,
                             "start_timeout_s": 60}},
    })  # fmt: skip

    async def main():
        async with await start_local_cluster(cfg, [Role.PREFILL, Role.DECODE], tmp_path / "run"):
            pass

    asyncio.run(main())
    launched = [json.loads(p.read_text()) for p in record.glob("*.json")]
    assert sorted(r["env"]["CUDA_VISIBLE_DEVICES"] for r in launched) == ["0,1", "2,3"]
    assert all(r["args"][r["args"].index("--tensor-parallel-size") + 1] == "2" for r in launched)


def test_engines_of_different_sizes_take_aligned_slices_widest_first():
    from prorsa.cluster.devices import engine_layouts
    from prorsa.config.pipeline import EnginesConfig

    cfg = EnginesConfig(backend="vllm", model="qwen3-30b-a3b", vllm={"device": "cuda"}, devices=list(range(12)),
                        groups=[{"count": 2, "roles": ["prefill"]}, {"count": 1, "roles": ["decode"], "tensor_parallel_size": 2},
                                {"count": 1, "roles": ["decode"], "data_parallel_size": 8, "enable_expert_parallel": True}])
    assert [lay.gpus for lay in engine_layouts(cfg)] == [1, 1, 2, 8]
    assert [gpus_for_slot(cfg, k, 4) for k in range(4)] == [("10",), ("11",), ("8", "9"), tuple(map(str, range(8)))]
    # a batch job hosting engine 3 alone plans its own 8 GPUs from slot 0
    job = cfg.model_copy(update={"devices": tuple(map(str, range(8)))})
    assert gpus_for_slot(job, 0, 1, index=3) == tuple(map(str, range(8)))
    with pytest.raises(DevicePlanError, match=r"2 x 1 GPU \+ 1 x 2 GPUs \+ 1 x 8 GPUs = 12 GPUs, but the node has 11"):
        gpus_for_slot(cfg.model_copy(update={"devices": tuple(map(str, range(11)))}), 0, 4)
