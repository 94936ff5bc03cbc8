"""Live mode on one real vLLM CPU engine with the tiny random model: its text drives the loop.

The model emits no valid tool call, so every turn must come back as an error observation with
its status recorded, and the runtime must end each trajectory at the turn cap. A run that ends
normally stops its engine without a traceback in the engine's log; its start is told step by step."""

import asyncio
import io
import math

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from prorsa.config.pipeline import PipelineConfig

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)
MAX_TURNS = 3


def test_live_mode_enforces_the_turn_cap_and_records_statuses(tmp_path):
    from prorsa.live.run import run_live
    from prorsa.rollout.context import resolve
    from prorsa.sim.run import lend

    cfg = PipelineConfig.model_validate({
        "name": "live-tools", "policy": "colocated",
        "engines": {"backend": "vllm", "count": 1, "slots": 4,
                    "vllm": {"model": "tiny", "dtype": "float32", "max_model_len": 2048, "cores_per_engine": 1}},
        "workload": {"family": "math-tir", "prompts": 2, "group_size": 2, "steps": 1},
        "environment": {"mode": "live", "dataset": "math-tir", "tools": ["python"], "max_turns": MAX_TURNS,
                        "max_response_tokens": 24},
        "runtime": {"dashboard_address": None, "metrics_interval_s": 0.5},
    })
    console = Console(file=io.StringIO(), width=200)
    summary = asyncio.run(run_live(resolve(cfg), tmp_path, console, lend=lend))
    said = console.file.getvalue()
    # the wait for the engine is told as it goes: where its log is, and each step of its start
    assert f"engine logs: {tmp_path / 'engines'}" in said
    assert said.index("engine-0: server started") < said.index("engine-0: loading the model") < \
        said.index("engine-0: healthy; warming up") < said.index("engines ready"), said
    # the launcher's patches, checked against the installed vLLM and applied, said once
    assert said.count("prorsa patches applied (vLLM 0.32.0): nixl-progress-nice, shutdown-reader-first\n") == 1, said
    assert summary["trajectories_completed"] == 4 and summary["trajectories_failed"] == 0
    rows = pq.read_table(tmp_path / "trajectories.parquet").to_pylist()
    assert len({r["traj_id"] for r in rows}) == 4
    for r in rows:
        turns = r["turns"]
        assert 1 <= len(turns) <= MAX_TURNS and r["task_id"].startswith("math-tir-")
        assert all(t["tool_status"] in ("ok", "error", "timeout", "crash", "truncated") for t in turns[:-1])
        assert all(1 <= t["decode_tokens"] <= 24 for t in turns)
        assert r["response_ids"] and not math.isnan(r["reward"])
        if len(turns) < MAX_TURNS:  # only an answer ends a trajectory early
            assert turns[-1]["tool_status"] == "" and turns[-1]["observation_tokens"] == 0
        else:
            assert turns[-1]["tool_status"] in ("ok", "error", "timeout", "crash", "truncated")
    # a random model writes no tool call: error observations, and the cap ends the trajectories
    assert summary["tool_calls"].get("error", 0) >= 3 * MAX_TURNS
    assert sum(len(r["turns"]) == MAX_TURNS for r in rows) >= 3
    # the engine was stopped in order: vLLM logged no EngineDeadError (nor any other traceback)
    logs = list((tmp_path / "engines").glob("*.log"))
    assert logs and all("Traceback" not in log.read_text(errors="replace") for log in logs)
