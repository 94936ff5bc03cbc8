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
    assert p.wait_s("prefill", 0, 4000, 0) == pytest.approx(2.0)
    assert p.wait_s("decode", 0, 4000, 0) == 0.0  # a decode leg waits on no prefill backlog
    # 3 turns of 1,000 KV tokens: a 4th is admitted at once and decodes in a batch of 4, 2 a
    # rank (22 ms a step against 21 ms alone), 100 tokens long
    assert p.wait_s("decode", 3, 4000, 3000) == pytest.approx(0.1)
    # 20 turns on 8 slots: the 21st waits 13/8 waves of full batches (4 a rank, 24 ms a step)
    assert p.wait_s("decode", 20, 0, 20_000) == pytest.approx(100 * (2.625 * 0.024 - 0.021))
    # KV, not slots, bounds admission when contexts are long: 20,000 tokens hold 2 of 10,000
    assert p.wait_s("decode", 4, 0, 40_000) == pytest.approx(100 * (2.5 * 0.021 - 0.021))


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


class ReadCost(PaperCost):
    """PaperCost whose step also reads: + 1 us an attention unit + 0.1 us a KV token read, on `ep`
    ranks."""

    def __init__(self, ep: int = 1):
        self.ep = ep

    def step_time(self, tokens, seqs, attn_units, kv_read_tokens):
        return 0.02 + 1e-3 * seqs + 1e-6 * attn_units + 1e-7 * kv_read_tokens


def test_a_backlog_waits_its_tokens_over_the_rate_to_the_second_and_its_fraction():
    # 3,000 tokens at 2,000 tokens/s: 1.5 s, not the whole seconds of it
    assert price().wait_s("prefill", 0, 3000, 0) == pytest.approx(1.5)


def test_a_turn_longer_than_the_kv_is_still_admitted_alone():
    # one 30,000-token sequence on 20,000 tokens of KV: the engine admits one at a time (not
    # none), so the new turn waits one whole decode of it: 100 tokens at 21 ms a step
    assert price().wait_s("decode", 1, 0, 30_000) == pytest.approx(100 * 0.021)


def test_a_bigger_batch_is_slower_by_what_it_reads():
    """One rank (a dense engine). A turn joining one other at 1,000 tokens decodes 100 tokens in a
    batch of 2 (20 + 2 ms + 2 x 1,000.5 attention units + 2,000 KV tokens read: 24.201 ms a step)
    instead of alone (20 + 1 + 1.0005 + 0.1 = 22.1005 ms)."""
    p = MoveCost(ReadCost(ep=1), slots=8, decode_tokens=100)
    assert p.wait_s("decode", 1, 0, 1000) == pytest.approx(100 * (0.024201 - 0.0221005))
    # two ranks: the 2 split 1 a rank, a step as fast as alone, and KV is 2 x 10,000 tokens
    q = MoveCost(ReadCost(ep=2), slots=8, decode_tokens=100)
    assert q.wait_s("decode", 1, 0, 1000) == 0.0
    # 3 on 2 ranks at 10,000 tokens: 2 fit the KV, the 4th waits (4 - 2) / 2 waves of batches of
    # 2 (1 a rank: 20 + 1 + 10.0005 + 1 ms = 32.0005 ms), one whole decode more than alone
    step = 0.02 + 1e-3 + 10_000.5e-6 + 1e-3
    assert q.wait_s("decode", 3, 0, 30_000) == pytest.approx(100 * (2 * step - step))


def _paper_router(roles, **kw) -> Router:
    return Router(roles, overload="cost", slots=8, move_cost=price(), clock=lambda: 0.0, **kw)


def test_the_cost_rule_moves_a_recompute_only_for_more_than_it_adds_with_its_stall():
    """Two mixed engines; t0 last ran on e0. Its next turn (100 tokens on 1,000 cached) would
    recompute 1,100 tokens on e1 (0.9 s more than its append, and as much again for each sequence
    the recompute stalls there)."""
    def again(load0, kv0, load1, kv1):
        r = _paper_router({"e0": Role.MIXED, "e1": Role.MIXED})
        r.finished(r.route("t0"))
        r.load.update(e0=load0, e1=load1)
        r._kv.update(e0=kv0, e1=kv1)
        return r.route("t0", appended=100, context=1000).decode

    # staying: 11 turns of 1,000 KV tokens on 8 slots, the 12th waits half a wave of full batches
    # (4 a rank, 24 ms a step), then decodes in one instead of alone (21 ms):
    # 100 x (1.5 x 0.024 - 0.021) = 1.5 s. Moving to e1, decoding 1: a batch of 2 (1 a rank) is no
    # slower, but the recompute stalls that one: 0.9 x 2 = 1.8 s. It stays.
    assert again(11, 11_000, 1, 1000) == "e0"
    # with e1 idle the move is the recompute alone, 0.9 s < 1.5 s
    assert again(11, 11_000, 0, 0) == "e1"
    # past its 8 slots an engine stalls 8 sequences, not all it holds: e1 with 9 turns waits
    # 100 x (1.25 x 0.024 - 0.021) = 0.9 s, and its move adds 0.9 x 9 = 8.1 s: 9.0 s against
    # staying on e0 with 37 (100 x (4.75 x 0.024 - 0.021) = 9.3 s). It moves.
    assert again(37, 37_000, 9, 9000) == "e1"


def test_the_cost_rule_adds_a_prefill_queue_to_the_recompute():
    """Disaggregated: t0's prefill engine p0 has 4,000 tokens ahead (2 s). p1 with 2,000 (1 s)
    plus the 0.9 s recompute is 1.9 s: it moves; p1 with 2,400 (1.2 s + 0.9 s = 2.1 s): it stays."""
    for other, where in ((2000.0, "p1"), (2400.0, "p0")):
        r = _paper_router({"p0": Role.PREFILL, "p1": Role.PREFILL, "d": Role.DECODE})
        first = r.route("t0")
        r.finished(first)
        assert first.prefill == "p0"
        r._backlog.update(p0=4000.0, p1=other)
        assert r.route("t0", appended=100, context=1000).prefill == where, other
