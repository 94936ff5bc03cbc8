"""The tail's layout: its prices (known answers from the cost model), when it fires, and what the
scheduler tells it about the trajectories in flight."""

from __future__ import annotations

import pytest

from prorsa.control.tail import RemainingWork, TurnScheduler
from prorsa.control.tail_layout import MIN_GAIN, Left, TailLayout
from prorsa.costmodel import CostModel
from tests.control.test_tail import Turn


@pytest.fixture(scope="module")
def layout() -> TailLayout:
    return TailLayout(CostModel.from_names("h200", "qwen3-8b"), engines=8, slots=32)


def test_widths_stay_in_one_nvlink_domain_and_divide_the_kv_heads(layout):
    assert layout.widths() == [2, 4, 8]
    assert TailLayout(CostModel.from_names("h200", "qwen3-8b", tp=4), 8, 32).widths() == [2]  # TP8 at most
    assert TailLayout(CostModel.from_names("h200", "qwen3-8b"), 3, 32).widths() == [2]  # no more engines than that
    # an EP16 group already spans two nodes: nothing to merge it with inside one
    assert TailLayout(CostModel.from_names("h200", "qwen3-30b-a3b", ep=16), 8, 32).widths() == []


def test_a_wider_layout_steps_faster_at_batch_1(layout):
    # Qwen3-8B on H200, a 10k context alone: the figures the tail-scheduling note quotes
    ms = [1e3 * (layout.cost if f == 1 else layout.wide_cost(f)).decode_token_time(10_000, 1) for f in (1, 2, 4, 8)]
    assert ms == pytest.approx([7.33, 5.88, 4.80, 4.26], abs=0.01)


def test_prices_known_answers(layout):
    left = [Left(4000, 10_000, 3)] * 4
    c, w2 = layout.cost, layout.wide_cost(2)
    # as it stands: four trajectories over eight engines, each alone, 4000 tokens at 12k context
    assert layout.stay(left) == pytest.approx(4000 * c.decode_token_time(12_000, 1))
    assert layout.stay(left) == pytest.approx(29.61, abs=0.01)
    # widen: weights moved (TP1 -> TP2), the context re-prefilled at TP2, then each alone at TP2
    assert layout.price(left, 2, 4) == pytest.approx(
        c.reshard_time(w2) + w2.prefill_time([(10_000, 0)]) + 4000 * w2.decode_token_time(12_000, 1))
    assert layout.price(left, 2, 4) == pytest.approx(23.88, abs=0.01)
    # two trajectories sharing a wide engine each gain a token a step of their batch of two
    assert layout.price(left, 2, 2) == pytest.approx(
        c.reshard_time(w2) + w2.prefill_time([(10_000, 0)]) + 4000 * 2 * w2.decode_token_time(12_000, 2))
    # all-decode: the same steps plus a KV transfer of the context at every turn left
    assert layout.all_decode(left) == pytest.approx(layout.stay(left) + 3 * c.kv_transfer_time(10_000))


def test_it_picks_the_fastest_layout_the_idle_engines_allow(layout):
    left = [Left(4000, 10_000, 3)] * 4
    p = layout.plan(left, idle=4)
    assert (p.kind, p.width, p.wide) == ("widen", 4, 1)  # one TP4 engine at batch 4 beats two TP2 at batch 2
    assert p.tail_s == pytest.approx(layout.price(left, 4, 1))
    assert layout.plan(left, idle=8).width == 8
    assert layout.plan(left, idle=1) is None  # no engine to merge with
    assert layout.plan(left, idle=2).width == 2


def test_it_never_fires_while_many_trajectories_remain(layout):
    # more than half the engines' count still in flight: the engines batch them usefully
    for n in (5, 8, 64, 256):
        assert layout.plan([Left(4000, 10_000, 3)] * n, idle=8) is None
    assert layout.plan([], idle=8) is None


def test_it_does_not_fire_for_a_gain_below_the_margin(layout):
    # a short remainder: the weight move and the re-prefill eat what a wider step saves
    left = [Left(8, 20_000, 1)]
    p_wide = min(layout.price(left, f, 1) for f in layout.widths())
    assert p_wide > (1 - MIN_GAIN) * layout.stay(left)
    assert layout.plan(left, idle=8) is None


def test_the_scheduler_counts_every_trajectory_from_its_first_turn():
    s = TurnScheduler(RemainingWork(max_turns=12, decode_prior=500), tail=True)
    for i in range(3):
        s.began(Turn(0, traj_id=f"t{i}", context_tokens=1000))
    assert [tid for tid, _ in s.in_flight()] == ["t0", "t1", "t2"]  # none ended a turn: all counted
    s.ended(Turn(0, traj_id="t1", context_tokens=1000), 400, 4.0)
    left = dict(s.in_flight())
    assert left["t1"].context == 1400  # its context after the decode
    s.ended(Turn(0, traj_id="t0", context_tokens=1000, done=True), 300, 3.0)
    assert sorted(tid for tid, _ in s.in_flight()) == ["t1", "t2"]  # an ended trajectory leaves


def test_the_scheduler_keeps_nothing_with_the_tail_layout_off():
    s = TurnScheduler(RemainingWork(max_turns=12), priority=True)
    s.began(Turn(0))
    assert s.in_flight() == []
