"""The forecaster: demand ahead of the events, decode occupancy, its error book, its caches.

The streams here are built by hand so the right forecast is known: constant tool latencies and
decode lengths make every empirical distribution a single point.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prorsa.control.forecast import Forecaster
from prorsa.control.lifecycle import LifecycleEvent, LifecycleTracker, Phase

E = LifecycleEvent


def shrunk(hits: float, n: float, prior: float, w: float = 4.0) -> float:
    """The forecaster's estimate of a probability: family counts over pooled over the prior."""
    pooled = (hits + w * prior) / (n + w)  # every family here is the only one: pool == family
    return (hits + w * pooled) / (n + w)


H0 = shrunk(0, 20, 0.2)  # P(turn 0 is the last) after train(): 20 turn-0s, all went on
VIA = shrunk(0, 20, 0.5)  # share of ends reported after a TOOL phase: train() ends after decodes
ON = 1 - H0 * VIA / (1 - H0 * (1 - VIA))  # P(another turn | in TOOL at turn 0)


def feed(fc: Forecaster, tr: LifecycleTracker, events: list[LifecycleEvent]) -> None:
    for ev in events:
        fc.observe(ev)
        tr.apply(ev)


def train(n: int = 20, tool_s: float = 1.2, obs: int = 100, dec: int = 100, fam: str = "f") -> list[E]:
    """n two-turn trajectories, all alike: 0.1 s to start decoding, `dec` tokens at 100 tok/s,
    a `tool_s` tool, an `obs`-token observation, a last turn like the first."""
    out = []
    d = dec / 100.0
    for i in range(n):
        tid = f"train-{i}"
        out += [E(0.0, tid, fam, 0, Phase.QUEUED, 500), E(0.1, tid, fam, 0, Phase.DECODE, 0, 0),
                E(0.1 + d, tid, fam, 0, Phase.TOOL, dec, 0)]
        t = 0.1 + d + tool_s
        out += [E(t, tid, fam, 1, Phase.QUEUED, obs, 500 + dec), E(t + 0.1, tid, fam, 1, Phase.DECODE),
                E(t + 0.1 + d, tid, fam, 1, Phase.DONE, dec)]
    return sorted(out, key=lambda e: e.time_s)


def test_learned_statistics():
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(tool_s=1.2))
    assert fc.decode_rate() == pytest.approx(100.0)
    v = fc._view("f")
    assert v.tool == pytest.approx([1.2] * 20) and v.obs_mean == 100 and v.dec_mean == 100
    # 20 turn-0s went on, 20 turn-1s ended; the prior hazard (0.2) shrinks them.
    assert v.hazard[0] == pytest.approx(shrunk(0, 20, 0.2))
    assert v.hazard[1] == pytest.approx(shrunk(20, 20, 0.2))
    assert v.hazard[5] == pytest.approx(0.2) and v.tool_on[0] == pytest.approx(ON)
    # A family never seen borrows the pooled statistics.
    assert fc._view("unknown").tool == pytest.approx(v.tool)


def test_tool_burst_shows_up_in_the_right_bin_before_any_prefill():
    """100 trajectories entered TOOL 0.6 s ago; tools take 2.3 s: their 1000-token observations
    come back in 1.7 s, the bin [1.5, 2.0) (not 2.3 s: the time already spent counts)."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(tool_s=2.3, obs=1000))
    burst = []
    for i in range(100):
        tid = f"b{i}"
        burst += [E(10.3, tid, "f", 0, Phase.QUEUED, 500), E(10.4, tid, "f", 0, Phase.DECODE),
                  E(11.4, tid, "f", 0, Phase.TOOL, 100)]
    feed(fc, tr, burst)
    f = fc.predict(12.0, tr)
    assert tr.counts()["tool"] == 100 and tr.counts()["queued"] == 0  # no prefill event yet
    assert int(np.argmax(f.prefill_tokens_per_s)) == 3
    on = ON
    assert f.prefill_tokens_per_s[3] == pytest.approx(100 * 1000 * on / 0.5)
    assert f.prefill_tokens_per_s[:3].sum() == 0 and f.prefill_tokens_per_s[4:].sum() == 0
    assert f.prefill_turns_per_s[3] * f.bin_s == pytest.approx(100 * on)
    # They decode after the 0.1 s wait, 1 s long: bins whose middle falls in [1.9, 2.9).
    assert f.decode_seqs == pytest.approx(np.array([0, 0, 0, 0, 1, 1, 0, 0]) * 100 * on)


def test_a_body_that_reports_tool_before_done_is_understood():
    """Some bodies report every decode's end as TOOL and the end as DONE after it. Single-turn
    trajectories reported that way: a trajectory in TOOL at turn 0 will not come back."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    one_turn = []
    for i in range(40):
        tid = f"s{i}"
        one_turn += [E(0.0, tid, "f", 0, Phase.QUEUED, 500), E(0.1, tid, "f", 0, Phase.DECODE),
                     E(1.1, tid, "f", 0, Phase.TOOL, 100), E(1.2, tid, "f", 0, Phase.DONE)]
    feed(fc, tr, one_turn)
    v = fc._view("f")
    assert v.hazard[0] == pytest.approx(shrunk(40, 40, 0.2)) and v.tool_on[0] < 0.01
    feed(fc, tr, [E(5.0, "late", "f", 0, Phase.DECODE), E(6.0, "late", "f", 0, Phase.TOOL, 100)])
    assert fc.predict(6.0, tr).prefill_tokens_per_s.sum() < 0.01 * 500 / 0.5


def test_decoding_trajectories_occupy_bins_until_their_expected_end():
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(dec=600))  # decodes take 6 s at 100 tok/s
    feed(fc, tr, [E(4.0, "long", "f", 0, Phase.DECODE, context=0),  # 1 s in: runs all horizon
                  E(-0.5, "ending", "f", 0, Phase.DECODE, context=0)])  # 5.5 s in: ends at +0.5
    f = fc.predict(5.0, tr)
    # "ending" then calls a 1.2 s tool (with P(another turn)) and decodes again from ~+1.35 s
    # (an end in bin 0 and an arrival in bin 2 are both placed mid-bin).
    again = 1 - H0
    assert f.decode_seqs == pytest.approx([2, 1, 1] + [1 + again] * 5)
    assert f.decode_remaining_tokens == pytest.approx((500 + 50) / 2)
    assert f.backlog_tokens == 0 and f.live == 2


def test_queued_turns_are_backlog():
    fc, tr = Forecaster(2.0, 0.5), LifecycleTracker()
    feed(fc, tr, [E(0.0, "a", "f", 0, Phase.QUEUED, 800), E(0.0, "b", "f", 3, Phase.PREFILL, 200, 5000)])
    f = fc.predict(0.0, tr)
    assert (f.backlog_tokens, f.backlog_turns, f.backlog_fresh_turns) == (1000, 2, 1)
    assert f.prefill_prefix_tokens == pytest.approx(2500)  # only the queued turns weigh in


def test_error_book_known_answer():
    """One forecast at t = 10 of 10 tool returns at 11.2 (bin [1, 1.5)); only 5 come back then,
    the rest after the horizon. Realised prefill there: 5 x 100 tokens / 0.5 s = 1000 tok/s.
    Realised decodes: 5 sequences over [11.3, 12.3): 2, 5 and 3 on average in bins 2, 3, 4."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(tool_s=1.2))
    stream = []
    for i in range(10):
        tid = f"x{i}"
        stream += [E(9.0, tid, "f", 0, Phase.QUEUED, 500), E(9.1, tid, "f", 0, Phase.DECODE),
                   E(10.0, tid, "f", 0, Phase.TOOL, 100)]
    feed(fc, tr, stream)
    f = fc.predict(10.0, tr)
    back = []
    for i in range(10):
        t = 11.2 if i < 5 else 14.6
        tid = f"x{i}"
        back += [E(t, tid, "f", 1, Phase.QUEUED, 100, 600), E(t + 0.1, tid, "f", 1, Phase.DECODE),
                 E(t + 1.1, tid, "f", 1, Phase.DONE, 100)]
    feed(fc, tr, [e for e in sorted(back, key=lambda e: e.time_s) if e.time_s <= 14.5])
    assert fc.errors() == {}  # the horizon (and a bin of grace) has not passed yet
    fc.predict(14.5, tr)
    err = fc.errors()
    pred = f.prefill_tokens_per_s[2]
    assert pred == pytest.approx(10 * 100 / 0.5 * ON)
    want = {"prefill_tps@1-1.5s": abs(pred - 1000) / 1000}
    # the baselines repeat [9.5, 10): no returns (0 tok/s: off by all of it), 10 decoding
    want |= {"prefill_tps_persistence@1-1.5s": 1.0, "prefill_tps_ewma@1-1.5s": 1.0}
    for j, actual in ((2, 2.0), (3, 5.0), (4, 3.0)):
        lo, hi = j * 0.5, (j + 1) * 0.5
        want[f"decode_seqs@{lo:g}-{hi:g}s"] = abs(f.decode_seqs[j] - actual) / actual
        for base in ("persistence", "ewma"):  # the first forecast's EWMA is its persistence
            want[f"decode_seqs_{base}@{lo:g}-{hi:g}s"] = abs(10 - actual) / actual
    # nothing scored before it: the forecast is the lifecycle model's own, scored beside it too
    want |= {k.replace("@", "_lifecycle@"): v for k, v in want.items()
             if k.split("@")[0] in ("prefill_tps", "decode_seqs")}
    assert err == pytest.approx(want)


def test_the_ewma_baseline_weighs_the_last_bins():
    from prorsa.control.forecast_stats import EWMA_ALPHA, ErrorBook

    book = ErrorBook(n_bins=2, bin_s=1.0, window=8)
    for k, t in enumerate((0.2, 0.4)):  # 2 returns of 100 tokens in [0, 1): 200 tok/s
        book.arrival(t, 100)
    book.remember(1.0, np.zeros(2), np.zeros(2))
    book.arrival(1.5, 100)  # 100 tok/s in [1, 2)
    book.remember(2.0, np.zeros(2), np.zeros(2))
    (_, first), (_, second) = book._pending
    ewma = {m: p for m, _, p in second}["prefill_tps_ewma"]
    assert {m: p for m, _, p in first}["prefill_tps_ewma"] == pytest.approx([200, 200])
    assert ewma == pytest.approx([EWMA_ALPHA * 100 + (1 - EWMA_ALPHA) * 200] * 2)
    assert {m: p for m, _, p in second}["prefill_tps_persistence"] == pytest.approx([100, 100])


def test_predict_at_1024_trajectories_with_warm_caches_says_what_a_fresh_forecaster_says():
    # How long predict takes at this size is benchmarks/controller_cost.py --predict (CPU time
    # against a 5 ms target); here, that what its caches keep between calls changes nothing.
    def tracked() -> tuple[Forecaster, LifecycleTracker]:
        fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
        feed(fc, tr, train())
        rng = np.random.default_rng(1)
        phases = [Phase.QUEUED, Phase.PREFILL, Phase.DECODE, Phase.TOOL]
        fams = ["swe", "search", "math-tir", "terminal", "f"]
        feed(fc, tr, [E(float(rng.uniform(0, 10)), f"t{i}", fams[i % 5], int(rng.integers(0, 20)),
                        phases[int(rng.integers(0, 4))], int(rng.integers(1, 3000)),
                        int(rng.integers(0, 30000))) for i in range(1024)])
        return fc, tr

    fc, tr = tracked()
    assert len(tr) == 1024
    fc.predict(10.0, tr)  # warm the caches once
    for k in range(9):
        tr.apply(E(10.0 + k, "t0", "swe", 99 + k, Phase.QUEUED, 10))
        warm = fc.predict(10.0 + k, tr)
    cold_fc, cold_tr = tracked()
    for k in range(9):
        cold_tr.apply(E(10.0 + k, "t0", "swe", 99 + k, Phase.QUEUED, 10))
    cold = cold_fc.predict(18.0, cold_tr)
    assert warm.live == cold.live == 1024 and warm.backlog_turns == cold.backlog_turns > 0
    for name in ("prefill_tokens_per_s", "prefill_turns_per_s", "decode_seqs", "kv_tokens"):
        assert np.isfinite(getattr(warm, name)).all()
        np.testing.assert_array_equal(getattr(warm, name), getattr(cold, name), err_msg=name)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Phase)[:4]), st.floats(0, 30), st.integers(0, 70),
                          st.integers(0, 5000)), max_size=40),
       st.booleans())
def test_forecast_is_finite_and_each_trajectory_arrives_at_most_once(rows, trained):
    fc, tr = Forecaster(3.0, 0.5), LifecycleTracker()
    if trained:
        feed(fc, tr, train())
    feed(fc, tr, [E(t, f"r{i}", "g", k, ph, tok, tok) for i, (ph, t, k, tok) in enumerate(rows)])
    f = fc.predict(30.0, tr)
    for a in (f.prefill_tokens_per_s, f.prefill_turns_per_s, f.decode_seqs, f.kv_tokens):
        assert np.isfinite(a).all() and (a >= -1e-9).all()
    assert f.prefill_turns_per_s.sum() * f.bin_s <= len(tr) + 1e-9
    assert f.decode_seqs.max(initial=0) <= len(tr) * 2 + 1e-9  # its own decode, then the next


def test_skill_puts_the_forecast_beside_its_baselines():
    from prorsa.control.forecast_stats import skill
    from prorsa.dashboard.page import skill_line

    errors = {"prefill_tps@0-0.5s": 1.0, "prefill_tps@0.5-1s": 2.0, "prefill_tps_persistence@0-0.5s": 4.0,
              "prefill_tps_ewma@0-0.5s": 3.0, "decode_seqs@0-0.5s": 0.1}
    assert skill(errors) == {"prefill_tps": {"forecast": 1.5, "persistence": 4.0, "ewma": 3.0},
                             "decode_seqs": {"forecast": 0.1}}
    assert skill({"prefill_tps_lifecycle@0-0.5s": 2.0, "prefill_tps@0-0.5s": 1.0}) == {
        "prefill_tps": {"forecast": 1.0, "lifecycle": 2.0}}
    line = skill_line(errors)
    assert "prefill tokens/s 150% / 400% / 300%" in line and "decoding sequences 10% / n/a / n/a" in line


def test_the_kv_forecast_of_a_decoding_trajectory_grows_a_token_per_token_decoded():
    """Worked by hand: decodes are 600 tokens at 100 tok/s (6 s). A turn that appended 300 tokens
    to a 5,000-token context has decoded for 1 s at t = 5: it holds 5,300 + 100 tokens then, and
    100 more per second to the end of the 4 s horizon (its decode ends at +5 s)."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(dec=600))
    feed(fc, tr, [E(3.9, "x", "f", 2, Phase.QUEUED, 300, 5000), E(4.0, "x", "f", 2, Phase.DECODE, 0, 5000)])
    f = fc.predict(5.0, tr)
    mids = 0.25 + 0.5 * np.arange(8)
    assert f.decode_seqs == pytest.approx(np.ones(8))
    assert f.kv_tokens == pytest.approx(5000 + 300 + 100 + 100 * mids)
    assert f.decode_remaining_tokens == pytest.approx(500)


def test_a_queued_turns_kv_starts_when_its_decode_does():
    """A turn queued at t = 5 with the learned 0.1 s wait decodes from +0.1 s: the first bin's
    middle (+0.25 s) finds it 0.15 s in, holding its context, its append and 15 tokens."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(dec=600))
    feed(fc, tr, [E(5.0, "q", "f", 1, Phase.QUEUED, 200, 1000)])
    f = fc.predict(5.0, tr)
    mids = 0.25 + 0.5 * np.arange(8)
    assert f.decode_seqs == pytest.approx(np.ones(8))
    assert f.kv_tokens == pytest.approx(1000 + 200 + 100 * (mids - 0.1))
    assert (f.backlog_tokens, f.backlog_turns) == (200, 1)


def test_a_queued_turns_next_turn_arrives_with_its_kv_and_its_prefix():
    """Worked by hand: decodes of 100 tokens at 100 tok/s (1 s), 1.2 s tools, 100-token
    observations, a 0.1 s wait. A first turn of 200 tokens on 1,000 queued at t = 5 decodes over
    [0.1, 1.1) (bins 0 and 1 by their middles), ends in bin 2 (placed at its middle, 1.25 s), comes
    back from its tool at 2.45 s (bin 4, placed at 2.25 s) unless turn 0 was its last, and decodes
    again over [2.35, 3.35) (bins 5 and 6). Its next turn's prefix is the 1,300 tokens it will hold
    then; the KV it decodes on is that prefix, the observation and, on average, half a decode."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train())
    feed(fc, tr, [E(5.0, "q", "f", 0, Phase.QUEUED, 200, 1000)])
    f = fc.predict(5.0, tr)
    again = 1 - H0
    assert f.prefill_turns_per_s * 0.5 == pytest.approx([0, 0, 0, 0, again, 0, 0, 0])
    assert f.prefill_tokens_per_s * 0.5 == pytest.approx([0, 0, 0, 0, 100 * again, 0, 0, 0])
    assert f.decode_seqs == pytest.approx([1, 1, 0, 0, 0, again, again, 0])
    own = [1200 + 100 * (0.25 - 0.1), 1200 + 100 * (0.75 - 0.1)]
    assert f.kv_tokens == pytest.approx(own + [0, 0, 0] + [(1300 + 100 + 50) * again] * 2 + [0])
    # the prefixes under a prefill: the queued append's 1,000, and 1,300 under the arrival
    assert f.prefill_prefix_tokens == pytest.approx((1000 + 1300 * again) / (1 + again))


def test_an_arriving_turn_holds_its_prefix_its_observation_and_half_its_decode():
    """The tool burst above: 100 trajectories whose 500-token prompt decoded 100 tokens come back
    with 1,000-token observations, each decoding on 600 + 1,000 + 100 / 2 tokens of KV."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(tool_s=2.3, obs=1000))
    burst = []
    for i in range(100):
        burst += [E(10.3, f"b{i}", "f", 0, Phase.QUEUED, 500), E(10.4, f"b{i}", "f", 0, Phase.DECODE),
                  E(11.4, f"b{i}", "f", 0, Phase.TOOL, 100)]
    feed(fc, tr, burst)
    f = fc.predict(12.0, tr)
    assert f.kv_tokens == pytest.approx(np.array([0, 0, 0, 0, 1, 1, 0, 0]) * 100 * ON * 1650)


def test_an_event_stamped_after_the_forecast_counts_as_just_now():
    """Reporters' clocks differ: a turn queued 0.2 s "after" the forecast's start waits the usual
    0.1 s from the start, not 0.3 s."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(dec=600))
    feed(fc, tr, [E(5.2, "q", "f", 1, Phase.QUEUED, 200, 1000)])
    f = fc.predict(5.0, tr)
    assert f.kv_tokens[0] == pytest.approx(1000 + 200 + 100 * (0.25 - 0.1))


def test_before_any_tool_is_seen_a_tool_takes_the_priors_second():
    """No history: a trajectory entering a tool now comes back at +1 s (the bin (0.5, 1]), with
    P(another turn | in a tool) = 1 - h s / (1 - h (1 - s)) at the prior hazard h = 0.2 and the
    prior share s = 0.5 of ends reported after a tool: 1 - 0.1 / 0.9."""
    fc, tr = Forecaster(2.0, 0.5), LifecycleTracker()
    feed(fc, tr, [E(0.0, "t", "f", 0, Phase.DECODE), E(1.0, "t", "f", 0, Phase.TOOL, 100)])
    f = fc.predict(1.0, tr)
    assert f.prefill_turns_per_s * 0.5 == pytest.approx([0, 1 - 0.1 / 0.9, 0, 0])


def test_horizon_bins_decode_rate_and_means_at_their_edges():
    # a horizon that is not a whole number of bins is rounded to the nearest: 1.3 s -> 3 bins
    short = Forecaster(1.3, 0.5)
    assert (short.n_bins, short.horizon_s) == (3, 1.5)
    fc, tr = Forecaster(2.0, 0.5, decode_tps=50.0), LifecycleTracker()
    # a decode reported as ending when it started tells no rate (and divides by nothing)
    feed(fc, tr, [E(1.0, "z", "f", 0, Phase.DECODE), E(1.0, "z", "f", 0, Phase.TOOL, 40)])
    assert fc.decode_rate() == 50.0
    # one token in 10 ms is a rate like any other: 100 tokens/s
    feed(fc, tr, [E(2.0, "o", "f", 0, Phase.DECODE), E(2.01, "o", "f", 0, Phase.TOOL, 1)])
    assert fc.decode_rate() == pytest.approx(100.0)
    # with nothing ended, means() falls back to the priors, and a trajectory has at least a turn
    assert Forecaster().means(min_ended=0) == {"prompt_tokens": 0.0, "observation_tokens": 500.0,
                                               "decode_tokens": 400.0, "tool_s": 0.0, "turns": 1.0}


def test_a_forecasts_summary_averages_its_bins():
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(dec=600))
    feed(fc, tr, [E(4.0, "long", "f", 0, Phase.DECODE, context=0),
                  E(-0.5, "ending", "f", 0, Phase.DECODE, context=0)])
    s = fc.predict(5.0, tr).summary()
    # the decode counts of test_decoding_trajectories_occupy_bins_until_their_expected_end
    assert s.decode_seqs_mean == pytest.approx((2 + 1 + 1 + 5 * (1 + 1 - H0)) / 8)
    assert s.decode_seqs_peak == pytest.approx(2.0)


def test_past_every_sample_the_rest_is_uniform_up_to_twice_tail_times_the_elapsed():
    from prorsa.control.forecast_stats import cond_cdf

    # 2 s elapsed past the only sample (1 s), tail 0.25: the rest uniform on (0, 1 s]
    p = cond_cdf(np.array([1.0]), np.array([2.0]), np.array([0.25, 0.5, 2.0]), 0.25)
    assert p == pytest.approx(np.array([[0.25, 0.5, 1.0]]))


def test_a_return_at_the_error_books_cut_is_kept_for_the_forecast_starting_there():
    """The book forgets what came before its cut, here 3 s before 10 s; a return exactly at 7 s is
    in the first bin of a forecast starting then."""
    from prorsa.control.forecast_stats import ErrorBook

    book = ErrorBook(n_bins=2, bin_s=1.0, window=8)
    book.score(10.0)
    book.arrival(7.0, 100)
    book.arrival(6.5, 100)  # before the cut: no forecast left can score it
    assert book._realised_prefill(np.array([7.0, 8.0, 9.0])) == pytest.approx([100.0, 0.0])


def test_a_decode_that_fails_adds_no_decode_length():
    """A trajectory that fails while decoding reports no tokens: that is no decode of 0 tokens."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train())
    feed(fc, tr, [E(20.0, "lost", "f", 0, Phase.QUEUED, 500), E(20.1, "lost", "f", 0, Phase.DECODE),
                  E(20.5, "lost", "f", 0, Phase.FAILED, 0)])
    assert fc._view("f").dec_mean == 100 and fc.observed(1)["decode_tokens"] == 100


def test_the_forecaster_takes_only_a_positive_horizon_bin_and_rate():
    for bad in ({"horizon_s": 0.0}, {"bin_s": 0.0}, {"bin_s": -0.5}, {"decode_tps": 0.0}):
        with pytest.raises(ValueError, match="must be positive"):
            Forecaster(**bad)


def test_the_error_book_forgets_what_no_forecast_can_score_any_more():
    """Bounded memory: with nothing pending, arrivals and decode changes older than a horizon and a
    bin of grace (3 s here) are dropped, the changes folded into the level they leave."""
    from prorsa.control.forecast_stats import ErrorBook

    book = ErrorBook(n_bins=2, bin_s=1.0, window=8)
    for t in (0.5, 5.5, 8.0):
        book.arrival(t, 100)
        book.decode_change(t, 1)
    book.score(10.0)
    assert [t for t, _ in book._arrivals] == [8.0] and book._changes == [(8.0, 1)] and book._level == 2


def test_a_decode_past_every_remembered_length_is_expected_to_last_as_long_again():
    """Decodes of 1 s (100 tokens at 100 tok/s) remembered; one has run 4 s. Its rest is taken as
    uniform on (0, 8 s]: it ends in each 0.5 s bin with probability 1/16, calls the 1.2 s tool and
    comes back (turn 0 goes on with 1 - H0) 1.2 s later, from the end's mid-bin: bins 2..7. The
    first decodes to end are the short ones, so one that outlasts them all is no sign of a cap
    (math-tir: a first wave of 20 s decodes, taken to end within half their age, was forecast
    to bring 1.7x the returns that came)."""
    fc, tr = Forecaster(4.0, 0.5), LifecycleTracker()
    feed(fc, tr, train(tool_s=1.2))
    feed(fc, tr, [E(10.0, "slow", "f", 0, Phase.QUEUED, 500), E(10.0, "slow", "f", 0, Phase.DECODE)])
    f = fc.predict(14.0, tr)
    assert f.prefill_turns_per_s * f.bin_s == pytest.approx([0, 0] + [(1 - H0) / 16] * 6)
    assert f.prefill_tokens_per_s * f.bin_s == pytest.approx([0, 0] + [100 * (1 - H0) / 16] * 6)
    assert f.decode_seqs[:2] == pytest.approx([1 - 0.25 / 8, 1 - 0.75 / 8])  # still decoding


def _scored_book(lifecycle: list[list[float]], actual: list[float], persistence: float, ewma: float):
    """An ErrorBook (2 bins of 1 s) that has scored one forecast per row of `lifecycle` (the
    model's per bin), each with the same baselines and the same realised arrivals: `actual`
    tokens in each bin."""
    from prorsa.control.forecast_stats import ErrorBook

    book = ErrorBook(n_bins=2, bin_s=1.0, window=64)
    zeros = np.zeros(2)
    for k, lc in enumerate(lifecycle):
        start = 10.0 * k
        book.remember(start, np.array(lc), zeros, lifecycle=(np.array(lc), zeros),
                      baselines={"prefill_tps": (persistence, ewma), "decode_seqs": (0.0, 0.0)})
        for j, tokens in enumerate(actual):
            book.arrival(start + j + 0.5, tokens)
        book.score(start + 3.0)  # a horizon and a bin of grace later
    return book


def test_the_blend_is_the_lifecycle_forecast_until_enough_has_been_scored():
    from prorsa.control.forecast_stats import MIN_FIT

    book = _scored_book([[200.0, 800.0]] * (MIN_FIT - 1), [100.0, 200.0], 50.0, 80.0)
    assert book.blend("prefill_tps", np.array([60.0, 20.0]), 50.0, 80.0) == pytest.approx([60.0, 20.0])


def test_the_blend_corrects_the_lifecycle_level_per_bin_by_what_arrived_over_what_it_said():
    """The model said 200 and 800 tok/s where 100 and 200 came: per bin x0.5 and x0.25, which
    makes it exact, so it takes all the weight from baselines that were off (50 and 80)."""
    from prorsa.control.forecast_stats import MIN_FIT

    book = _scored_book([[200.0, 800.0]] * MIN_FIT, [100.0, 200.0], 50.0, 80.0)
    assert book.blend("prefill_tps", np.array([60.0, 20.0]), 50.0, 80.0) == pytest.approx([30.0, 5.0])
    assert book.errors()["prefill_tps_lifecycle@1-2s"] == pytest.approx(3.0)  # |800 - 200| / 200


def test_the_error_means_asked_between_scorings_take_in_each_new_score():
    """errors() keeps its means between calls and refreshes those a scored forecast changed: a
    lifecycle forecast off by 3.0 in its second bin, then one off by 1.0 there (400 against 200)
    and exact in its first; the persistence baseline, off by 0.5 and 0.75 each time, unchanged."""
    book = _scored_book([[200.0, 800.0]], [100.0, 200.0], 50.0, 50.0)
    first = book.errors()
    assert first["prefill_tps_lifecycle@1-2s"] == pytest.approx(3.0)
    assert first["prefill_tps_lifecycle@0-1s"] == pytest.approx(1.0)  # |200 - 100| / 100
    zeros = np.zeros(2)
    book.remember(30.0, np.array([100.0, 400.0]), zeros, lifecycle=(np.array([100.0, 400.0]), zeros),
                  baselines={"prefill_tps": (50.0, 50.0), "decode_seqs": (0.0, 0.0)})
    for j, tokens in enumerate([100.0, 200.0]):
        book.arrival(30.0 + j + 0.5, tokens)
    book.score(33.0)
    now = book.errors()
    assert now["prefill_tps_lifecycle@1-2s"] == pytest.approx((3.0 + 1.0) / 2)
    assert now["prefill_tps_lifecycle@0-1s"] == pytest.approx((1.0 + 0.0) / 2)
    assert now["prefill_tps_persistence@1-2s"] == first["prefill_tps_persistence@1-2s"] == pytest.approx(0.75)
    assert list(now) == list(first)  # the keys in the same order: metric and predictor, then bin


def test_the_blend_weighs_the_predictor_whose_scored_error_was_least():
    """A steady 100 tok/s: persistence said it exactly; the model, right on average (its level
    correction is 1), was off by half every time; the EWMA by 2x. All weight on persistence."""
    from prorsa.control.forecast_stats import MIN_FIT

    rows = [[50.0, 150.0], [150.0, 50.0]] * MIN_FIT
    book = _scored_book(rows, [100.0, 100.0], 100.0, 300.0)
    assert book.blend("prefill_tps", np.array([999.0, 999.0]), 120.0, 300.0) == pytest.approx([120.0, 120.0])


def test_the_blend_drops_a_level_correction_the_model_has_outgrown():
    """The model said twice what came for 8 forecasts, then exactly what came for 24: the level
    correction, which forgets slowly, still scales it by 0.8; the model as it is scored best of
    late, so the blend is the model's forecast uncorrected (the baselines, 50 and 60, were off by
    40% or more, and so is any mix of them)."""
    from prorsa.control.forecast_stats import LEVEL_HALF_LIFE

    assert LEVEL_HALF_LIFE > 32
    book = _scored_book([[200.0, 200.0]] * 8, [100.0, 100.0], 50.0, 60.0)
    for k in range(8, 32):
        book.remember(10.0 * k, np.array([100.0, 100.0]), np.zeros(2),
                      lifecycle=(np.array([100.0, 100.0]), np.zeros(2)),
                      baselines={"prefill_tps": (50.0, 60.0), "decode_seqs": (0.0, 0.0)})
        book.arrival(10.0 * k + 0.5, 100)
        book.arrival(10.0 * k + 1.5, 100)
        book.score(10.0 * k + 3.0)
    assert book.blend("prefill_tps", np.array([60.0, 20.0]), 50.0, 60.0) == pytest.approx([60.0, 20.0])


def test_the_blend_follows_the_ewma_where_it_was_the_one_right():
    """The model off both ways (60 and 140 alternately where 100 came), persistence 2x, the EWMA
    exact: the blend is the EWMA's value now, whatever the model says."""
    from prorsa.control.forecast_stats import MIN_FIT

    rows = [[60.0, 140.0], [140.0, 60.0]] * MIN_FIT
    book = _scored_book(rows, [100.0, 100.0], 200.0, 100.0)
    assert book.blend("prefill_tps", np.array([10.0, 10.0]), 200.0, 90.0) == pytest.approx([90.0, 90.0])


def test_the_blend_weighs_recent_scored_errors_above_old_ones():
    """100 tok/s came every time. For 32 forecasts persistence said 100 and the EWMA 50, for the
    32 since, the other way round: the recent half weighs twice the old (a half-life of 32), so
    all weight goes to the EWMA; any mix of the two is off by a weighted share of both halves."""
    from prorsa.control.forecast_stats import FIT_HALF_LIFE, ErrorBook

    assert FIT_HALF_LIFE == 32
    book = ErrorBook(n_bins=2, bin_s=1.0, window=64)
    zeros = np.zeros(2)
    for k in range(64):
        pers, ewma = (100.0, 50.0) if k < 32 else (50.0, 100.0)
        book.remember(10.0 * k, zeros, zeros, lifecycle=(zeros, zeros),
                      baselines={"prefill_tps": (pers, ewma), "decode_seqs": (0.0, 0.0)})
        book.arrival(10.0 * k + 0.5, 100)
        book.arrival(10.0 * k + 1.5, 100)
        book.score(10.0 * k + 3.0)
    assert book.blend("prefill_tps", zeros, 70.0, 90.0) == pytest.approx([90.0, 90.0])


def test_the_blend_scores_weightings_only_where_something_came():
    """Half the forecasts saw nothing arrive (MAPE skips those bins, as errors() does), half saw
    100 tok/s, which persistence said every time; the EWMA said 0 every time, right in the empty
    half. Counted there too (over 1 for want of an actual), persistence's 100 there would cost it
    more than the EWMA's misses and the EWMA would win; skipped, persistence wins."""
    from prorsa.control.forecast_stats import ErrorBook

    book = ErrorBook(n_bins=2, bin_s=1.0, window=64)
    zeros = np.zeros(2)
    for k in range(32):
        book.remember(10.0 * k, zeros, zeros, lifecycle=(zeros, zeros),
                      baselines={"prefill_tps": (100.0, 0.0), "decode_seqs": (0.0, 0.0)})
        if k % 2:
            book.arrival(10.0 * k + 0.5, 100)
            book.arrival(10.0 * k + 1.5, 100)
        book.score(10.0 * k + 3.0)
    assert book.blend("prefill_tps", zeros, 70.0, 90.0) == pytest.approx([70.0, 70.0])


def test_turns_follow_the_blended_tokens_at_the_models_append_per_turn():
    from prorsa.control.forecast import _follow

    # bin 0: the model had 2 turns of 50 tokens; bin 1: none, so the horizon's 1 turn per 100 tokens
    turns = _follow(np.array([2.0, 0.0]), np.array([100.0, 0.0]), np.array([50.0, 30.0]), 1 / 100)
    assert turns == pytest.approx([1.0, 0.3])


def test_a_forecast_made_unblended_changes_no_forecast_blended_later():
    """A policy holding its split asks for the forecast unblended (Forecaster.predict blend=False):
    the blend reads the error book and never writes it, so a forecaster asked so at some intervals
    forecasts exactly what one that blended at every interval does once it blends again; only the
    blended forecast's own error is scored less often (where it was made)."""
    events = train(n=40, tool_s=0.7, obs=300, dec=150) + [
        E(3.0 + 0.05 * i, f"late-{i}", "f", 0, Phase.QUEUED, 400 + 10 * i) for i in range(30)]
    always, sometimes = Forecaster(4.0, 0.5), Forecaster(4.0, 0.5)
    tracks = LifecycleTracker(), LifecycleTracker()
    t, k = 0.0, 0
    for step in range(40):
        t = 0.25 * step
        now = [e for e in events if k <= events.index(e) and e.time_s <= t]
        k += len(now)
        feed(always, tracks[0], now)
        feed(sometimes, tracks[1], now)
        a = always.predict(t, tracks[0])
        b = sometimes.predict(t, tracks[1], blend=step % 3 == 0)
        if step % 3 == 0:
            assert a.prefill_tokens_per_s.tolist() == b.prefill_tokens_per_s.tolist()
            assert a.decode_seqs.tolist() == b.decode_seqs.tolist()
    mine, theirs = sometimes.errors(), always.errors()
    assert any(key.startswith("prefill_tps@") for key in theirs)
    assert {k for k in mine if not k.startswith("prefill_tps@")} == {k for k in theirs if not k.startswith("prefill_tps@")}
    assert all(mine[k] == theirs[k] for k in mine if not k.startswith("prefill_tps@"))
