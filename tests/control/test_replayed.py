"""What a policy rehearses (control/replayed.py): a step's decodes scaled, its resamples and fills.
Resamples and fills are drawn by fixed rules, so a rehearsal (and every simulated figure that holds
one) is the same in every run and every version: their draws and seeds are pinned here."""

from __future__ import annotations

from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.control.replayed import decodes_as, fill, resampled, scaled_decodes


def _step(prompts: int = 4, members: int = 2, decode: int = 10) -> list[TrajectorySpec]:
    """One synchronous step: `prompts` GRPO groups of `members`, seeded 10 x prompt + member."""
    turns = (TurnSpec(100, decode, 1.0, False), TurnSpec(50, decode * 3, 0.0, True))
    return [TrajectorySpec(f"s0-p{p}-g{g}", "swe", p, g, 0, turns, seed=10 * p + g)
            for p in range(prompts) for g in range(members)]


def _decodes(specs) -> list[int]:
    return [t.decode_tokens for s in specs for t in s.turns]


def test_scaled_decodes_multiply_every_turn_and_keep_at_least_one_token():
    assert _decodes(scaled_decodes(_step(1, 1), 2.5)) == [25, 75]
    assert _decodes(scaled_decodes(_step(1, 1), 0.01)) == [1, 1]  # 0.1 and 0.3 round to 0: one token kept
    assert _decodes(scaled_decodes(_step(1, 1), 0.05)) == [1, 2]


def test_an_older_step_is_scaled_to_the_decodes_ahead():
    """Older decodes average 20 tokens, those ahead 40: the older step replays at twice its own."""
    older, ahead = _step(2, 1, decode=10), _step(2, 1, decode=20)
    assert _decodes(decodes_as(ahead, older)) == [20, 60, 20, 60]
    assert decodes_as([], older) == [] and decodes_as(ahead, []) == []


def test_a_resample_is_the_same_draw_of_groups_and_seeds_in_every_version():
    step = _step()
    r0 = resampled(step, 0)
    assert [s.traj_id for s in r0] == ["s0-p2-g0~0.0", "s0-p2-g1~0.0", "s0-p2-g0~0.1", "s0-p2-g1~0.1",
                                       "s0-p3-g0~0.2", "s0-p3-g1~0.2", "s0-p2-g0~0.3", "s0-p2-g1~0.3"]
    assert [s.seed for s in r0] == [2654435781, 2654435782, 2654476284, 2654476285,
                                    2654516797, 2654516798, 2654557290, 2654557291]
    r2 = resampled(step, 2)  # seeds past 2**32 before the modulus
    assert [s.traj_id.split("~")[0] for s in r2] == ["s0-p0-g0", "s0-p0-g1", "s0-p3-g0", "s0-p3-g1",
                                                     "s0-p2-g0", "s0-p2-g1", "s0-p3-g0", "s0-p3-g1"]
    assert [s.seed for s in r2] == [3668339987, 3668339988, 3668380520, 3668380521,
                                    3668421013, 3668421014, 3668461526, 3668461527]
    assert [s.prompt_index for s in r2] == [0, 0, 1, 1, 2, 2, 3, 3]  # each drawn group a prompt of its own


def test_a_fill_cycles_the_specs_each_repeat_with_seeds_of_its_own():
    got = fill(_step()[:3], 7)
    assert [s.traj_id for s in got] == ["s0-p0-g0", "s0-p0-g1", "s0-p1-g0"] * 2 + ["s0-p0-g0"]
    assert [s.seed for s in got] == [0, 1, 10, 2654435761, 2654435762, 2654435771, 1013904226]
    assert fill(_step()[:3], 0) == _step()[:3]
