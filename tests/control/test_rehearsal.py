"""The policy's rehearsals (control/rehearsal.py): each split replayed once a call, a step and the
one before summed, the finalists ranked again over resampled steps, the corrected model passed on."""

from __future__ import annotations

import pytest

from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.control.calibration import Calibration
from prorsa.control.rehearsal import FINALIST_BAND, MAX_REHEARSED, Rehearsal
from prorsa.control.veto import VETO_EVIDENCE, ReplayVeto
from prorsa.costmodel.misfit import ModelScale

MIXED, P1, P2 = (0, 0, 4), (1, 3, 0), (2, 2, 0)


def _specs(n: int, prefix: str = "t") -> list[TrajectorySpec]:
    return [TrajectorySpec(f"{prefix}{i}", "swe", 0, i // 2, i % 2, (TurnSpec(100, 10, 0.0, True),), seed=i)
            for i in range(n)]


class Book:
    """A simulator by table: makespan by split, times `scale` for a resampled step (ids with ~)."""

    def __init__(self, table: dict, resampled: float = 1.0) -> None:
        self.table, self.resampled, self.calls = table, resampled, []

    def __call__(self, specs, split, **model):
        self.calls.append((specs[0].traj_id, split, model))
        return self.table[split] * (self.resampled if "~" in specs[0].traj_id else 1.0)


def test_each_distinct_split_is_replayed_once_and_logged():
    book = Book({MIXED: 100.0, P1: 90.0})
    r = Rehearsal(book, Calibration())
    assert r.replay(_specs(4), [MIXED, P1, MIXED]) == {MIXED: 100.0, P1: 90.0}
    assert [s for _, s, _ in book.calls] == [MIXED, P1] and r.log == [{MIXED: 100.0, P1: 90.0}]
    assert all(model == {} for *_, model in book.calls)  # an exact model is not passed on


def test_the_corrected_model_and_a_run_told_no_prior_are_passed_on():
    book = Book({MIXED: 100.0})
    cal = Calibration()
    cal.scale = ModelScale(prefill=0.8)
    Rehearsal(book, cal).replay(_specs(2), [MIXED], told=False)
    assert book.calls[0][2] == {"scale": ModelScale(prefill=0.8), "told": False}


def test_the_step_before_adds_its_own_replay_unless_too_long_to_rehearse():
    book = Book({MIXED: 100.0, P1: 90.0})
    r = Rehearsal(book, Calibration())
    assert r.times(_specs(4), _specs(2, "o"), [MIXED, P1]) == {MIXED: 200.0, P1: 180.0}
    long = _specs(MAX_REHEARSED + 1, "o")
    assert r.times(_specs(4), long, [MIXED, P1]) == {MIXED: 100.0, P1: 90.0}


def test_finalists_are_ranked_by_their_mean_over_resamples_and_the_rest_left_as_they_were():
    """P1 leads all mixed by 2% on the step (inside FINALIST_BAND); P2, 20% behind, is no finalist.
    Each of three resamples puts every split at 1.2x its step figure: the mean over the four is
    98 x (1 + 3 x 1.2) / 4 = 112.7 for P1 and 115 for all mixed (`base`, kept in either way)."""
    assert 0.02 < FINALIST_BAND < 0.2
    book = Book({MIXED: 100.0, P1: 98.0, P2: 120.0}, resampled=1.2)
    r = Rehearsal(book, Calibration())
    step = _specs(4)
    times = r.times(step, (), [MIXED, P1, P2])
    got = r.over_resamples(times, MIXED, step, (), 3)
    assert set(got) == {MIXED, P1}
    assert got[MIXED] == pytest.approx(100.0 * (1 + 3 * 1.2) / 4) and got[P1] == pytest.approx(98.0 * 4.6 / 4)
    again = [(t, s) for t, s, _ in book.calls if "~" in t]
    assert len(again) == 3 * 2 and {s for _, s in again} == {MIXED, P1}
    assert r.over_resamples(times, MIXED, step, (), 0) is times  # none asked: as they were


def test_the_veto_replays_only_past_its_evidence_and_holds_a_refusal_for_a_quarter_of_concurrency():
    """control/veto.py: before VETO_EVIDENCE completions nothing is replayed; then the last
    `concurrency` completed are, and a goal that ends no sooner is refused by name and times; the
    refusal stands until a quarter of `concurrency` more have completed."""
    book = Book({MIXED: 100.0, P1: 105.0, P2: 110.0})
    veto = ReplayVeto(Rehearsal(book, Calibration()), concurrency=8)
    assert veto(MIXED, P1, P2, _specs(VETO_EVIDENCE - 1)) == "" and book.calls == []
    done = _specs(VETO_EVIDENCE)
    assert veto(MIXED, P1, P2, done) == ("P1 D3 M0 refused: the last 8 trajectories replayed end in 105.0 s "
                                         "under it, 100.0 s as now: ")
    assert [t for t, _, _ in book.calls] == [done[-8].traj_id] * 3  # the window: the last 8, three splits
    assert veto(MIXED, P1, P2, done + _specs(1, "n")) == "P1 D3 M0 refused by its replay, too few completed since: "
    assert len(book.calls) == 3
    assert veto(MIXED, P1, P2, done + _specs(2, "n")).startswith("P1 D3 M0 refused: the last 8")  # 2 = 8 / 4
    assert len(book.calls) == 6


def test_a_step_before_of_exactly_max_rehearsed_is_still_replayed():
    book = Book({MIXED: 100.0, P1: 90.0})
    r = Rehearsal(book, Calibration())
    assert r.times(_specs(4), _specs(MAX_REHEARSED, "o"), [MIXED, P1]) == {MIXED: 200.0, P1: 180.0}


def test_one_resample_asked_is_one_resample_made():
    """n = 1: the finalists at their mean over the step and one resample, (98 + 1.2 x 98) / 2."""
    book = Book({MIXED: 100.0, P1: 98.0}, resampled=1.2)
    r = Rehearsal(book, Calibration())
    step = _specs(4)
    got = r.over_resamples(r.times(step, (), [MIXED, P1]), MIXED, step, (), 1)
    assert got[P1] == pytest.approx(98.0 * 2.2 / 2) and got[MIXED] == pytest.approx(100.0 * 2.2 / 2)


def test_the_veto_needs_sixteen_completed_before_it_replays():
    book = Book({MIXED: 100.0, P1: 105.0, P2: 110.0})
    veto = ReplayVeto(Rehearsal(book, Calibration()), concurrency=8)
    assert veto(MIXED, P1, P2, _specs(15)) == "" and book.calls == []
    assert veto(MIXED, P1, P2, _specs(16)).startswith("P1 D3 M0 refused: the last 8")


def test_the_veto_lets_a_goal_through_whose_best_leads_it_by_less_than_the_margin():
    """On long replays the margin is a share: the fluid model's best 0.5% ahead of the goal (995 s
    against 1,000 s), inside REHEARSAL_GAIN, and the goal 10% ahead of the split as it is: moved."""
    veto = ReplayVeto(Rehearsal(Book({MIXED: 1100.0, P1: 1000.0, P2: 995.0}), Calibration()), concurrency=8)
    assert veto(MIXED, P1, P2, _specs(16)) == ""
    veto = ReplayVeto(Rehearsal(Book({MIXED: 1100.0, P1: 1000.0, P2: 980.0}), Calibration()), concurrency=8)
    assert veto(MIXED, P1, P2, _specs(16)).startswith("P1 D3 M0 refused: the last 8 trajectories replayed end in "
                                                      "1000.0 s under it, 980.0 s under P2 D2 M0")


@pytest.mark.parametrize("concurrency,wait", [(12, 3), (2, 1)])
def test_a_refusal_stands_for_a_quarter_of_concurrency_completed_and_at_least_one(concurrency, wait):
    book = Book({MIXED: 100.0, P1: 105.0, P2: 110.0})
    veto = ReplayVeto(Rehearsal(book, Calibration()), concurrency=concurrency)
    done = _specs(16)
    assert veto(MIXED, P1, P2, done).startswith("P1 D3 M0 refused: the last")
    if wait > 1:
        assert "too few completed since" in veto(MIXED, P1, P2, done + _specs(wait - 1, "n"))
    assert veto(MIXED, P1, P2, done + _specs(wait, "n")).startswith("P1 D3 M0 refused: the last")
