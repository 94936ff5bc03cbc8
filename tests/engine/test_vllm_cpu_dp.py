"""A CPU engine with DP attention and expert parallelism, started the way a pipeline starts it.

One tiny random Qwen3-MoE (8 experts, top-2), two servers for the module: `data_parallel_size: 2`
with `enable_expert_parallel: true` (one core per rank), and a DP=1 engine of the same weights.
Both come from an engines section through the engine registry, as `prorsa run` makes them, so
the DP server gets its patch (cpu_dp.py) only the way a run would. Greedy decoding in float32:
every prompt, on either DP rank, must give the DP=1 engine's tokens.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time

import httpx
import pytest

from prorsa.config.pipeline import EnginesConfig
from prorsa.engine.base import DecodeRequest
from prorsa.engine.registry import make_engine
from prorsa.engine.tiny_model import ensure_tiny_moe
from prorsa.engine.vllm.protocol import GREEDY, completion_body, parse_completion
from prorsa.roles import Role

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)

GEN = 16
PROMPTS = [tuple(random.Random(seed).randrange(16, 2000) for _ in range(n))
           for seed, n in enumerate((24, 60, 130, 200, 260, 300))]  # fmt: skip


async def gather(*coros, return_exceptions=False):
    return await asyncio.gather(*coros, return_exceptions=return_exceptions)


def _engines(model_dir, **layout) -> EnginesConfig:
    vllm = {"model": str(model_dir), "device": "cpu", "dtype": "float32", "max_model_len": 1024,
            "kv_cache_bytes": 64 * 2**20, "start_timeout_s": 900, **layout}  # fmt: skip
    return EnginesConfig.model_validate({"backend": "vllm", "count": 1, "model": "qwen3-30b-a3b", "vllm": vllm})


@pytest.fixture(scope="module")
def run():
    """One event loop for the module, in a thread: the engines' HTTP clients live on it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield lambda coro, timeout=900: asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)
    loop.call_soon_threadsafe(loop.stop)
    thread.join()


@pytest.fixture(scope="module")
def engines(run, tmp_path_factory):
    model = ensure_tiny_moe(tmp_path_factory.mktemp("models"))
    run_dir = tmp_path_factory.mktemp("run")
    dp = make_engine(0, Role.DECODE, _engines(model, data_parallel_size=2, enable_expert_parallel=True,
                                              cores_per_engine=2), run_dir / "dp2")  # fmt: skip
    one = make_engine(0, Role.DECODE, _engines(model, cores_per_engine=1), run_dir / "dp1")
    try:
        t0 = time.monotonic()
        errors = [e for e in run(gather(dp.start(), one.start(), return_exceptions=True)) if e]
        if errors:
            raise errors[0]
        print(f"\n[vllm] DP2+EP and DP1 servers up in {time.monotonic() - t0:.1f} s "
              f"(DP2+EP: start {dp.server.start_s:.1f} s + warm-up {dp.server.warmup_s:.1f} s; "
              f"DP1: {one.server.start_s:.1f} s + {one.server.warmup_s:.1f} s)")  # fmt: skip
        yield dp, one
    finally:
        run(gather(dp.stop(), one.stop(), return_exceptions=True))


def _greedy(engine, ids):
    return engine.generate(DecodeRequest("t", 0, context_tokens=len(ids), max_tokens=GEN, token_ids=ids,
                                         sampling=GREEDY))  # fmt: skip


def _on_rank(engine, ids, rank: int):
    """One greedy completion on DP rank `rank` (vLLM's X-data-parallel-rank header)."""
    body = completion_body(ids, GEN, GREEDY)
    r = httpx.post(f"{engine.server.url}/v1/completions", json=body, timeout=300,
                   headers={"X-data-parallel-rank": str(rank)})  # fmt: skip
    assert r.status_code == 200, r.text[:300]
    return parse_completion(r.json(), 0.0)


def _first_divergence(a, b) -> str:
    i = next(i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y)
    return f"token {i}: {a.token_ids[i]} (logprob {a.logprobs[i]:.4f}) vs {b.token_ids[i]} ({b.logprobs[i]:.4f})"


def test_dp2_ep_engine_gives_the_dp1_tokens(engines, run):
    dp, one = engines
    t0 = time.monotonic()
    want = run(gather(*(_greedy(one, p) for p in PROMPTS)))
    t1 = time.monotonic()
    got = run(gather(*(_greedy(dp, p) for p in PROMPTS)))  # concurrent: DP balances them
    print(f"\n[vllm] {len(PROMPTS)} prompts x {GEN} greedy tokens: DP1 {t1 - t0:.2f} s, "
          f"DP2+EP {time.monotonic() - t1:.2f} s")  # fmt: skip
    for p, w, g in zip(PROMPTS, want, got):
        assert len(w.token_ids) == GEN
        assert g.token_ids == w.token_ids, f"{len(p)}-token prompt, {_first_divergence(g, w)}"


def _prompt_tokens(engine, rank: int) -> float:
    metrics = httpx.get(f"{engine.server.url}/metrics", timeout=30).text
    m = re.search(rf'^vllm:prompt_tokens_total\{{[^}}]*engine="{rank}"[^}}]*\}} (\S+)', metrics, re.M)
    assert m, f"no prompt token count of DP rank {rank} in /metrics"
    return float(m.group(1))


def test_each_dp_rank_serves_and_agrees(engines, run):
    dp, one = engines
    prompt = PROMPTS[2]
    want = run(_greedy(one, prompt))
    for rank in (0, 1):
        before = _prompt_tokens(dp, rank)
        got = _on_rank(dp, prompt, rank)
        assert _prompt_tokens(dp, rank) - before == len(prompt)  # this rank served it
        assert got.token_ids == want.token_ids, f"rank {rank}: {_first_divergence(got, want)}"


def test_the_patch_reached_the_dp_processes_only(engines):
    dp, one = engines
    log = dp.server.log_path.read_text()
    pids = set(re.findall(r"CPU DP collectives and expert map installed \(pid (\d+)\)", log))
    print(f"\n[vllm] the DP patch was installed in {len(pids)} processes of the DP2+EP server")
    # the API server, and an engine core and a worker per rank (spawned children); not the DP
    # coordinator, a sixth process that runs no model and is spared the imports
    assert len(pids) == 5, pids
    coordinator = re.search(r"Started DP Coordinator process \(PID: (\d+)\)", log)
    assert coordinator and coordinator.group(1) not in pids
    assert "CPU DP collectives" not in one.server.log_path.read_text()
