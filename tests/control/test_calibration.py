"""Online calibration: leg times read from lifecycle events, and the correction they move."""

import pytest

from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.control.calibration import DEADBAND, MAX_STEP, MIN_LEGS, Calibration, PhaseClock, PhaseRates
from prorsa.control.lifecycle import LifecycleEvent, Phase
from prorsa.costmodel.misfit import ModelScale


def _turn(traj: str, turn: int, t0: float, prefill_s: float | None, decode_s: float, append: int, decoded: int,
          last: bool = False) -> list[LifecycleEvent]:
    ev = [LifecycleEvent(t0, traj, "swe", turn, Phase.QUEUED, append)]
    t = t0
    if prefill_s is not None:
        ev.append(LifecycleEvent(t, traj, "swe", turn, Phase.PREFILL, append))
        t += prefill_s
    ev.append(LifecycleEvent(t, traj, "swe", turn, Phase.DECODE))
    t += decode_s
    ev.append(LifecycleEvent(t, traj, "swe", turn, Phase.TOOL, decoded))
    if last:
        ev.append(LifecycleEvent(t, traj, "swe", turn, Phase.DONE))
    return ev


def _clock(events) -> PhaseClock:
    clock = PhaseClock()
    for ev in events:
        clock.observe(ev)
    return clock


def test_phase_clock_reads_prefill_and_generating_legs():
    r = _clock(_turn("a", 0, 0.0, 1.0, 2.0, 100, 50) + _turn("a", 1, 5.0, None, 3.0, 20, 30, last=True)).rates()
    assert (r.prefill_s, r.prefill_tokens, r.prefill_legs) == (1.0, 100, 1)
    assert (r.decode_s, r.decode_tokens, r.decode_legs) == (5.0, 80, 2)


def test_rates_need_enough_legs():
    few = PhaseRates(1.0, 100, MIN_LEGS - 1, 1.0, 100, MIN_LEGS - 1)
    enough = PhaseRates(1.0, 100, MIN_LEGS, 2.0, 100, MIN_LEGS)
    assert few.prefill_per_token() is None and few.decode_per_token() is None
    assert enough.prefill_per_token() == 0.01 and enough.decode_per_token() == 0.02


def _rates(prefill_per_token: float, decode_per_token: float) -> PhaseRates:
    return PhaseRates(prefill_per_token * 1000, 1000, MIN_LEGS, decode_per_token * 1000, 1000, MIN_LEGS)


def test_a_slower_world_turns_the_model_down_by_the_ratio():
    cal = Calibration()
    why = cal.update(_rates(0.010, 0.020), _rates(0.009, 0.016), seen_s=110.0, predicted_s=100.0)
    assert cal.scale.prefill == pytest.approx(0.9) and cal.scale.decode == pytest.approx(0.8)
    assert cal.error == pytest.approx(0.10) and "10.0% off" in why


def test_one_step_moves_at_most_max_step_and_small_differences_not_at_all():
    cal = Calibration()
    cal.update(_rates(0.010, 0.010), _rates(0.010 * (1 - DEADBAND / 2), 0.040), 110.0, 100.0)
    # the rehearsal was 4x slower than the engines: the model's decode goes up, by MAX_STEP at most
    assert cal.scale.prefill == 1.0 and cal.scale.decode == pytest.approx(MAX_STEP)
    cal.update(_rates(0.010, 0.010), _rates(0.010, 0.010 / 1.2), 110.0, 100.0)
    assert cal.scale.decode == pytest.approx(MAX_STEP / 1.2)  # corrections compose


def test_a_replay_within_the_deadband_moves_nothing_and_the_last_round_only_measures():
    cal = Calibration()
    cal.update(_rates(0.010, 0.020), _rates(0.010, 0.010), 100.0 * (1 + DEADBAND / 2), 100.0)
    assert cal.scale.exact and cal.error == pytest.approx(DEADBAND / 2)
    cal.update(_rates(0.010, 0.020), _rates(0.010, 0.010), 150.0, 100.0, last=True)
    assert cal.scale.exact and cal.error == pytest.approx(0.5)


def test_margin_is_the_floor_until_a_step_measured_the_error():
    cal = Calibration()
    assert cal.margin(0.01) == 0.01
    cal.update(_rates(0.01, 0.01), _rates(0.01, 0.01), 104.0, 100.0)
    assert cal.margin(0.01) == pytest.approx(0.04)
    assert cal.margin(0.10) == 0.10


def _spec(i: int) -> TrajectorySpec:
    return TrajectorySpec(f"s0-p{i}-g0", "swe", i, 0, 0, (TurnSpec(100, 50, 0.0, True),), seed=i)


def test_end_replays_the_step_in_the_split_it_ran_until_the_corrected_model_reproduces_it():
    cal = Calibration()
    cal.scale = ModelScale(decode=0.9)
    cal.begin(10.0, (1, 2, 0))
    for i in range(MIN_LEGS):
        for ev in _turn(f"s0-p{i}-g0", 0, 10.0, 1.0, 4.0, 100, 50, last=True):  # the step: 5 s, decodes 4 s
            cal.observe(ev)
    asked = []

    def rehearse(specs, split, *, scale=None, events=None):
        """A world whose decodes take 2 s under a model of decode 0.9: 4 s under decode 0.45."""
        asked.append((len(specs), split, round(scale.decode, 6)))
        leg = 2.0 * 0.9 / scale.decode
        for i in range(len(specs)):
            events.extend(_turn(f"s0-p{i}-g0", 0, 0.0, 1.0, leg, 100, 50, last=True))
        return 1.0 + leg

    why = cal.end([_spec(i) for i in range(MIN_LEGS)], rehearse)
    # 2 s against 4 s: x0.5, clamped to 1 / MAX_STEP; then 3 s against 4 s: x0.75; then exact
    assert asked == [(MIN_LEGS, (1, 2, 0), 0.9), (MIN_LEGS, (1, 2, 0), 0.6), (MIN_LEGS, (1, 2, 0), 0.45)]
    assert cal.scale.decode == pytest.approx(0.45) and cal.scale.prefill == 1.0
    assert cal.error == pytest.approx(0.0, abs=1e-9) and cal.replays == 3
    assert "5.0 s against 3.0 s rehearsed" in why and "0.0% off" in why


def test_end_skips_a_step_that_switched_mid_way():
    cal = Calibration()
    cal.begin(0.0, (1, 2, 0))
    for i in range(MIN_LEGS):
        for ev in _turn(f"s0-p{i}-g0", 0, 0.0, 1.0, 4.0, 100, 50, last=True):
            cal.observe(ev)
    cal.moved()
    assert cal.end([_spec(0)], lambda *a, **k: pytest.fail("a switched step is not replayed")) == ""
    assert cal.error is None and cal.scale.exact


def test_end_corrects_at_most_rounds_minus_one_times_and_the_last_replay_only_measures():
    """A rehearsal that stays 2x off whatever the correction (its decodes take 2 s, the step's 4 s):
    each round moves decode by 1 / MAX_STEP, the last replays under the correction without moving it."""
    from prorsa.control.calibration import ROUNDS

    cal = Calibration()
    cal.begin(0.0, (0, 0, 2))
    for i in range(MIN_LEGS):
        for ev in _turn(f"s0-p{i}-g0", 0, 0.0, None, 4.0, 100, 50, last=True):
            cal.observe(ev)
    asked = []

    def rehearse(specs, split, *, scale=None, events=None):
        asked.append(round(scale.decode, 6))
        for i in range(len(specs)):
            events.extend(_turn(f"s0-p{i}-g0", 0, 0.0, None, 2.0, 100, 50, last=True))
        return 2.0

    cal.end([_spec(i) for i in range(MIN_LEGS)], rehearse)
    assert asked == [round(MAX_STEP ** -k, 6) for k in range(ROUNDS)]
    assert cal.scale.decode == pytest.approx(MAX_STEP ** -(ROUNDS - 1)) and cal.replays == ROUNDS
    assert cal.error == pytest.approx(1.0)  # the step's 4 s against the last replay's 2 s
