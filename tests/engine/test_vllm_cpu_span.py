"""A CPU engine spanning two "nodes", launched as a run launches it: the tiny MoE under DP=2 with
expert parallelism and `node_ranks: 1`, on a LocalCluster, as a leader worker (the API server and
DP rank 0) and a follower worker (a headless server of rank 1), both on 127.0.0.1. Its greedy
tokens must be a DP=1 engine's (the DP test's prompts), on either rank; weights loaded through the
leader must reach both ranks; a short rollout through it must complete; and with the follower's
server killed, the engine must come back on both nodes.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time

import httpx
import pytest
from rich.console import Console

from prorsa.cluster.engine_host import PLUGIN_NAME, engine_here
from prorsa.cluster.nodes import follower_name
from prorsa.cluster.span_host import FOLLOWER_PLUGIN
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.registry import make_engine
from prorsa.engine.tiny_model import ensure_tiny_moe
from prorsa.engine.vllm.protocol import GREEDY, completion_body, parse_completion
from prorsa.rollout.context import resolve
from prorsa.live.run import open_live
from prorsa.sim.run import lend
from prorsa.roles import Role
from prorsa.rollout.assemble import roll_out
from prorsa.rollout.drivers import Hooks
from tests.engine.test_vllm_cpu_dp import GEN, PROMPTS, _engines, _first_divergence, _greedy, _prompt_tokens, gather

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)


def _pipeline(model_dir) -> PipelineConfig:
    vllm = {"model": str(model_dir), "device": "cpu", "dtype": "float32", "max_model_len": 1024,
            "kv_cache_bytes": 64 * 2**20, "start_timeout_s": 900, "data_parallel_size": 2,
            "enable_expert_parallel": True, "cores_per_engine": 2, "node_ranks": 1}  # fmt: skip
    return PipelineConfig.model_validate({
        "name": "cpu-moe-span", "policy": "colocated",
        "engines": {"backend": "vllm", "count": 1, "slots": 4, "gpu": "cpu", "model": "tiny-moe", "vllm": vllm},
        "workload": {"family": "swe", "prompts": 2, "group_size": 1, "steps": 1, "max_turns": 2,
                     "token_scale": 0.05, "max_context": 900, "tool_time_scale": 0.1},
        "runtime": {"dashboard_address": None, "metrics_interval_s": 0.5, "tool_workers": 1},
    })  # fmt: skip


class _Url:
    """What _prompt_tokens reads off an engine: its server's URL."""

    def __init__(self, url: str) -> None:
        self.server = self
        self.url = url


def _leader_url(dask_worker=None) -> str:
    return engine_here(dask_worker).server.url


def _on_rank(url: str, ids, rank: int):
    r = httpx.post(f"{url}/v1/completions", json=completion_body(ids, GEN, GREEDY), timeout=300,
                   headers={"X-data-parallel-rank": str(rank)})  # fmt: skip
    assert r.status_code == 200, r.text[:300]
    return parse_completion(r.json(), 0.0)


async def _dp1_tokens(model_dir, run_dir):
    one = make_engine(0, Role.DECODE, _engines(model_dir, cores_per_engine=1), run_dir / "dp1")
    await one.start()
    try:
        return await gather(*(_greedy(one, p) for p in PROMPTS))
    finally:
        await one.stop()


async def _load(model_dir: str, dask_worker=None) -> None:
    await engine_here(dask_worker).load_weights(model_dir)


async def _span_run(cfg, run_dir, want, other):
    done = []
    async with open_live(resolve(cfg), run_dir, Console(file=io.StringIO()), lend=lend) as live:
        workers = await live.client.scheduler.identity(n_workers=-1)
        names = {w["name"] for w in workers["workers"].values()}
        assert {"engine-0", follower_name(0, 1)} <= names, names
        leader = live.addresses["engine-0"]
        url = (await live.client.run(_leader_url, workers=[leader]))[leader]
        for rank in (0, 1):  # each prompt pinned to one rank: the follower's answers through the leader
            before = await asyncio.to_thread(_prompt_tokens, _Url(url), rank)
            got = await asyncio.gather(*(asyncio.to_thread(_on_rank, url, p, rank) for p in PROMPTS))
            served = await asyncio.to_thread(_prompt_tokens, _Url(url), rank) - before
            assert served == sum(map(len, PROMPTS)), f"rank {rank} served {served} prompt tokens"
            for p, w, g in zip(PROMPTS, want, got):
                assert g.token_ids == w.token_ids, f"rank {rank}, {len(p)}-token prompt: {_first_divergence(g, w)}"
        # new weights through the leader's API alone reach the follower's rank too: both ranks then
        # agree with each other, and no longer with the old weights' tokens
        await live.client.run(_load, str(other), workers=[leader])
        p = PROMPTS[2]
        new = [await asyncio.to_thread(_on_rank, url, p, rank) for rank in (0, 1)]
        assert new[0].token_ids == new[1].token_ids != want[2].token_ids
        await roll_out(live.run, live.body, live.rec, Hooks(done.append))
        # the follower's server killed: the leader restarts (a new launch) and the follower joins it
        follower = next(a for a, w in workers["workers"].items() if w["name"] == follower_name(0, 1))
        os.killpg((await live.client.run(_follower_pid, workers=[follower]))[follower], signal.SIGKILL)
        t0 = time.monotonic()
        while (now := (await live.client.run(_restarted_url, workers=[leader]))[leader]) is None:
            assert time.monotonic() - t0 < 600, "the engine did not come back"
            await asyncio.sleep(2)
        print(f"\n[vllm] follower killed: the engine served again after {time.monotonic() - t0:.0f} s")
        again = await asyncio.to_thread(_on_rank, now, p, 1)
        assert again.token_ids == new[1].token_ids  # on the new weights, loaded again after the restart
    return done


def _follower_pid(dask_worker=None) -> int:
    return dask_worker.plugins[FOLLOWER_PLUGIN].server.pid


def _restarted_url(dask_worker=None) -> str | None:
    """The leader's URL once its host has restarted it, new weights loaded again; None until then."""
    host = dask_worker.plugins[PLUGIN_NAME]
    return host.engine.server.url if host.restarts else None


def test_an_engine_spanning_two_nodes_gives_the_dp1_tokens_and_rolls_out(tmp_path):
    model = ensure_tiny_moe(tmp_path / "models")
    want = asyncio.run(_dp1_tokens(model, tmp_path))  # one engine at a time: 2 cores
    assert all(len(w.token_ids) == GEN for w in want)
    other = ensure_tiny_moe(tmp_path / "models", seed=1)  # the same shapes, other weights
    done = asyncio.run(_span_run(_pipeline(model), tmp_path / "run", want, other))
    assert len(done) == 2 and all(t.status == "completed" for t in done), [t.status for t in done]
    leader, follower = (tmp_path / "run" / "engines" / f"{n}.log" for n in ("engine-0", "engine-0-node-1"))
    assert "--headless" in follower.read_text() and "--headless" not in leader.read_text()
