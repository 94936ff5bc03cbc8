"""The lifecycle tracker: state from events, tolerance to late and repeated events."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prorsa.control.lifecycle import LifecycleEvent, LifecycleTracker, Phase


def turn_events(traj: str, turn: int, t: float, append: int, context: int, decoded: int,
                last: bool = False) -> list[LifecycleEvent]:
    def e(dt: float, phase: Phase, tokens: int = 0) -> LifecycleEvent:
        return LifecycleEvent(t + dt, traj, "swe", turn, phase, tokens, context)

    return [e(0.0, Phase.QUEUED, append), e(0.1, Phase.PREFILL, append), e(0.2, Phase.DECODE),
            e(1.0, Phase.DONE if last else Phase.TOOL, decoded)]


def test_state_follows_a_trajectory():
    tr = LifecycleTracker()
    for ev in turn_events("a", 0, 0.0, append=500, context=0, decoded=120)[:3]:
        assert tr.apply(ev)
    s = tr.get("a")
    assert (s.turn, s.phase, s.since_s, s.appended, s.decoded) == (0, Phase.DECODE, 0.2, 500, 0)
    tr.apply(turn_events("a", 0, 0.0, 500, 0, 120)[3])
    assert tr.get("a").phase is Phase.TOOL and tr.get("a").decoded == 120
    # Turn 1 with its context left out: the tracker adds up what the history holds.
    tr.apply(LifecycleEvent(2.0, "a", "swe", 1, Phase.QUEUED, tokens=80))
    s = tr.get("a")
    assert (s.turn, s.phase, s.context, s.appended, s.decoded) == (1, Phase.QUEUED, 620, 80, 0)
    assert tr.counts()["queued"] == 1 and len(tr) == 1


def test_stale_duplicate_and_finished_events_are_ignored():
    tr = LifecycleTracker()
    q, p, d, tool = turn_events("a", 0, 0.0, 500, 0, 120)
    assert tr.apply(q) and tr.apply(d)  # PREFILL skipped (colocated) or late
    assert not tr.apply(p)  # late: older than DECODE
    assert not tr.apply(d)  # duplicate
    assert tr.get("a").phase is Phase.DECODE
    for ev in turn_events("a", 1, 3.0, 90, 620, 50, last=True):
        tr.apply(ev)
    assert tr.get("a") is None and tr.counts()["done"] == 1
    assert not tr.apply(tool)  # a retry's late report after the end does not resurrect it
    assert not tr.apply(LifecycleEvent(9.0, "a", "swe", 2, Phase.QUEUED, 10))
    assert tr.live() == []


def test_a_late_append_is_filled_in():
    tr = LifecycleTracker()
    tr.apply(LifecycleEvent(1.0, "a", "search", 0, Phase.DECODE, context=0))
    assert tr.get("a").appended == 0
    assert not tr.apply(LifecycleEvent(0.5, "a", "search", 0, Phase.QUEUED, tokens=300))
    assert tr.get("a").appended == 300 and tr.get("a").phase is Phase.DECODE


def test_counts_and_table_agree_with_live():
    tr = LifecycleTracker()
    for i, phase in enumerate([Phase.QUEUED, Phase.DECODE, Phase.TOOL, Phase.FAILED]):
        tr.apply(LifecycleEvent(float(i), f"t{i}", "math-tir" if i % 2 else "swe", 0, phase, 7, 11))
    counts = tr.counts()
    assert counts == {"queued": 1, "prefill": 0, "decode": 1, "tool": 1, "done": 0, "failed": 1}
    names, rows = tr.table()
    assert rows.shape == (3, 7) and names == ["swe", "math-tir"]
    by_id = {s.traj_id: s for s in tr.live()}
    assert [names[int(r[0])] for r in rows] == [by_id[t].family for t in ("t0", "t1", "t2")]
    assert list(rows[:, 1]) == [0, 2, 3] and list(rows[:, 4]) == [11, 11, 11]


def test_event_to_dict_is_plain():
    d = LifecycleEvent(1.5, "a", "swe", 2, Phase.TOOL, 40, 900, "e1").to_dict()
    assert d == {"time_s": 1.5, "traj_id": "a", "family": "swe", "turn": 2, "phase": "tool",
                 "tokens": 40, "context": 900, "engine": "e1"}


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.randoms(use_true_random=False), st.integers(0, 6))
def test_any_arrival_order_ends_in_the_newest_state(turns, rnd, dups):
    """Shuffled and repeated events leave the trajectory where its newest event put it."""
    events = []
    ctx = 0
    for k in range(turns):
        events += turn_events("a", k, 2.0 * k, 100 + k, ctx, 10 + k, last=k == turns - 1)
        ctx += 100 + k + 10 + k
    stop = rnd.randrange(1, len(events) + 1)  # the run so far
    seen = events[:stop]
    shuffled = seen + [rnd.choice(seen) for _ in range(dups)]
    rnd.shuffle(shuffled)
    tr = LifecycleTracker()
    for ev in shuffled:
        tr.apply(ev)
    newest = seen[-1]
    if newest.phase.finished:
        assert tr.get("a") is None and tr.counts()[newest.phase.value] == 1
    else:
        s = tr.get("a")
        assert (s.turn, s.phase) == (newest.turn, newest.phase)
        assert s.context == newest.context


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.sampled_from(list(Phase))),
                max_size=60))
def test_table_matches_live_as_trajectories_come_and_go(steps):
    tr = LifecycleTracker()
    for i, (traj, turn, phase) in enumerate(steps):
        tr.apply(LifecycleEvent(float(i), f"t{traj}", f"fam{traj % 2}", turn, phase, i, 2 * i))
    names, rows = tr.table()
    got = sorted((names[int(r[0])], *r[1:].tolist()) for r in rows)
    want = sorted((s.family, s.phase.rank, s.since_s, s.turn, s.context, s.appended, s.decoded)
                  for s in tr.live())
    assert got == want
