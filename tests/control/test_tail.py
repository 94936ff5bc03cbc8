"""Trajectory-level scheduling: the remaining-work prediction and the admission key it gives."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from prorsa.control.tail import MIN_FINISHED, RemainingWork, TurnScheduler


@dataclass(frozen=True)
class Turn:
    turn: int
    traj_id: str = "t"
    family: str = "swe"
    group: str = ""
    done: bool = False
    context_tokens: int = 0


def test_before_anything_ends_every_turn_is_first_come():
    s = TurnScheduler(RemainingWork(max_turns=12), priority=True)
    assert s.key(Turn(0, group="0-1"), now=5.0) == 5.0
    assert s.key(Turn(3, group="0-2"), now=5.0) == 5.0  # no pace seen: nothing to weigh it by


def test_a_group_that_decodes_long_is_predicted_long():
    w = RemainingWork(max_turns=12, decode_prior=500, prior_weight=4)
    for _ in range(8):
        w.decoded("short", "math", 200, 2.0)
        w.decoded("long", "math", 2000, 20.0)
    assert w.per_turn("long", "math") > w.per_turn("", "math") > w.per_turn("short", "math")
    # shrunk toward the family's mean (1100 over 16 decodes) by 4 turns' weight
    assert w.per_turn("long", "math") == pytest.approx((8 * 2000 + 4 * 1100) / 12)


def test_turns_left_are_progressive_until_finished_counts_say_otherwise():
    w = RemainingWork(max_turns=10)
    assert [w.turns_left("swe", k) for k in (0, 2, 6, 9)] == [1.0, 3.0, 4.0, 1.0]  # capped by max_turns
    for _ in range(MIN_FINISHED):
        w.finished("swe", 5)
    assert w.turns_left("swe", 0) == pytest.approx(5.0)
    assert w.turns_left("swe", 3) == pytest.approx(2.0)
    assert w.turns_left("swe", 5) == 5.0  # none went past turn 5: progressive again (6), within max_turns


def test_the_key_subtracts_the_predicted_remaining_seconds_and_learns_from_ended_turns():
    s = TurnScheduler(RemainingWork(max_turns=None, decode_prior=100), priority=True)
    s.ended(Turn(0, group="g"), decode_tokens=1000, decode_s=10.0)  # pace: 0.01 s a token
    # group g: (1000 + 4 * 1000) / 5 = 1000 tokens a turn; at turn 2, 3 turns left (progressive)
    assert s.key(Turn(2, group="g"), now=50.0) == pytest.approx(50.0 - 3 * 1000 * 0.01)
    assert s.key(Turn(2, group="g"), now=50.0) < s.key(Turn(0, group="g"), now=50.0)


def test_options_off_change_nothing():
    s = TurnScheduler(RemainingWork(), priority=False, spread=False)
    s.ended(Turn(0, done=True), 1000, 10.0)
    assert s.key(Turn(3), now=7.0) == 0.0 and s.remaining(Turn(3)) is None
    assert s.work.per_turn("", "swe") == s.work.decode_prior  # it learned nothing


def test_spread_gives_the_router_the_trajectorys_remainder():
    s = TurnScheduler(RemainingWork(max_turns=12, decode_prior=300), spread=True)
    assert s.key(Turn(1), now=3.0) == 0.0
    assert s.remaining(Turn(1)) == pytest.approx(2 * 300)
    s.ended(Turn(11, done=True), 300, 1.0)  # a trajectory of 12 turns ended
    assert s.work._turns["swe"].counts == [12]


def test_a_trajectory_near_its_context_budget_has_little_left():
    w = RemainingWork(max_turns=None, decode_prior=1000, max_context=10_000)
    assert w.tokens("", "math", 3, context=1000) == pytest.approx(4 * 1000)  # 4 turns left (progressive)
    assert w.tokens("", "math", 3, context=9000) == pytest.approx(1000)  # the budget leaves 1000
    assert w.tokens("", "math", 3, context=12_000) == 1  # past it: still ordered, last


def test_the_oracle_reads_the_remainder_off_the_spec():
    from prorsa.agent.trace import TrajectorySpec, TurnSpec

    spec = TrajectorySpec(traj_id="t", family="swe", seed=0, step=0, prompt_index=0, group_index=0,
                          turns=(TurnSpec(10, 100, 1.0, False), TurnSpec(10, 300, 1.0, False), TurnSpec(10, 50, 0.0, True)))
    s = TurnScheduler(RemainingWork(), priority=True, spread=True, future=lambda traj: spec)
    assert s.remaining(Turn(1)) == 350
    s.ended(Turn(0), decode_tokens=100, decode_s=2.0)  # pace 0.02 s a token
    assert s.key(Turn(1), now=10.0) == pytest.approx(10.0 - 350 * 0.02)


def test_an_earlier_runs_trajectories_give_turn_counts_from_the_start():
    from prorsa.agent.trace import TrajectorySpec, TurnSpec

    def spec(n: int, decode: int) -> TrajectorySpec:
        turns = tuple(TurnSpec(10, decode, 0.0 if k == n - 1 else 1.0, k == n - 1) for k in range(n))
        return TrajectorySpec(traj_id=f"p{n}", family="swe", seed=0, step=0, prompt_index=0, group_index=0,
                              turns=turns)

    w = RemainingWork(max_turns=None, decode_prior=100)
    w.learn_from([spec(6, 300)] * MIN_FINISHED)
    assert w.turns_left("swe", 0) == pytest.approx(6.0) and w.turns_left("swe", 4) == pytest.approx(2.0)
    assert w.per_turn("", "swe") == pytest.approx(300)
    assert w.seconds("", "swe", 0) == 0.0  # an earlier run's pace is not this one's


def test_migrate_gives_the_router_what_is_left_after_the_turn():
    s = TurnScheduler(RemainingWork(max_turns=4, decode_prior=300), migrate=True)
    assert s.active and s.key(Turn(0), now=5.0) == 0.0 and s.remaining(Turn(0)) is None
    # after turn 1 of at most 4, progressive: two more turns of the prior's 300 tokens
    assert s.left_after(Turn(1), decoded=100) == pytest.approx(s.work.tokens("", "swe", 2, 100))
    assert s.left_after(Turn(1), decoded=100) > 0
    assert TurnScheduler(RemainingWork(), migrate=False).left_after(Turn(1), decoded=100) is None
    assert s.left_after(Turn(3, done=True), decoded=100) is None  # no next turn to place
