"""The no-prior opening: least worst-case regret over the plausible families, each rehearsed under
every fixed split."""

from __future__ import annotations

import pytest

from prorsa.control.opening import every_split, least_regret, plausible, rehearsed_opening


def test_every_split_is_all_mixed_then_every_p_d_then_every_p_beside_mixed():
    assert every_split(3) == [(0, 0, 3), (1, 2, 0), (2, 1, 0), (1, 0, 2), (2, 0, 1)]


def test_least_regret_takes_the_split_whose_worst_family_loses_least():
    # (1, 0, 3) is best on swe and terrible on terminal; (0, 0, 4) is 10% off on swe, best on terminal;
    # (2, 2, 0) is 5% off on both: the least worst case
    times = {"swe": {(1, 0, 3): 100.0, (0, 0, 4): 110.0, (2, 2, 0): 105.0},
             "terminal": {(1, 0, 3): 200.0, (0, 0, 4): 100.0, (2, 2, 0): 105.0}}
    got = least_regret(times)
    assert got.split == (2, 2, 0)
    assert got.regret == {"swe": pytest.approx(0.05), "terminal": pytest.approx(0.05)}
    assert got.considered == ("swe", "terminal")


def test_least_regret_ties_go_to_the_most_mixed_split():
    times = {"swe": {(1, 0, 3): 100.0, (0, 0, 4): 100.0, (1, 3, 0): 100.0}}
    assert least_regret(times).split == (0, 0, 4)


def test_the_opening_replays_each_plausible_family_under_every_split():
    asked = []

    def replay(specs, cands):
        asked.append((specs[0].traj_id, len(specs), tuple(cands)))
        return {c: 100.0 + 10 * c[0] for c in cands}  # fewer prefill engines, sooner

    got = rehearsed_opening(replay, 4, 8, prompts=[2000] * 16, windows=2)
    assert got.split == (0, 0, 4)
    assert {n for _, n, _ in asked} == {16}  # two windows of 8 in flight
    assert all(cands == tuple(every_split(4)) for _, _, cands in asked)
    assert len(asked) == len(plausible([2000] * 16)) == len(got.considered)
    assert "math-tir" not in got.considered  # prompts 5x math-tir's: not this run's


def test_a_familys_mean_prompt_is_its_whole_draws():
    """The narrowing draws one member a prompt: a group's members share their prompt."""
    from prorsa.agent.trace import workload_means
    from prorsa.agent.workload import Workload
    from prorsa.config.workload import WorkloadConfig
    from prorsa.control.opening import PLAUSIBLE, _prompt_hint

    for f in PLAUSIBLE:
        whole = Workload.from_config(WorkloadConfig(family=f, mode="sync", prompts=64, group_size=8), seed=0)
        assert _prompt_hint(f).prompt_tokens == workload_means(whole.trajectories_for_step(0))["prompt_tokens"]


def test_least_regret_ties_of_as_many_mixed_engines_go_to_the_fewest_prefill_engines():
    times = {"swe": {(2, 2, 0): 100.0, (1, 3, 0): 100.0, (3, 1, 0): 100.0}}  # whatever order they came in
    assert least_regret(times).split == (1, 3, 0)


def test_the_steady_forecast_worked_by_hand():
    """16 trajectories on 2 engines: 1,000-token prompts, 5 turns of 100 decoded tokens and a
    500-token observation, 1 s tools. A decode step of 10 ms + 1 ms a sequence, a prefill 100 ms.
    The engines hold the contexts half-way through: 1,000 + (500 + 100) x 4 / 2 = 2,200 tokens.
    The batch starts at 16 / 2 = 8 and is taken three rounds toward its fixed point: a decode of
    100 steps at the batch, a cycle of it, the tool and a prefill, the trajectories decoding for
    their share of the cycle, spread over the engines. The batches priced: 8, 4.966, 4.611 (the
    last, 68.44 tokens/s a sequence, 9.128 sequences decoding)."""
    from prorsa.control.allocator import Capacity
    from prorsa.control.opening import steady_forecast
    from prorsa.control.policy import WorkloadHint

    class FlatCost:
        ep, layout = 1, (1, 1)

        def step_times(self, tokens, seqs, attn_units, kv_read_tokens):
            return 0.01 + 0.001 * seqs

        def prefill_time(self, chunks):
            return 0.1

    hint = WorkloadHint(concurrency=16, prompt_tokens=1000.0, observation_tokens=500.0, decode_tokens=100.0,
                        tool_s=1.0, turns=5.0)
    fc = steady_forecast(hint, Capacity(FlatCost(), slots=16, kv_capacity_tokens=10**9), 2, 4, 0.5)
    batch = 8.0
    for _ in range(3):
        tps = 1 / (0.01 + 0.001 * batch)
        decode_s = 100 / tps
        cycle = decode_s + 1.0 + 0.1
        seqs = 16 * decode_s / cycle
        batch = seqs / 2
    assert (tps, seqs) == pytest.approx((68.44, 9.128), abs=1e-2)
    turns_per_s = 16 / cycle * (1 - 1 / 5)  # the last turn of each trajectory appends nothing
    assert fc.decode_tps_per_seq == pytest.approx(tps)
    assert fc.decode_seqs == pytest.approx([seqs] * 4) and fc.kv_tokens == pytest.approx([seqs * 2200] * 4)
    assert fc.prefill_turns_per_s == pytest.approx([turns_per_s] * 4)
    assert fc.prefill_tokens_per_s == pytest.approx([turns_per_s * 500] * 4)
    assert (fc.prefill_prefix_tokens, fc.decode_tokens_per_turn, fc.decode_remaining_tokens, fc.live) == (
        2200.0, 100.0, 50.0, 16)
    assert (fc.backlog_tokens, fc.backlog_turns, fc.bin_s, fc.n_bins) == (0.0, 0.0, 0.5, 4)
