r"""Trajectory lifecycle: the events a body reports and the per-trajectory state they add up to.

A body (the live Dask scheduler plugin, or the simulator) turns what it sees into LifecycleEvents
and hands them to the policy inside its Snapshot; the policy keeps them in a LifecycleTracker.

    LifecycleEvent(...)            one transition: trajectory `traj_id` entered `phase` at `time_s`
    LifecycleEvent.to_dict()       the event as a plain dict, for a trace
    LifecycleTracker.apply(ev)     fold one event in; False when it was stale or a duplicate
    LifecycleTracker.get(traj)     the trajectory's current state, or None (unknown or finished)
    LifecycleTracker.live()        the states of every trajectory not yet done or failed
    LifecycleTracker.table()       the same as numbers, one row each (family code, phase rank,
                                   since_s, turn, context, appended, decoded): for numpy callers
    LifecycleTracker.counts()      phase name -> trajectories in it (done/failed: cumulative)

One turn, in event order (a colocated body may skip PREFILL):

    QUEUED --> PREFILL --> DECODE --> TOOL --> QUEUED (turn k+1) ...
     tokens=append        tokens=0   tokens=generated
                                 \--> DONE | FAILED    (after the last turn's decode)

Events may arrive late or twice (retries, several reporters). The tracker orders them by
(turn, phase rank) and ignores any event that is not newer than the trajectory's current one,
except that a late QUEUED/PREFILL of the current turn still fills in an append it did not know.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from enum import Enum

import numpy as np


class Phase(str, Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    TOOL = "tool"
    DONE = "done"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        """Order within a turn; DONE and FAILED share the last rank (either ends it)."""
        return _RANK[self]

    @property
    def finished(self) -> bool:
        return self is Phase.DONE or self is Phase.FAILED


_RANK = {Phase.QUEUED: 0, Phase.PREFILL: 1, Phase.DECODE: 2, Phase.TOOL: 3,
         Phase.DONE: 4, Phase.FAILED: 4}


@dataclass(frozen=True)
class LifecycleEvent:
    time_s: float  # body clock, seconds since rollout start
    traj_id: str
    family: str  # task family name (swe, search, math-tir, terminal, ...)
    turn: int  # 0-based turn index
    phase: Phase  # the phase ENTERED at time_s
    tokens: int = 0  # QUEUED/PREFILL: prompt tokens this turn appends; TOOL: tokens generated
    context: int = 0  # context tokens before this turn's append
    engine: str = ""  # engine serving the phase, when there is one

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["phase"] = self.phase.value
        return d


@dataclass(frozen=True)
class TrajectoryState:
    traj_id: str
    family: str
    turn: int  # the current turn
    phase: Phase  # the phase it is in
    since_s: float  # when it entered that phase
    context: int  # context tokens before this turn's append
    appended: int  # tokens this turn appends (0 until a QUEUED/PREFILL event said)
    decoded: int  # tokens this turn generated (known from TOOL on; 0 before)
    engine: str = ""  # engine of the current phase, if the body named one

    @property
    def order(self) -> tuple[int, int]:
        return self.turn, self.phase.rank


class LifecycleTracker:
    """Current state of every trajectory, built from possibly disordered events."""

    def __init__(self) -> None:
        self._live: dict[str, TrajectoryState] = {}
        self._codes: dict[str, int] = {}  # family -> code in table()
        self._slot: dict[str, int] = {}  # traj -> its row in _rows, kept beside _live
        self._free: list[int] = []  # rows of finished trajectories, to reuse
        self._rows = np.zeros((64, 7))
        self._used = np.zeros(64, dtype=bool)
        self._finished: dict[str, Phase] = {}  # kept so a late event cannot resurrect one
        self._done = 0
        self._failed = 0

    def apply(self, ev: LifecycleEvent) -> bool:
        if ev.traj_id in self._finished:
            return False
        cur = self._live.get(ev.traj_id)
        if cur is not None and (ev.turn, ev.phase.rank) <= cur.order:
            self._fill_in(cur, ev)
            return False
        if ev.phase.finished:
            self._live.pop(ev.traj_id, None)
            slot = self._slot.pop(ev.traj_id, None)
            if slot is not None:
                self._used[slot] = False
                self._free.append(slot)
            self._finished[ev.traj_id] = ev.phase
            if ev.phase is Phase.DONE:
                self._done += 1
            else:
                self._failed += 1
            return True
        self._set(_advance(cur, ev))
        return True

    def apply_all(self, events: Iterable[LifecycleEvent]) -> None:
        for ev in events:
            self.apply(ev)

    def get(self, traj_id: str) -> TrajectoryState | None:
        return self._live.get(traj_id)

    def live(self) -> list[TrajectoryState]:
        return list(self._live.values())

    def table(self) -> tuple[list[str], np.ndarray]:
        """(family names by code, a fresh array of the live trajectories' rows)."""
        return list(self._codes), self._rows[self._used]

    def __len__(self) -> int:
        return len(self._live)

    def counts(self) -> dict[str, int]:
        out = {p.value: 0 for p in Phase}
        for s in self._live.values():
            out[s.phase.value] += 1
        out[Phase.DONE.value] = self._done
        out[Phase.FAILED.value] = self._failed
        return out

    def _fill_in(self, cur: TrajectoryState, ev: LifecycleEvent) -> None:
        """A late QUEUED/PREFILL of the current turn still carries the append size."""
        if (ev.turn == cur.turn and ev.phase.rank <= Phase.PREFILL.rank
                and cur.appended == 0 and ev.tokens > 0):
            self._set(replace(cur, appended=ev.tokens, context=ev.context or cur.context))

    def _set(self, s: TrajectoryState) -> None:
        self._live[s.traj_id] = s
        slot = self._slot.get(s.traj_id)
        if slot is None:
            slot = self._slot[s.traj_id] = self._free.pop() if self._free else self._grow()
            self._used[slot] = True
        code = self._codes.setdefault(s.family, len(self._codes))
        self._rows[slot] = (code, _RANK[s.phase], s.since_s, s.turn, s.context, s.appended, s.decoded)

    def _grow(self) -> int:
        n = len(self._slot) + len(self._free)  # rows handed out so far
        if n >= len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
            self._used = np.concatenate([self._used, np.zeros_like(self._used)])
        return n


def _advance(cur: TrajectoryState | None, ev: LifecycleEvent) -> TrajectoryState:
    """The state after a newer event: same turn keeps what it knew, a new turn starts afresh."""
    brings_append = ev.phase.rank <= Phase.PREFILL.rank
    if cur is not None and cur.turn == ev.turn:
        return replace(
            cur, phase=ev.phase, since_s=ev.time_s, engine=ev.engine or cur.engine,
            appended=ev.tokens if brings_append and ev.tokens > 0 else cur.appended,
            context=ev.context or cur.context,
            decoded=ev.tokens if ev.phase is Phase.TOOL else cur.decoded)
    context = ev.context
    if not context and cur is not None:  # the body left it out: what the history adds up to
        context = cur.context + cur.appended + cur.decoded
    return TrajectoryState(
        traj_id=ev.traj_id, family=ev.family, turn=ev.turn, phase=ev.phase, since_s=ev.time_s,
        context=context, appended=ev.tokens if brings_append else 0,
        decoded=ev.tokens if ev.phase is Phase.TOOL else 0, engine=ev.engine)
