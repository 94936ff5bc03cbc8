"""The oracle's replays of its own run (PolicyContext.future_run), with a stand-in for the
simulator: it opens on the split whose replay is fastest and takes a move only where the replay
with the move is faster than without."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prorsa.control.adaptive import MAX_REHEARSED
from prorsa.control.allocator import splits
from prorsa.control.policy import FutureRun, PolicyContext, Replay, Snapshot, make_policy
from prorsa.loads import EngineLoad
from prorsa.roles import Role

P, D, M = Role.PREFILL, Role.DECODE, Role.MIXED


class Replays:
    """A FutureRun's replay: each split's time from `opening`, each move list's from `moves`."""

    def __init__(self, opening: dict, moves: dict | None = None, default: float = 10.0) -> None:
        self.opening, self.moves, self.default = opening, moves or {}, default
        self.calls: list[tuple] = []

    def __call__(self, opening, moves, first):
        self.calls.append((opening, tuple(moves), first))
        if moves:
            return self.moves.get(tuple(mv[2] for mv in moves), self.default)
        return self.opening.get(opening, self.default)


def oracle(replays: Replays, trajectories: int | None = 256):
    ctx = replace(PolicyContext.default(), future=lambda traj_id: None, concurrency=32,
                  future_run=FutureRun(trajectories, replays))
    return make_policy("oracle", ctx)


def engines(roles: list[Role]) -> list[EngineLoad]:
    return [EngineLoad(f"e{i}", r, 0, 0, 0, 100_000) for i, r in enumerate(roles)]


def test_the_oracle_opens_on_the_split_whose_replay_of_the_run_is_fastest():
    replays = Replays({(2, 5, 1): 9.0, (1, 6, 1): 9.2, (1, 7, 0): 9.5, (0, 0, 8): 10.0})
    o = oracle(replays)
    assert o.initial_roles(8) == [P] * 2 + [D] * 5 + [M]
    # all mixed, every P:D and every P beside mixed ones, then the neighbours of the best (1:7,
    # then 1:6:1 and 2:5:1 from it), whole (no cut), from the run's start with no move
    replayed = [c[0] for c in replays.calls]
    assert replayed[0] == (0, 0, 8) and {(p, 8 - p, 0) for p in range(1, 8)} <= set(replayed)
    assert {(p, 0, 8 - p) for p in range(1, 8)} <= set(replayed) and (2, 5, 1) in replayed
    assert set(replayed) <= set(map(tuple, splits(8).tolist())) and len(set(replayed)) == len(replayed)
    assert all(moves == () and first == MAX_REHEARSED for _, moves, first in replays.calls)
    assert "oracle" in o.opening_reason


def test_the_oracle_searches_on_from_the_best_split_to_one_two_engines_away():
    """A split no P:D or P:mixed one is next to is reached step by step while each step gains."""
    o = oracle(Replays({(1, 7, 0): 9.5, (1, 6, 1): 9.4, (1, 5, 2): 9.3, (0, 0, 8): 10.0}))
    assert o.initial_roles(8) == [P] + [D] * 5 + [M] * 2


def test_of_splits_whose_replays_tie_the_oracle_opens_all_mixed():
    o = oracle(Replays({(1, 7, 0): 10.0, (0, 0, 8): 10.0}))
    assert o.initial_roles(8) == [M] * 8


def test_a_move_goes_through_only_where_the_replayed_run_with_it_is_faster():
    better = (("e3", P),)
    replays = Replays({(1, 3, 0): 9.0}, moves={(better,): 8.5, ((("e1", M),),): 9.2})
    o = oracle(replays)
    assert o.initial_roles(4) == [P, D, D, D]
    moved, why = o._weighed("decide", 12.0, (1, 3, 0), (1, 2, 1), {"e1": M})
    assert not moved and "refused" in why and o._moves == []
    moved, why = o._weighed("decide", 12.0, (1, 3, 0), (2, 2, 0), {"e3": P})
    assert moved and o._moves == [("decide", 12.0, better)] and o._expected == 8.5
    # the next move is replayed after the one taken, as the run will have made it
    o._weighed("decide", 30.0, (2, 2, 0), (2, 1, 1), {"e2": M})
    assert replays.calls[-1][1] == (("decide", 12.0, better), ("decide", 30.0, (("e2", M),)))


def test_a_refused_goal_is_not_replayed_again_until_a_tenth_of_the_run_has_passed():
    replays = Replays({(1, 3, 0): 1.0})  # 256 trajectories at 1 s each: a 256 s run
    o = oracle(replays)
    o.initial_roles(4)
    n = len(replays.calls)
    assert not o._weighed("decide", 10.0, (1, 3, 0), (2, 2, 0), {"e1": P})[0]
    assert not o._weighed("decide", 30.0, (1, 3, 0), (2, 2, 0), {"e1": P})[0]
    assert len(replays.calls) == n + 1
    o._weighed("decide", 36.0, (1, 3, 0), (2, 2, 0), {"e1": P})
    assert len(replays.calls) == n + 2


def test_past_max_rehearsed_trajectories_the_oracle_opens_on_the_cut_replay_and_weighs_no_move():
    replays = Replays({(1, 3, 0): 9.0}, moves={((("e1", P),),): 1.0})
    o = oracle(replays, trajectories=MAX_REHEARSED + 1)
    assert o.initial_roles(4) == [P, D, D, D] and "first" in o.opening_reason
    n = len(replays.calls)
    moved, why = o._weighed("decide", 5.0, (1, 3, 0), (2, 2, 0), {"e1": P})
    assert not moved and "opening only" in why and len(replays.calls) == n


def test_prorsa_never_replays_the_run_even_when_a_context_carries_it():
    def refuse(*_):
        raise AssertionError("prorsa read the run's future")

    ctx = replace(PolicyContext.default(), concurrency=32, future_run=FutureRun(256, refuse))
    p = make_policy("prorsa", ctx)
    assert p.initial_roles(8) == [M] * 8
    p.decide(Snapshot(1.0, tuple(engines([M] * 8))))


def test_a_replay_opens_in_its_split_and_makes_each_move_at_the_first_call_of_its_hook_and_time():
    r = Replay((1, 2, 1), [("decide", 5.0, (("e0", D),)), ("between_steps", 7.0, (("e3", P),))])
    assert r.initial_roles(4) == [P, D, D, M]
    with pytest.raises(ValueError):
        r.initial_roles(5)
    snap = lambda t: Snapshot(t, tuple(engines([P, D, D, M])))  # noqa: E731
    assert r.decide(snap(4.0)).targets == {}
    assert r.between_steps(snap(6.0)).targets == {}
    assert r.decide(snap(5.5)).targets == {"e0": D}
    assert r.decide(snap(8.0)).targets == {}  # the next move waits for between_steps
    assert r.between_steps(snap(8.0)).targets == {"e3": P}
