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
