"""The move cost's prices, checked against answers worked by hand on a cost model simple enough
to price on paper (a direction alone lets a sign or a unit error through)."""

from __future__ import annotations

import math

import pytest

from prorsa.roles import Role
from prorsa.rollout.placement import MoveCost
from prorsa.rollout.router import Router


class PaperCost:
    """prefill: 1 ms a token plus 1 us per token per cached token; a KV pull: 10 ms + 10 us a
    token; a step: 20 ms + 1 ms a sequence; 2 ranks of 10,000 KV tokens each."""

    ep = 2

    def prefill_time(self, chunks):
        return sum(1e-3 * n + 1e-6 * n * ctx for n, ctx in chunks)

    def kv_transfer_time(self, tokens):
        return 0.01 + 1e-5 * tokens

    def kv_capacity_tokens(self):
        return 10_000

    def step_time(self, tokens, seqs, attn_units, kv_read_tokens):
        return 0.02 + 1e-3 * seqs


def price(**kw) -> MoveCost:
    return MoveCost(PaperCost(), slots=8, decode_tokens=100, **kw)


def test_what_a_move_adds():
    p = price()
    # a decode leg pulls the whole context instead of the append: 1,000 tokens more at 10 us
    assert p.move_s("decode", 1000, 100) == pytest.approx(0.01)
    # a prefill leg recomputes 1,100 tokens (1.1 s) instead of 100 on 1,000 cached (0.1 + 0.1 s)
    assert p.move_s("prefill", 1000, 100) == pytest.approx(0.9)
    # whole, on an engine decoding 3 others: the recompute stalls each of them as long
    assert p.move_s("whole", 1000, 100, stalled=3) == pytest.approx(3.6)
    assert p.move_s("whole", 0, 100, stalled=3) == 0.0  # nothing cached: nothing to lose


def test_what_a_queue_costs():
    p = price()
    # every rank's 8,192-token budget in one step: 16,384 tokens per 8.192 s
    assert p.prefill_rate == pytest.approx(2000.0)
    assert p.wait_s("prefill", 0, 4000, 0, 1000) == pytest.approx(2.0)
    assert p.wait_s("decode", 0, 4000, 0, 1000) == 0.0  # a decode leg waits on no prefill backlog
    # 3 turns of 1,000 KV tokens: a 4th is admitted at once and decodes in a batch of 4, 2 a
    # rank (22 ms a step against 21 ms alone), 100 tokens long
    assert p.wait_s("decode", 3, 4000, 3000, 1000) == pytest.approx(0.1)
    # 20 turns on 8 slots: the 21st waits 13/8 waves of full batches (4 a rank, 24 ms a step)
    assert p.wait_s("decode", 20, 0, 20_000, 1000) == pytest.approx(100 * (2.625 * 0.024 - 0.021))
    # KV, not slots, bounds admission when contexts are long: 20,000 tokens hold 2 of 10,000
    assert p.wait_s("decode", 4, 0, 40_000, 1000) == pytest.approx(100 * (2.5 * 0.021 - 0.021))


def test_a_turns_kv_and_the_learned_decode():
    p = price()
    assert p.turn_kv(1000, 100) == 1200
    for _ in range(8):
        p.learn(200)
    assert p.decode_tokens == pytest.approx(150.0)  # the prior's 100 is worth 8 decodes
    assert p.turn_kv(1000, 100) == 1250


def test_the_router_teaches_its_move_cost():
    p = price()
    r = Router({"e0": Role.MIXED}, overload="cost", move_cost=p, clock=lambda: 0.0)
    r.decoded(900)
    assert p.decode_tokens == pytest.approx((8 * 100 + 900) / 9)
    plain = Router({"e0": Role.MIXED}, overload=2.0)
    plain.decoded(900)  # no cost rule: nothing to learn, nothing raised
    assert plain.move_cost is None and not math.isnan(p.decode_tokens)
