"""VllmEngine against real vLLM CPU servers: PD disaggregation with real KV transfer over NIXL.

Two engines with the same weights, pinned to cores 0 and 1, live for the whole module (a start
costs 20-110 s on a shared 2-core machine); a third with other weights comes up for the proof
that a decode used the shipped KV. Greedy decoding in float32, so outputs compare exactly.
The kill test restarts engine B; it runs last.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from prorsa.config.pipeline import VllmSettings
from prorsa.engine.base import DecodeRequest, PrefillRequest
from prorsa.engine.tiny_model import ensure_tiny_model
from prorsa.engine.vllm import EngineUnavailable, Placement, VllmEngine
from prorsa.engine.vllm.protocol import GREEDY
from prorsa.roles import Role
from prorsa.sampling import Sampling

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)

SETTINGS = VllmSettings(dtype="float32", start_timeout_s=400)
GEN = 16  # tokens generated per turn


def context(seed: int, n: int = 300) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(16, 2000) for _ in range(n))


def prefill_req(ids, traj="t", turn=0) -> PrefillRequest:
    return PrefillRequest(traj, turn, context_tokens=len(ids), new_tokens=len(ids), token_ids=tuple(ids))


def decode_req(ids, kv=None, traj="t", turn=0, max_tokens=GEN) -> DecodeRequest:
    return DecodeRequest(traj, turn, context_tokens=len(ids), max_tokens=max_tokens,
                         token_ids=tuple(ids), kv=kv, sampling=GREEDY)  # fmt: skip


async def gather(*coros, return_exceptions=False):
    return await asyncio.gather(*coros, return_exceptions=return_exceptions)


async def disaggregated(p: VllmEngine, d: VllmEngine, ids, max_tokens=GEN):
    pre = await p.prefill(prefill_req(ids))
    return pre, await d.decode(decode_req(ids, kv=pre.kv, max_tokens=max_tokens))


@pytest.fixture(scope="module")
def loop():
    """One event loop for the module, in a thread: the engines' HTTP clients live on it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()


@pytest.fixture(scope="module")
def run(loop):
    return lambda coro, timeout=600: asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {seed: ensure_tiny_model(root, seed=seed) for seed in (0, 1)}


@pytest.fixture(scope="module")
def engines(run, models, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    a = VllmEngine("A", Role.PREFILL, SETTINGS, models[0], Placement([0]), log_dir=logs)
    b = VllmEngine("B", Role.DECODE, SETTINGS, models[0], Placement([1]), log_dir=logs)
    try:
        t0 = time.monotonic()
        # both starts run to the end even if one fails, so teardown never races a start
        errors = [e for e in run(gather(a.start(), b.start(), return_exceptions=True)) if e]
        if errors:
            raise errors[0]
        print(f"\n[vllm] two servers up in {time.monotonic() - t0:.1f} s "
              f"(A: start {a.server.start_s:.1f} s + warm-up {a.server.warmup_s:.1f} s; "
              f"B: {b.server.start_s:.1f} s + {b.server.warmup_s:.1f} s)")  # fmt: skip
        for p, d in ((a, b), (b, a)):  # first transfer per pair: NIXL handshake
            t0 = time.monotonic()
            run(disaggregated(p, d, context(99)))
            print(f"[vllm] first transfer {p.engine_id}->{d.engine_id}: {time.monotonic() - t0:.2f} s")
        yield a, b
    finally:
        run(gather(a.stop(), b.stop(), return_exceptions=True))


def test_decode_uses_the_shipped_kv(engines, run, models, tmp_path):
    """A decode engine with other weights, fed A's KV, gives what neither engine gives alone."""
    a, b = engines
    # vLLM refuses KV from another model path unless told: here that is the point
    other = SETTINGS.model_copy(update={"nixl_compat_check": False})
    c = VllmEngine("C", Role.DECODE, other, models[1], Placement([1]), log_dir=tmp_path)
    run(c.start())
    try:
        ids = context(1)
        alone_a = run(a.generate(decode_req(ids))).token_ids
        alone_c = run(c.generate(decode_req(ids))).token_ids
        run(disaggregated(a, c, context(2)))  # handshake A->C out of the timing
        timings = []
        for _ in range(3):
            t0 = time.monotonic()
            pre, out = run(disaggregated(a, c, ids))
            timings.append((pre, out, time.monotonic() - t0))
        assert alone_a != alone_c
        assert len(out.token_ids) == GEN == len(out.logprobs)
        assert out.token_ids not in (alone_a, alone_c)
        # positive control: the same KV decoded by B (A's weights) reproduces A alone
        assert run(disaggregated(a, b, ids))[1].token_ids == alone_a
        assert pre.kv["remote_engine_id"] and pre.kv["remote_block_ids"]
        for pre, out, wall in timings:
            print(f"[vllm] prefill 300 tok {pre.compute_s * 1e3:.0f} ms (queue {pre.queue_s * 1e3:.1f}); "
                  f"decode {GEN} tok: pull+first {out.transfer_s * 1e3:.0f} ms, "
                  f"rest {out.decode_s * 1e3:.0f} ms; turn wall {wall * 1e3:.0f} ms")  # fmt: skip
    finally:
        run(c.stop())


def test_priority_policy_admits_the_lowest_key_first(run, models, tmp_path):
    """One sequence at a time, so every request but the running one waits in vLLM's queue: a
    request sent last with the lowest key runs next, ahead of the queued ones sent before it, and
    those (equal keys) run in the order they came. On fcfs, or with the priority not sent, the
    last one sent would finish last."""
    settings = SETTINGS.model_copy(update={"scheduling_policy": "priority", "extra_args": ("--max-num-seqs", "1")})
    e = VllmEngine("P", Role.MIXED, settings, models[0], Placement([1]), log_dir=tmp_path)
    run(e.start())
    done: list[str] = []

    async def send(name: str, seed: int, max_tokens: int, priority: float):
        ids = context(seed, n=50)
        out = await e.generate(DecodeRequest(name, 0, context_tokens=len(ids), max_tokens=max_tokens,
                                             token_ids=ids, sampling=GREEDY, priority=priority))
        done.append(name)
        return out

    async def scenario():
        running = asyncio.create_task(send("running", 0, 800, 0.0))
        while True:  # the first request holds the only sequence slot
            await e.refresh_metrics()
            if e.stats().active == 1:  # the server's count, fresh from /metrics
                break
            await asyncio.sleep(0.02)
        tasks = [running]
        for i, (name, priority) in enumerate([("low-a", 50.0), ("low-b", 50.0), ("low-c", 50.0), ("high", -50.0)]):
            tasks.append(asyncio.create_task(send(name, i + 1, 24, priority)))
            await asyncio.sleep(0.02)  # one after the other: arrival order is send order
        return dict(zip(["running", "low-a", "low-b", "low-c", "high"], await asyncio.gather(*tasks)))

    try:
        t0 = time.monotonic()
        out = run(scenario(), timeout=300)
        print(f"[vllm] priority policy: finished {done}; waiting {out['high'].queue_s * 1e3:.0f} ms (high) vs "
              f"{out['low-a'].queue_s * 1e3:.0f} ms (low-a, sent first); {time.monotonic() - t0:.1f} s")
    finally:
        run(e.stop())
    # all four waited behind the first (had one not, the last sent could not finish first)
    assert done == ["running", "high", "low-a", "low-b", "low-c"]
    assert out["high"].queue_s < out["low-a"].queue_s


def test_a_replayed_decode_writes_its_length_under_a_larger_cap(engines, run):
    """A replayed turn asks the run's cap as max_tokens and its length apart (replay_tokens): the
    server writes exactly that length, EOS ignored, whatever the cap; a live turn stops at the cap
    at most (a random tiny model may write EOS sooner)."""
    a, b = engines
    ids = context(41)  # a prefix of its own: other tests' cache hits must not find it cached
    pre = run(a.prefill(prefill_req(ids)))
    replayed = run(b.decode(replace(decode_req(ids, kv=pre.kv, max_tokens=600), replay_tokens=7)))
    assert replayed.n_tokens == len(replayed.token_ids) == 7
    live = run(a.generate(replace(decode_req(ids, max_tokens=5), ignore_eos=False)))
    assert 1 <= live.n_tokens <= 5


def test_second_turn_hits_the_prefix_cache(engines, run):
    a, b = engines
    turn0 = context(3)
    pre0, act0 = run(disaggregated(a, b, turn0))
    assert pre0.cached_tokens == 0
    turn1 = turn0 + act0.token_ids + context(4, n=60)  # history + action + observation
    pre1 = run(a.prefill(prefill_req(turn1, turn=1)))
    assert pre1.cached_tokens >= 256  # whole 128-token blocks of turn 0's context
    act1 = run(b.decode(decode_req(turn1, kv=pre1.kv, turn=1)))
    # decode-local alternative: B holds turn 1's context (pulled), so only the tail computes
    turn2 = turn1 + act1.token_ids + context(5, n=40)
    local = run(b.decode(decode_req(turn2, kv=None, turn=2)))
    print(f"[vllm] turn-1 prefill cached {pre1.cached_tokens}/{len(turn1)}; "
          f"decode-local turn 2 cached {local.cached_tokens}/{len(turn2)}")
    assert local.cached_tokens > 0
    assert local.token_ids == run(a.generate(decode_req(turn2))).token_ids

    run(a.reset_prefix_cache())
    again = run(a.prefill(prefill_req(turn1, turn=1)))
    run(b.decode(decode_req(turn1, kv=again.kv)))  # let A release the blocks it holds for B
    assert again.cached_tokens == 0


def test_a_warmed_engine_serves_the_next_turn_from_its_prefix_cache(engines, run):
    """scheduling.migrate: turn 0 runs on A; while its tool runs, B is warmed with the context
    as turn 1 will find it (a plain prefill, no KV left waiting for a pull). Turn 1 on B then
    prefills only what is new: the same blocks would be recomputed without the warm-up."""
    a, b = engines
    turn0 = context(11, n=400)
    act0 = run(a.generate(decode_req(turn0, traj="w")))
    warm = run(b.warm(PrefillRequest("w", 0, context_tokens=len(turn0) + len(act0.token_ids), new_tokens=0,
                                     token_ids=turn0 + act0.token_ids)))
    assert warm.kv == {} and warm.cached_tokens == 0  # B had never seen it
    turn1 = turn0 + act0.token_ids + context(12, n=60)
    act1 = run(b.generate(decode_req(turn1, traj="w", turn=1)))
    print(f"[vllm] migrated turn 1 cached {act1.cached_tokens}/{len(turn1)} on the warmed engine")
    assert act1.cached_tokens >= 256 and act1.cached_tokens <= len(turn0) + len(act0.token_ids)


def test_role_flip_under_load_loses_no_request(engines, run):
    """8 turns A->B in flight, roles flipped, 8 turns B->A: all 16 equal the colocated outputs."""
    a, b = engines
    ctxs = [context(100 + i, n=250 + 5 * i) for i in range(16)]
    expected = run(gather(*(a.generate(decode_req(c, max_tokens=32)) for c in ctxs)))

    async def scenario():
        first = [asyncio.create_task(disaggregated(a, b, c, max_tokens=32)) for c in ctxs[:8]]
        while b.inflight(Role.DECODE) == 0:  # the old direction is really under way
            await asyncio.sleep(0.002)
        in_flight = a.inflight(Role.PREFILL) + b.inflight(Role.DECODE)
        t0 = time.monotonic()
        a.set_role(Role.DECODE)
        b.set_role(Role.PREFILL)
        second = [asyncio.create_task(disaggregated(b, a, c, max_tokens=32)) for c in ctxs[8:]]
        await asyncio.gather(a.drain(Role.PREFILL), b.drain(Role.DECODE))
        switch_s = time.monotonic() - t0
        return in_flight, switch_s, await asyncio.gather(*first, *second)

    in_flight, switch_s, results = run(scenario())
    print(f"[vllm] role switch with {in_flight} old-direction requests in flight: "
          f"drain + flip {switch_s * 1e3:.0f} ms")
    assert in_flight > 0
    assert [out.token_ids for _, out in results] == [e.token_ids for e in expected]
    assert (a.role, b.role) == (Role.DECODE, Role.PREFILL)
    assert a.inflight() == b.inflight() == 0
    stats = b.stats()
    assert stats.role is Role.PREFILL and stats.kv_capacity > 0 and stats.decode_tokens_total > 0
    assert stats.extra["inflight_decode"] == 0.0
    run(b.refresh_metrics())
    assert 0.0 <= b.stats().extra["kv_usage"] <= 1.0
    a.set_role(Role.PREFILL)
    b.set_role(Role.DECODE)


def test_seeded_sampling_survives_prefills_split_across_steps(engines, run):
    """The RL loop samples at temperature 1 with a seed per turn. Many long prompts at once make
    vLLM split prefills across scheduler steps, and it rewinds a split request's generator, which
    a CPU generator cannot do: an engine that passed the seed on died of it."""
    a, _ = engines
    reqs = [DecodeRequest(f"s{i}", 0, context_tokens=900, max_tokens=8, token_ids=context(500 + i, n=900),
                          sampling=Sampling(), seed=1000 + i) for i in range(24)]
    out = run(gather(*(a.generate(r) for r in reqs)))
    assert all(len(o.token_ids) == 8 for o in out)
    assert run(a.ensure_healthy()) is False  # the server never went down


def test_idle_engine_leaves_its_core_alone(engines):
    """NIXL's progress thread spins on the engine's core; niced, it yields to other work."""
    psutil = pytest.importorskip("psutil")
    a, _ = engines
    root = psutil.Process(a.server.pid)
    tids = [t.id for p in (root, *root.children(recursive=True)) for t in p.threads()]
    assert any(os.getpriority(os.PRIO_PROCESS, tid) == 19 for tid in tids)
    burn = (
        "import os, time\n"
        "os.sched_setaffinity(0, {0})\n"
        "t, c = time.time(), time.process_time()\n"
        "while time.time() - t < 3: pass\n"
        "print((time.process_time() - c) / (time.time() - t))\n"
    )
    time.sleep(1)  # let the last request's work settle
    share = float(subprocess.run([sys.executable, "-c", burn], capture_output=True, text=True).stdout)
    # ~0.95 on a quiet machine, ~0.5 without the nice; not asserted: other sessions' load counts
    print(f"[vllm] a busy process gets {share:.2f} of an idle engine's core")


def test_new_weights_are_loaded_in_place_and_drop_every_cached_prefix(engines, run, models):
    """The RL loop's weight update: same server, same process, other outputs; and back again."""
    a, _ = engines
    ids = context(7)
    pid = a.server.pid
    first = run(a.generate(decode_req(ids)))
    cached = run(a.generate(decode_req(ids)))
    assert cached.cached_tokens >= 256 and cached.token_ids == first.token_ids
    t0 = time.monotonic()
    run(a.load_weights(models[1]))
    took = time.monotonic() - t0
    try:
        other = run(a.generate(decode_req(ids)))
        assert other.cached_tokens == 0  # the prefix cache was reset with the weights
        assert other.logprobs != first.logprobs and other.token_ids != first.token_ids
    finally:
        run(a.load_weights(models[0]))
    back = run(a.generate(decode_req(ids)))
    assert back.cached_tokens == 0 and back.token_ids == first.token_ids
    assert back.logprobs == pytest.approx(first.logprobs, abs=1e-4)
    assert a.server.pid == pid  # in place: no restart
    print(f"[vllm] weights reloaded in place in {took:.2f} s")


def test_weights_from_shared_memory_change_the_output_as_the_disk_path_does(engines, run, models, tmp_path):
    """The in-memory sync (shared_weights.py, worker_ext.py) against reload_weights from disk: the same
    weights give the same greedy tokens and logprobs, whole or changed tensors only (one packed part
    of a fused layer and the final norm: its siblings travel with it, every other layer stays)."""
    from safetensors.torch import load_file

    from prorsa.api.weights import model_dir_for
    from prorsa.shared_weights import SharedRegion

    a, _ = engines
    ids = context(7)
    first = run(a.generate(decode_req(ids)))
    region = SharedRegion(tmp_path / "region")
    try:
        run(a.load_weights(models[1]))
        disk = run(a.generate(decode_req(ids)))
        run(a.load_weights(models[0]))
        sd = load_file(str(models[1] / "model.safetensors"))
        whole = run(a.load_shared(region.publish(sd.items())))
        shm = run(a.generate(decode_req(ids)))
        assert whole == {"tensors": len(sd), "bytes": sum(t.numel() * t.element_size() for t in sd.values())}
        assert shm.token_ids == disk.token_ids != first.token_ids and shm.cached_tokens == 0
        assert shm.logprobs == pytest.approx(disk.logprobs, abs=1e-5)

        q = "model.layers.0.self_attn.q_proj.weight"
        sd[q], sd["model.norm.weight"] = sd[q] * 1.5, -sd["model.norm.weight"]
        manifest = region.publish(sd.items())
        assert manifest.load == tuple(k for k in sd if k in (q, "model.norm.weight"))
        part = run(a.load_shared(manifest))
        assert part["tensors"] == 4 and part["bytes"] < whole["bytes"] / 4  # q, k, v and the norm
        changed = run(a.generate(decode_req(ids)))
        run(a.load_weights(model_dir_for(sd, models[1], tmp_path / "changed")))
        disk_changed = run(a.generate(decode_req(ids)))
        assert changed.token_ids == disk_changed.token_ids != shm.token_ids
        assert changed.logprobs == pytest.approx(disk_changed.logprobs, abs=1e-5)
    finally:
        region.unlink()
        run(a.load_weights(models[0]))
    assert run(a.generate(decode_req(ids))).token_ids == first.token_ids


def test_killed_server_is_detected_and_restarted(engines, run):
    """The request that finds the server gone fails (its turn is retried from token history) and
    restarts it at once; the next request waits for the restart instead of failing too."""
    a, b = engines
    ids = context(7)
    old_group = b.server.pid
    os.kill(old_group, signal.SIGKILL)  # the API server; its engine core and worker are orphaned
    with pytest.raises(EngineUnavailable):
        run(b.generate(decode_req(ids)))
    t0 = time.monotonic()
    again = run(b.generate(decode_req(ids)))  # waits for the restart the failure began
    print(f"[vllm] restart after kill -9: {time.monotonic() - t0:.1f} s")
    assert b.server.pid != old_group and again.token_ids == run(a.generate(decode_req(ids))).token_ids
    assert run(b.ensure_healthy()) is False  # healthy now: nothing to do
    with pytest.raises(ProcessLookupError):  # no orphan of the killed server is left
        os.killpg(old_group, 0)
    assert run(disaggregated(a, b, ids))[1].token_ids == run(a.generate(decode_req(ids))).token_ids
