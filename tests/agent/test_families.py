"""The coding-agent family against the recorded shape it was fitted to (../shared/traces/README.md:
500 mini-swe-agent runs on SWE-bench Verified), on a large draw through the workload (context cap
included), and its lack of correlation between early and total decode."""

from __future__ import annotations

import numpy as np
import pytest

from prorsa.agent.families import FAMILIES
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import WorkloadConfig

# (statistic, recorded value, relative tolerance)
RECORDED = {
    "turns mean": (40, 0.10), "turns p90": (66, 0.12),
    "decode median": (89, 0.15), "decode mean": (276, 0.15), "decode p90": (681, 0.15),
    "appended median": (98, 0.15), "appended p90": (901, 0.15),
}


def spearman(a, b) -> float:
    rank = lambda x: np.argsort(np.argsort(x, kind="stable"), kind="stable")  # noqa: E731 (ties: rare, harmless)
    return float(np.corrcoef(rank(np.asarray(a)), rank(np.asarray(b)))[0, 1])


def draw(family: str, seed: int = 7, prompts: int = 1000):
    return Workload.from_config(WorkloadConfig(family=family, prompts=prompts, group_size=4), seed).trajectories_for_step(0)


@pytest.fixture(scope="module")
def coding():
    return draw("coding-agent")


def test_a_large_draw_matches_the_recorded_statistics(coding):
    turns = np.array([len(s.turns) for s in coding])
    decode = np.array([t.decode_tokens for s in coding for t in s.turns])
    appended = np.array([t.appended_tokens for s in coding for t in s.turns[1:]])
    got = {"turns mean": turns.mean(), "turns p90": np.percentile(turns, 90),
           "decode median": np.median(decode), "decode mean": decode.mean(), "decode p90": np.percentile(decode, 90),
           "appended median": np.median(appended), "appended p90": np.percentile(appended, 90)}
    off = {k: round(got[k], 1) for k, (want, tol) in RECORDED.items() if abs(got[k] / want - 1) > tol}
    assert off == {}, f"outside tolerance: {off}"
    family = FAMILIES["coding-agent"]
    assert 120 <= turns.max() <= family.max_turns  # recorded max 145
    assert max(s.context_tokens for s in coding) <= family.context_cap


def test_early_decode_says_nothing_of_total_decode(coding):
    total = [sum(t.decode_tokens for t in s.turns) for s in coding]
    first = [s.turns[0].decode_tokens for s in coding]
    first3 = [sum(t.decode_tokens for t in s.turns[:3]) for s in coding]
    assert abs(spearman(first, total)) < 0.08  # recorded 0.01
    assert -0.05 < spearman(first3, total) < 0.3  # recorded 0.20
    # the check can fail: where hardness scales every turn's decode, the first turn predicts the total
    swe = draw("swe", prompts=300)
    assert spearman([s.turns[0].decode_tokens for s in swe], [sum(t.decode_tokens for t in s.turns) for s in swe]) > 0.15
