"""The emulated engine: continuous batching, KV admission, prefix cache, KV pulls, time scaling,
and times that equal the cost model's predictions exactly on a virtual clock."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from prorsa.costmodel import CostModel
from prorsa.engine.base import DecodeRequest, Engine, PrefillRequest
from prorsa.engine.emulated import EmulatedEngine, KvMemory
from prorsa.roles import Role
from prorsa.sim.clock import run_virtual

EXACT = 1e-6


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.from_names("h200", "qwen3-8b")


def gen(traj: str, context: int, max_tokens: int, new: int | None = None) -> DecodeRequest:
    return DecodeRequest(traj, 0, context_tokens=context, max_tokens=max_tokens,
                         new_tokens=context if new is None else new)


def decode_sum(cost: CostModel, contexts: list[int], steps: int) -> float:
    return sum(cost.decode_time([c + i for c in contexts]) for i in range(steps))


async def started(cost: CostModel, role: Role = Role.MIXED, **kwargs) -> EmulatedEngine:
    engine = EmulatedEngine(kwargs.pop("engine_id", "e0"), role, cost,
                            slots=kwargs.pop("slots", 64), **kwargs)
    await engine.start()
    return engine


def test_is_an_engine(cost):
    engine = EmulatedEngine("e0", Role.MIXED, cost, slots=4)
    assert isinstance(engine, Engine) and engine.needs_token_ids is False


def test_virtual_clock_times_equal_the_cost_model(cost):
    async def main():
        engine = await started(cost)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await engine.generate(gen("a", 8000, 4000))
        await engine.stop()
        return result, loop.time() - t0, loop.timers_fired

    result, elapsed, events = run_virtual(main())
    prefill, decode = cost.prefill_time([(8000, 0)]), decode_sum(cost, [8000], 4000)
    assert result.prefill_s == pytest.approx(prefill, abs=EXACT)
    assert result.decode_s == pytest.approx(decode, abs=EXACT)
    assert result.queue_s == 0.0 and result.transfer_s == 0.0 and result.token_ids == ()
    assert elapsed == pytest.approx(prefill + decode, abs=EXACT) and elapsed > 15  # ~20 s of engine time
    # counted, not timed: the prefill step, then all 4000 decode steps slept through in one timer
    assert events == 2, events


def test_an_arrival_joins_at_the_next_step_boundary(cost):
    """A decodes alone; B arrives mid-step, waits for the step in flight, is prefilled in one
    mixed step co-batched with A's decode, then both decode together. Checked step by step."""
    arrive = 0.3

    async def main():
        engine = await started(cost)
        a = asyncio.ensure_future(engine.generate(gen("a", 1000, 400)))
        await asyncio.sleep(arrive)
        b = await engine.generate(gen("b", 1000, 50))
        return await a, b

    a, b = run_virtual(main())
    t = cost.prefill_time([(1000, 0)])
    a_ctx = 1000
    while t < arrive:  # A's steps up to the first boundary after the arrival
        t += cost.decode_time([a_ctx])
        a_ctx += 1
    b_queue = t - arrive
    t += cost.mixed_time([(1000, 0)], [a_ctx])
    b_prefill_end = t
    a_ctx += 1
    joint = decode_sum(cost, [a_ctx, 1000], 50)
    a_left = 400 - (a_ctx - 1000) - 50
    a_end = t + joint + decode_sum(cost, [a_ctx + 50], a_left)
    assert 0 < b_queue and b.queue_s == pytest.approx(b_queue, abs=EXACT)
    assert b.prefill_s == pytest.approx(b_prefill_end - arrive - b_queue, abs=EXACT)
    assert b.decode_s == pytest.approx(joint, abs=EXACT)
    assert a.decode_s == pytest.approx(a_end - cost.prefill_time([(1000, 0)]), abs=EXACT)


def test_concurrent_decodes_batch(cost):
    """16 decodes pulled from a prefill engine share every step: the batch takes about one
    sequence's time, far less than 16 in a row."""
    n, ctx, tokens = 16, 2000, 300
    kv = {"engine_id": "p0"}

    async def main():
        engine = await started(cost, role=Role.DECODE)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        results = await asyncio.gather(*[
            engine.decode(DecodeRequest(f"t{i}", 0, ctx, tokens, kv=kv)) for i in range(n)])
        batched = loop.time() - t0
        t0 = loop.time()
        for i in range(n):
            await engine.decode(DecodeRequest(f"s{i}", 0, ctx, tokens, kv=kv))
        return results, batched, loop.time() - t0

    results, batched, sequential = run_virtual(main())
    transfer = cost.kv_transfer_time(ctx)
    assert all(r.transfer_s == pytest.approx(transfer, abs=EXACT) for r in results)
    one_batch = decode_sum(cost, [ctx] * n, tokens)
    assert batched == pytest.approx(transfer + one_batch, abs=EXACT)
    assert batched < sequential / 8


def test_kv_admission_waits_for_memory(cost):
    async def main():
        engine = await started(cost, memory=KvMemory(1500))
        first = asyncio.ensure_future(engine.generate(gen("a", 1000, 100)))
        second = asyncio.ensure_future(engine.generate(gen("b", 1000, 100)))
        await asyncio.sleep(0.01)
        stats = engine.stats()
        with pytest.raises(ValueError, match="KV tokens"):
            await engine.generate(gen("c", 1500, 1))  # can never fit
        return await first, await second, stats

    first, second, stats = run_virtual(main())
    # admission held 1100 for "a" (its context and its decode), but only the context is written yet
    assert stats.queued == 1 and stats.active == 1 and stats.kv_tokens == 1000
    assert first.queue_s == 0.0
    assert second.queue_s == pytest.approx(first.prefill_s + first.decode_s, abs=EXACT)
    assert second.queue_s > 0


def test_slots_limit_admission(cost):
    async def main():
        engine = await started(cost, slots=1)
        return await asyncio.gather(engine.generate(gen("a", 100, 10)),
                                    engine.generate(gen("b", 100, 10)))

    first, second = run_virtual(main())
    assert second.queue_s == pytest.approx(first.prefill_s + first.decode_s, abs=EXACT)


def test_prefix_cache_serves_the_previous_context(cost):
    async def main():
        engine, other = await started(cost), await started(cost, engine_id="e1")
        first = await engine.prefill(PrefillRequest("a", 0, context_tokens=4000, new_tokens=4000))
        again = await engine.prefill(PrefillRequest("a", 1, context_tokens=4500, new_tokens=500))
        elsewhere = await other.prefill(PrefillRequest("a", 1, 4500, 500))
        stats = engine.stats()
        await engine.reset_prefix_cache()
        reset = await engine.prefill(PrefillRequest("a", 2, 5000, 500))
        return first, again, elsewhere, reset, stats

    first, again, elsewhere, reset, stats = run_virtual(main())
    assert first.cached_tokens == 0 and again.cached_tokens == 4000
    assert again.compute_s == pytest.approx(cost.prefill_time([(500, 4000)]), abs=EXACT)
    assert again.compute_s < first.compute_s / 3
    assert elsewhere.cached_tokens == 0 and reset.cached_tokens == 0
    assert stats.cached_tokens_total == 4000 and stats.prefill_tokens_total == 4500
    assert again.kv == {"engine_id": "e0", "traj_id": "a", "turn": 1, "tokens": 4500}


def test_decode_pulls_only_what_it_has_not_cached(cost):
    """A decode engine that served the previous turn holds that context: the next pull is a
    delta; a decode-local turn (kv=None) prefills only the new tokens."""
    async def main():
        prefiller, decoder = await started(cost, engine_id="p0"), await started(cost)
        p = await prefiller.prefill(PrefillRequest("a", 0, 3000, 3000))
        d0 = await decoder.decode(DecodeRequest("a", 0, 3000, 200, kv=p.kv))
        p = await prefiller.prefill(PrefillRequest("a", 1, 3700, 700))
        d1 = await decoder.decode(DecodeRequest("a", 1, 3700, 100, kv=p.kv))
        local = await decoder.decode(DecodeRequest("a", 2, 4300, 10, new_tokens=500))
        return d0, d1, local, decoder.stats()

    d0, d1, local, stats = run_virtual(main())
    assert d0.transfer_s == pytest.approx(cost.kv_transfer_time(3000), abs=EXACT)
    assert d1.cached_tokens == 3200 and d1.prefill_s == 0.0
    assert d1.transfer_s == pytest.approx(cost.kv_transfer_time(500), abs=EXACT)
    assert local.cached_tokens == 3800 and local.transfer_s == 0.0
    assert local.prefill_s == pytest.approx(cost.prefill_time([(500, 3800)]), abs=EXACT)
    assert stats.extra["transfers"] == 2 and stats.extra["transfer_tokens_total"] == 3500


def test_event_skipping_plans_once_per_finish(cost, monkeypatch):
    calls = []
    series = cost.decode_series
    monkeypatch.setattr(cost, "decode_series", lambda *a: calls.append(a) or series(*a))

    async def main():
        engine = await started(cost)
        await asyncio.gather(*[engine.generate(gen(f"t{i}", 500, 1000 + 100 * i))
                               for i in range(8)])
        return engine.stats()

    stats = run_virtual(main())
    assert len(calls) == 8  # one sleep per finishing sequence, not one per step
    assert stats.decode_tokens_total == sum(1000 + 100 * i for i in range(8))


def test_time_scale_zero_runs_1000_requests_without_waiting(cost, monkeypatch):
    # What the engine asks to wait is checked, not the wall clock: on a loaded host 1000
    # coroutines' scheduling alone can take over a second, which says nothing of the engine.
    # (Their wall time is measured by benchmarks/sim_speed.py --calls.)
    waits: list[float] = []
    sleep = asyncio.sleep

    def recorded(delay, *args, **kwargs):
        waits.append(delay)
        return sleep(delay, *args, **kwargs)

    async def main():
        engine = await started(cost, time_scale=0.0)
        monkeypatch.setattr(asyncio, "sleep", recorded)
        results = await asyncio.gather(*[engine.generate(gen(f"t{i}", 200 + i, 20 + i % 7))
                                         for i in range(1000)])
        stats = engine.stats()
        # An idle engine waits to be woken; a spinning one would go round its step loop (and
        # yield through asyncio.sleep) again and again while the test sleeps.
        busy = len(waits)
        steps = []
        admit = engine._batch.admit
        engine._batch.admit = lambda now: steps.append(now) or admit(now)
        await sleep(0.2)
        idle = len(waits) - busy, len(steps)
        monkeypatch.setattr(asyncio, "sleep", sleep)
        await engine.stop()
        return results, stats, idle

    results, stats, idle = asyncio.run(main())
    assert waits and max(waits) == 0.0  # only yields between steps, never modelled time
    assert [r.n_tokens for r in results] == [20 + i % 7 for i in range(1000)]
    assert stats.decode_tokens_total == sum(20 + i % 7 for i in range(1000))
    assert idle == (0, 0)


def test_time_scale_shrinks_wall_time(cost):
    # On a virtual clock what the engine waits is exact; on the real one a loaded host only
    # makes timers fire late, which says nothing of the scale.
    async def main():
        engine = await started(cost, time_scale=0.01)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await engine.generate(gen("a", 2000, 200))  # ~1 s of modelled time
        return result, loop.time() - t0

    result, waited = run_virtual(main())
    modelled = cost.prefill_time([(2000, 0)]) + decode_sum(cost, [2000], 200)
    assert result.prefill_s + result.decode_s == pytest.approx(modelled * 0.01, rel=1e-9)
    assert waited == pytest.approx(modelled * 0.01, rel=1e-9)


def test_set_role_is_bookkeeping_and_held_work_finishes(cost):
    async def main():
        engine = await started(cost, role=Role.DECODE)
        work = asyncio.ensure_future(engine.generate(gen("a", 1000, 500)))
        await asyncio.sleep(0.5)
        engine.set_role(Role.PREFILL)
        during = engine.stats()
        return during, await work, engine.stats()

    during, result, after = run_virtual(main())
    assert during.role is Role.PREFILL and during.active == 1 and 1000 < during.kv_tokens < 1500
    assert result.n_tokens == 500 and after.role is Role.PREFILL and after.active == 0
    assert after.kv_capacity == cost.kv_capacity_tokens()


def test_kv_tokens_count_what_is_written_never_the_length_to_come(cost):
    """Two engines given the same turn, one replaying a 300-token decode and one 3,000: until the
    shorter ends they report the same KV, the context and the tokens decoded so far (counted to
    the step in flight, inside one skipped decode stretch); the replayed length is the world's."""
    async def main():
        short, long_ = await started(cost, engine_id="short"), await started(cost, engine_id="long")
        ctx = 2000
        runs = [asyncio.ensure_future(e.generate(replace(gen("a", ctx, 4096), replay_tokens=n)))
                for e, n in ((short, 300), (long_, 3000))]
        seen = []
        for t in (0.1, 0.5, 1.0, 2.0):
            await asyncio.sleep(t - asyncio.get_running_loop().time())
            seen.append((short.load().kv_tokens, long_.load().kv_tokens, short.stats().kv_tokens))
        done = await runs[0]
        after = (short.load().kv_tokens, long_.load().kv_tokens)
        await runs[1]
        return ctx, seen, done, after

    ctx, seen, done, after = run_virtual(main())
    assert done.n_tokens == 300
    for a, b, stats in seen:
        assert a == b == stats
    grown = [a - ctx for a, _, _ in seen]
    assert 0 < grown[0] < grown[1] < grown[2] < grown[3] < 300  # one stretch: the batch holds one decode
    assert after == (0, ctx + 300)  # the short one has ended; the long one is as far and goes on


def test_cancelled_request_frees_its_slot(cost):
    async def main():
        engine = await started(cost, slots=1)
        first = asyncio.ensure_future(engine.generate(gen("a", 1000, 1000)))
        second = asyncio.ensure_future(engine.generate(gen("b", 100, 10)))
        await asyncio.sleep(0.5)
        first.cancel()
        result = await second
        return result, engine.stats()

    result, stats = run_virtual(main())
    assert 0.5 <= result.queue_s < 0.6  # admitted at the first step boundary after the cancel
    assert stats.active == 0 and stats.kv_tokens == 0


def test_stop_fails_pending_requests_and_unstarted_engines_refuse(cost):
    async def main():
        engine = await started(cost, slots=1)
        pending = asyncio.ensure_future(engine.generate(gen("a", 1000, 1000)))
        await asyncio.sleep(0.1)
        await engine.stop()
        with pytest.raises(RuntimeError, match="stopped"):
            await pending
        assert engine.stats().kv_tokens == 0 and engine.stats().active == 0
        with pytest.raises(RuntimeError, match="not started"):
            await engine.generate(gen("b", 10, 1))

    run_virtual(main())


def test_random_mix_drains_and_releases_everything(cost):
    """Prefill/decode pairs, colocated turns, tool waits and cancellations across engines: every
    surviving trajectory finishes and every engine ends empty (no leaked slots or KV)."""
    rng = random.Random(7)

    async def main():
        engines = [await started(cost, engine_id=f"e{i}", slots=8, memory=KvMemory(60_000))
                   for i in range(3)]

        async def trajectory(t: int) -> int:
            ctx = 0
            for turn in range(rng.randint(1, 5)):
                new = rng.randint(50, 3000)
                ctx += new
                await asyncio.sleep(rng.random())  # the tool
                p, d = rng.choice(engines), rng.choice(engines)
                if rng.random() < 0.5:
                    kv = (await p.prefill(PrefillRequest(f"t{t}", turn, ctx, new))).kv
                    r = await d.decode(DecodeRequest(f"t{t}", turn, ctx, rng.randint(1, 500),
                                                     kv=kv))
                else:
                    r = await d.generate(DecodeRequest(f"t{t}", turn, ctx, rng.randint(1, 500),
                                                       new_tokens=new))
                ctx += r.n_tokens
            return ctx

        tasks = [asyncio.ensure_future(trajectory(t)) for t in range(120)]
        await asyncio.sleep(3.0)
        for task in tasks[::10]:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return results, [e.stats() for e in engines]

    results, stats = run_virtual(main())
    assert sum(isinstance(r, int) for r in results) >= 108
    assert not [r for r in results if isinstance(r, Exception)]  # cancellations are not
    for s in stats:
        assert (s.queued, s.active, s.kv_tokens) == (0, 0, 0)
        assert s.decode_tokens_total > 0 and s.prefill_tokens_total > 0


def test_a_lower_priority_key_overtakes_the_queue_and_equal_keys_keep_their_order(cost):
    """One slot: the first request runs; of the queued ones, the lowest key goes next, and among
    equal keys the first sent (a vLLM engine with --scheduling-policy priority does the same)."""
    async def main():
        engine = await started(cost, slots=1)
        order: list[str] = []

        async def send(traj: str, priority: float) -> None:
            await engine.generate(DecodeRequest(traj, 0, context_tokens=100, max_tokens=50, new_tokens=100,
                                                priority=priority))
            order.append(traj)

        tasks = []
        for traj, priority in [("first", 0.0), ("a", 5.0), ("b", 5.0), ("urgent", -3.0), ("c", 5.0)]:
            tasks.append(asyncio.ensure_future(send(traj, priority)))
            await asyncio.sleep(0)  # sent in this order
        await asyncio.gather(*tasks)
        await engine.stop()
        return order

    assert run_virtual(main()) == ["first", "urgent", "a", "b", "c"]


def test_without_priorities_the_queue_is_first_come():
    from prorsa.engine.batching import Batcher, SeqState

    b = Batcher(slots=1, kv_capacity=10_000)
    seqs = [SeqState(f"t{i}", reserve=10, prefill_left=0, prefix=0, decode_left=5) for i in range(5)]
    for s in seqs:
        b.submit(s)
    assert list(b.waiting) == seqs
    late = SeqState("late", reserve=10, prefill_left=0, prefix=0, decode_left=5, priority=-1.0)
    b.submit(late)
    assert b.waiting[0] is late and list(b.waiting)[1:] == seqs
