"""The emulated engine's prefix cache: ideal keeps every context, LRU only what fits beside the
running requests, dropping the least recently used idle context first."""

from __future__ import annotations

import pytest

from prorsa.costmodel import CostModel
from prorsa.engine.base import DecodeRequest
from prorsa.engine.emulated import EmulatedEngine, KvMemory
from prorsa.engine.prefix_cache import LruCache, make_prefix_cache
from prorsa.roles import Role
from prorsa.sim.clock import run_virtual


def test_lru_drops_the_least_recently_used_idle_context():
    c = LruCache(capacity=1000)
    c.put("a", 400, used=0)
    c.put("b", 400, used=0)
    assert c.take("a", used=0) == 400  # a runs again: out of the cache while it runs
    c.put("a", 500, used=0)  # back, now the most recent; b is older
    c.put("c", 300, used=0)  # 400 + 500 + 300 > 1000: b goes
    assert c.take("b", used=0) == 0 and c.evicted_tokens == 400
    assert c.take("a", used=600) == 0  # a running request needs 600: idle a (500) and c cannot both stay
    assert c.tokens <= 1000 - 600


def test_ideal_forgets_nothing_and_bad_kinds_are_refused():
    c = make_prefix_cache("ideal", 10)
    c.put("a", 10**9, used=10**9)
    assert c.take("a", used=10**9) == 10**9
    with pytest.raises(ValueError, match="ideal' or 'lru"):
        make_prefix_cache("fifo", 10)


def test_an_evicted_context_is_prefilled_again():
    """Three trajectories take turns on an engine that can hold two idle contexts: with LRU the
    oldest has been dropped when it returns, and its whole context is prefilled again."""
    cost = CostModel.from_names("h200", "qwen3-8b")

    async def main(kind):
        e = EmulatedEngine("e", Role.MIXED, cost, slots=4, memory=KvMemory(9000, kind))
        await e.start()
        for traj in ("a", "b", "c"):
            await e.generate(DecodeRequest(traj, 0, context_tokens=3000, max_tokens=10, new_tokens=3000))
        again = await e.generate(DecodeRequest("a", 1, context_tokens=3110, max_tokens=10, new_tokens=100))
        await e.stop()
        return again.cached_tokens

    assert run_virtual(main("ideal")) == 3010
    assert run_virtual(main("lru")) == 0
