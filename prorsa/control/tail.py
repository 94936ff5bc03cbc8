"""Trajectory-level scheduling: what each trajectory has left, and the admission key it earns.

A synchronous step ends when its slowest trajectory ends. Scheduling every turn alike lets a
trajectory with most of its work ahead queue behind ones about to finish; giving the longest
predicted remainders the engines first (longest remaining processing time first) shortens the
step, and a key that also counts how long a turn has waited keeps anything from waiting forever.

    RemainingWork(max_turns, decode_prior, max_context=None)
        decoded(group, family, tokens, seconds)   a turn's decode ended: learn from it
        finished(family, turns)                   a trajectory ended after `turns` turns
        learn_from(specs)                         an earlier run's trajectories (the pipeline's prior)
        tokens(group, family, turn, context) -> float   decode tokens it has left, turn `turn`'s
                                                  included, with `context` tokens in it now
        seconds(group, family, turn, context) -> float  the same at the pace decodes ran in this run
    TurnScheduler(work, priority, spread[, future, migrate])   what the runners ask, once per turn:
        key(turn, now) -> float                   the turn's admission key (0 when priority is off)
        remaining(turn) -> float | None           tokens the router prices a move by (None when
                                                  spread is off: one mean turn, as before)
        left_after(turn, decoded) -> float | None   tokens left once this turn decoded `decoded`:
                                                  what a migration during its tool call is priced
                                                  by (None when migrate is off or the turn was its last)
        ended(turn, decode_tokens, decode_s)      feed it what the turn showed (its trajectory's
                                                  end too, when it was the last turn)
        began(turn)                               a turn was routed (kept with `tail` on)
        in_flight() -> [(traj_id, Left)]          the trajectories in flight and their predicted
                                                  remainders (`tail`: control/tail_layout.py)

What it may know is what a run observes (the policy rule of DESIGN.md): the decodes that ended,
the turn counts of trajectories that finished, and what the pipeline declares (max_turns, the
context budget of its task family or max_context).
  decode per turn   the trajectory's GRPO group pooled (members share the task, hence its
                    difficulty), shrunk toward its family's mean by `prior_weight` turns
  turns left        the mean of E[T - k | T > k] over the family's finished trajectories (this
                    run's, and an earlier run's given as `prior:`) once `MIN_FINISHED` of them
                    went past turn k; before that, progressive: as many again as it has done
                    (a long trajectory is likely to stay long), within max_turns
  at most           what the context budget leaves: a trajectory near it has little left,
                    however many turns it would otherwise be given
With `future` (simulator only, scheduling.oracle: the one labelled exception to the rule above)
the remainder is read off the trajectory's spec instead: what prediction leaves on the table.

The key is the turn's send time minus its predicted remaining decode seconds: an earliest-
deadline-first order in which a trajectory far from its end may overtake turns sent up to that
long before it, never more.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from prorsa.agent.trace import TrajectorySpec
from prorsa.control.tail_layout import Left

MIN_FINISHED = 8  # finished trajectories past turn k before their turn counts replace the progressive guess
_KEEP = 4096  # finished turn counts remembered per family (the most recent)


class _Mean:
    __slots__ = ("total", "n")

    def __init__(self) -> None:
        self.total, self.n = 0.0, 0

    def add(self, x: float) -> None:
        self.total += x
        self.n += 1


class _Turns:
    """A family's finished turn counts, for E[T - k | T > k] in O(log n)."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self._sorted: np.ndarray | None = None
        self._suffix: np.ndarray | None = None

    def add(self, turns: int) -> None:
        self.counts.append(turns)
        if len(self.counts) > _KEEP:
            del self.counts[: len(self.counts) - _KEEP]
        self._sorted = None

    def left(self, k: int) -> float | None:
        """Mean turns left, turn k's included, over those that went past turn k; None if too few."""
        if self._sorted is None:
            self._sorted = np.sort(np.asarray(self.counts, dtype=float))
            self._suffix = np.concatenate([np.cumsum(self._sorted[::-1])[::-1], [0.0]])
        i = int(np.searchsorted(self._sorted, k, side="right"))
        n = len(self._sorted) - i
        if n < MIN_FINISHED:
            return None
        return float(self._suffix[i]) / n - k


class RemainingWork:
    def __init__(self, max_turns: int | None = None, decode_prior: float = 512.0,
                 prior_weight: float = 4.0, max_context: int | None = None) -> None:
        self.max_turns = max_turns  # the pipeline's cap: no trajectory runs past it
        self.max_context = max_context  # the task's context budget: its decodes and appends fit in it
        self.decode_prior = decode_prior  # tokens a turn decodes before any decode has ended
        self.prior_weight = prior_weight  # turns the family's mean is worth against a group's own
        self._family: dict[str, _Mean] = defaultdict(_Mean)
        self._group: dict[str, _Mean] = defaultdict(_Mean)
        self._turns: dict[str, _Turns] = defaultdict(_Turns)
        self._pace = _Mean()  # decode seconds per token, over every decode that ended

    def decoded(self, group: str, family: str, tokens: int, seconds: float) -> None:
        self._family[family].add(tokens)
        if group:
            self._group[group].add(tokens)
        if tokens > 0:
            self._pace.total += seconds
            self._pace.n += tokens

    def finished(self, family: str, turns: int) -> None:
        self._turns[family].add(turns)

    def learn_from(self, specs: Iterable[TrajectorySpec]) -> None:
        """An earlier run's trajectories as they ran: their turn counts and decodes (not their
        pace, which was another run's engines')."""
        for spec in specs:
            self.finished(spec.family, len(spec.turns))
            fam = self._family[spec.family]
            for t in spec.turns:
                fam.add(t.decode_tokens)

    def per_turn(self, group: str, family: str) -> float:
        fam = self._family.get(family)
        mean = (fam.total / fam.n) if fam is not None and fam.n else self.decode_prior
        own = self._group.get(group) if group else None
        if own is None or not own.n:
            return mean
        w = self.prior_weight
        return (own.total + w * mean) / (own.n + w)

    def turns_left(self, family: str, turn: int) -> float:
        learned = self._turns[family].left(turn) if family in self._turns else None
        left = learned if learned is not None else float(turn + 1)  # progressive: as many again
        if self.max_turns is not None:
            left = min(left, float(self.max_turns - turn))
        return max(left, 1.0)

    def tokens(self, group: str, family: str, turn: int, context: int = 0) -> float:
        left = self.per_turn(group, family) * self.turns_left(family, turn)
        if self.max_context is not None:
            left = min(left, max(self.max_context - context, 1))
        return left

    def seconds(self, group: str, family: str, turn: int, context: int = 0) -> float:
        """tokens() at the pace decodes ran so far; 0 before any decode ended (keys are then
        first come, which is all anyone can do)."""
        return self.tokens(group, family, turn, context) * self.pace

    @property
    def pace(self) -> float:
        """Decode seconds a token, over the decodes that ended; 0 before any did."""
        return self._pace.total / self._pace.n if self._pace.n else 0.0


class TurnFacts(Protocol):
    """What the scheduler reads off a turn (agent/loop.py's TurnRequest)."""

    traj_id: str
    turn: int
    family: str
    group: str
    done: bool
    context_tokens: int  # after this turn's append


class TurnScheduler:
    """The scheduling options of one run over one RemainingWork; both bodies call it alike."""

    def __init__(self, work: RemainingWork, priority: bool = False, spread: bool = False,
                 future: Callable[[str], TrajectorySpec] | None = None, migrate: bool = False,
                 tail: bool = False) -> None:
        self.work, self.priority, self.spread, self.migrate = work, priority, spread, migrate
        self.future = future  # traj_id -> its spec: the oracle's remainder (simulator only)
        self.tail = tail  # keep the trajectories in flight, for the tail's layout (control/tail_layout.py)
        # traj_id -> (its last turn as routed or ended, the context after it, whether that turn ended)
        self._live: dict[str, tuple[TurnFacts, int, bool]] = {}

    @property
    def active(self) -> bool:
        return self.priority or self.spread or self.migrate or self.tail

    def began(self, turn: TurnFacts) -> None:
        """A turn was routed: its trajectory is in flight (counted from its first turn on, so a
        step's trajectories all count before any of them ends a turn)."""
        if self.tail:
            self._live[turn.traj_id] = (turn, turn.context_tokens, False)

    def in_flight(self) -> list[tuple[str, Left]]:
        """Every trajectory in flight and its predicted remainder (tail layout only), in a fixed
        order: the longest predicted remainder first, ties by id."""
        out = []
        for tid, (turn, context, ended) in self._live.items():
            nxt = turn.turn + 1 if ended else turn.turn
            tokens = self.work.tokens(turn.group, turn.family, nxt, context)
            out.append((tid, Left(tokens, context, self.work.turns_left(turn.family, nxt))))
        out.sort(key=lambda x: (-x[1].tokens, x[0]))
        return out

    def key(self, turn: TurnFacts, now: float) -> float:
        if not self.priority:
            return 0.0
        if self.future is not None:
            return now - self._true_tokens(turn) * self.work.pace
        return now - self.work.seconds(turn.group, turn.family, turn.turn, turn.context_tokens)

    def remaining(self, turn: TurnFacts) -> float | None:
        if not self.spread:
            return None
        if self.future is not None:
            return float(self._true_tokens(turn))
        return self.work.tokens(turn.group, turn.family, turn.turn, turn.context_tokens)

    def left_after(self, turn: TurnFacts, decoded: int) -> float | None:
        if not self.migrate or turn.done:
            return None
        if self.future is not None:
            return float(self._true_tokens(turn, turn.turn + 1))
        return self.work.tokens(turn.group, turn.family, turn.turn + 1, turn.context_tokens + decoded)

    def _true_tokens(self, turn: TurnFacts, start: int | None = None) -> int:
        turns = self.future(turn.traj_id).turns
        return sum(t.decode_tokens for t in turns[turn.turn if start is None else start:])

    def ended(self, turn: TurnFacts, decode_tokens: int, decode_s: float) -> None:
        if not self.active:
            return
        self.work.decoded(turn.group, turn.family, decode_tokens, decode_s)
        if turn.done:
            self.work.finished(turn.family, turn.turn + 1)
            self._live.pop(turn.traj_id, None)
        elif self.tail:
            self._live[turn.traj_id] = (turn, turn.context_tokens + decode_tokens, True)
