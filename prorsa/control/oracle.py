"""The oracle: the one policy that reads the future of a replayed workload (simulator only).

    oracle[:horizon_s[:hysteresis[:max_switches[:votes[:min_gain]]]]]   prorsa's allocator, told
        what prorsa never is: each trajectory's remaining turns (decode lengths, tool latencies,
        which turn is the last, what each observation appends) and the run itself to replay.

It opens on the split whose replay of the whole run, from its start, ends it soonest: all mixed,
every P:D and every P beside mixed engines, then a local search over every P:D:M from the best of
those, each replayed with the run's own trajectories, mode, concurrency, releases, steps and
weight updates on the same simulated engines and router, so the split it holds is at least the
best of the fixed splits it replayed, in hindsight, by construction. Holding it, it still
plans every interval with the allocator on a true-future forecast (and between synchronous steps
with prorsa's rehearsal of the step that ran); a move the plan asks for goes through only where
the run replayed with the moves made so far and this one ends sooner than without it (the replay
is the run: a move it prices gains exactly that). Each move is carried out whole at once, so the
replay and the run make the same switches at the same instants.

Cost: a replay costs a run. The opening
replays 15 splits of 8 engines and the neighbours of each best on the way (of 43); at most
MAX_VETS moves are weighed in a run, and a refused goal is weighed again only after a tenth of the
run. A
run of more than MAX_REHEARSED trajectories is replayed cut to its first MAX_REHEARSED (an async
run's first released, a sync run's first whole steps): the split it opens on is then the opening's
best, not assured of the whole run's, and no move is weighed (a cut replay cannot price the rest).

It needs PolicyContext.future (traj_id -> TrajectorySpec, tool latencies in body seconds) and
PolicyContext.future_run (the run to replay), which only the simulator gives and no other policy
reads (prorsa's code never touches either); a live run has no future to read. Without future_run
it plans with the fluid model alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from prorsa.agent.trace import TrajectorySpec
from prorsa.config.policies import ProrsaArgs, shorthand
from prorsa.control.adaptive import MAX_REHEARSED, Prorsa, _split_name, reassign
from prorsa.control.allocator import count_roles, splits
from prorsa.control.forecast import Forecast, Forecaster
from prorsa.control.lifecycle import LifecycleTracker, Phase
from prorsa.control.policy import Decision, Move, PolicyContext, Snapshot, register
from prorsa.roles import Role

MAX_VETS = 6  # moves weighed by a replay of the whole run, per run: each costs a run
# The replay is the run, so any gain it shows is real; this margin only keeps a move that changes
# nothing measurable (a switch that lands as the run ends) from costing a switch.
VET_GAIN = 1e-3


class TrueFutureForecaster(Forecaster):
    """Learns rates and waits like the Forecaster; predicts from the specs instead of statistics."""

    def __init__(self, future: Callable[[str], TrajectorySpec], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.future = future

    def predict(self, now_s: float, tracker: LifecycleTracker, blend: bool = True) -> Forecast:
        """The true future's demand; `blend` is the Forecaster's signature (nothing here is blended)."""
        ahead = _Ahead(now_s, self.bin_s, self.n_bins, self.decode_rate(), self._wait.mean(self.priors.wait_s))
        live = tracker.live()
        for s in live:
            ahead.walk(s, self.future(s.traj_id).turns)
        fc = ahead.forecast(self._pool.decode_tokens.mean(self.priors.decode_tokens), len(live))
        self.book.remember(now_s, fc.prefill_tokens_per_s, fc.decode_seqs)
        self.book.score(now_s)
        return fc


@dataclass
class _Ahead:
    """What the live trajectories' remaining turns bring over the horizon, summed as each is walked."""

    now_s: float
    bin_s: float
    n: int  # bins
    rate: float  # decode tokens per second of one sequence
    wait: float  # a turn's wait from its arrival to its prefill
    backlog: float = 0.0
    backlog_turns: float = 0.0
    fresh: float = 0.0
    under: list[tuple[float, float]] = field(default_factory=list)  # (weight, cached context under a prefill)
    dec_of_arrivals: list[float] = field(default_factory=list)
    remaining: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.end = self.now_s + self.n * self.bin_s
        self.mids = self.now_s + (np.arange(self.n) + 0.5) * self.bin_s
        self.arrive_tok, self.arrive_n = np.zeros(self.n), np.zeros(self.n)
        self.seqs, self.kv = np.zeros(self.n), np.zeros(self.n)

    def walk(self, s, turns) -> None:
        """Trajectory `s`'s turn in hand and those after it, up to the horizon's end."""
        k, ctx = s.turn, s.context  # ctx: before turn k's append
        start = self._start(s, turns[k], k, ctx)
        while k < len(turns):
            turn = turns[k]
            if start is not None:  # turn k decodes from `start`
                stop = max(start + turn.decode_tokens / self.rate, self.now_s)
                on = (self.mids >= start) & (self.mids < stop)
                self.seqs += on
                self.kv += on * (ctx + turn.appended_tokens + (self.mids - start).clip(0) * self.rate)
                if turn.done:
                    break
                tool_end = stop + turn.tool_latency_s
            elif turn.done:  # the last turn's (empty) tool: it is about to end
                break
            else:
                tool_end = max(s.since_s + turn.tool_latency_s, self.now_s)
            ctx += turn.appended_tokens + turn.decode_tokens
            k += 1
            if tool_end >= self.end or k >= len(turns):
                break
            self._arrival(turns[k], tool_end, ctx)
            start = tool_end + self.wait

    def _start(self, s, turn, k: int, ctx: float) -> float | None:
        """When turn k decodes, by the phase it is in; None: its decode is over (a tool runs)."""
        if s.phase.rank <= Phase.PREFILL.rank:
            self.backlog += turn.appended_tokens
            self.backlog_turns += 1
            self.fresh += k == 0
            self.under.append((1.0, ctx))
            return max(s.since_s + self.wait, self.now_s)
        if s.phase is Phase.DECODE:
            self.remaining.append(max(turn.decode_tokens - (self.now_s - s.since_s) * self.rate, 1.0))
            return s.since_s
        return None  # TOOL: turn k's decode is over

    def _arrival(self, nxt, tool_end: float, ctx: float) -> None:
        b = int((tool_end - self.now_s) // self.bin_s)
        self.arrive_tok[b] += nxt.appended_tokens
        self.arrive_n[b] += 1
        self.under.append((1.0, ctx))
        self.dec_of_arrivals.append(nxt.decode_tokens)

    def forecast(self, decode_tokens_prior: float, live: int) -> Forecast:
        """`decode_tokens_prior`: a turn's decode tokens when no turn arrives within the horizon."""
        w = sum(x for x, _ in self.under)
        return Forecast(
            start_s=self.now_s, bin_s=self.bin_s, prefill_tokens_per_s=self.arrive_tok / self.bin_s,
            prefill_turns_per_s=self.arrive_n / self.bin_s, decode_seqs=self.seqs, kv_tokens=self.kv,
            backlog_tokens=self.backlog, backlog_turns=self.backlog_turns, backlog_fresh_turns=self.fresh,
            prefill_prefix_tokens=sum(x * c for x, c in self.under) / w if w else 0.0,
            decode_tokens_per_turn=(float(np.mean(self.dec_of_arrivals)) if self.dec_of_arrivals
                                    else decode_tokens_prior),
            decode_tps_per_seq=self.rate,
            decode_remaining_tokens=float(np.mean(self.remaining)) if self.remaining else 0.0, live=live)


@register("oracle", args=ProrsaArgs)
class Oracle(Prorsa):
    """oracle[:horizon_s[:hysteresis[:max_switches[:votes[:min_gain]]]]] (defaults as prorsa;
    simulator only: it reads the run's future)."""

    def __init__(self, args: ProrsaArgs | None = None, *, context: PolicyContext | None = None) -> None:
        if context is None or context.future is None:
            raise ValueError("the oracle reads the workload's future, which only `prorsa sim` has")
        super().__init__(args, context=context)
        self.name = shorthand("oracle", args or ProrsaArgs())
        self.prior = context.future_means or self.prior  # it opens on the run's own means
        old = self.forecaster
        self.forecaster = TrueFutureForecaster(context.future, old.horizon_s, old.bin_s,
                                               decode_tps=old._prior_tps)
        self.future_run = context.future_run
        if context.groups is not None:  # its rehearsals name counts of engines alike (prorsa's name counts per group)
            self.rehearsal.rehearse = None
        self._opening: tuple[int, int, int] | None = None  # set by initial_roles when the run can be replayed
        self._expected: float | None = None  # the replayed figure of the run as it goes: opening and moves
        self._moves: list[Move] = []  # the moves made, as the replay makes them
        self._vetoed: dict[tuple[int, int, int], float] = {}  # goal -> when its replay refused it
        self._vets = 0
        self._whole = False  # the replay is the whole run (else its opening: no move is weighed)
        self._revet_s = 0.0

    def initial_roles(self, n_engines: int) -> list[Role]:
        """The split whose replay of the whole run ends it soonest: of all mixed, every P:D and
        every P beside mixed engines (the fixed splits the benchmarks hold it against), then of
        the splits one engine away from the best so far, until none of them is faster. All mixed
        is replayed first and a later split must beat the best strictly, so a tie stays mixed."""
        fr = self.future_run
        if fr is None or n_engines < 2:
            return super().initial_roles(n_engines)
        n = n_engines
        mixed = (0, 0, n)
        every = set(map(tuple, splits(n).tolist()))
        costs: dict[tuple[int, int, int], float] = {}
        best = mixed

        def weigh(cands) -> None:
            nonlocal best
            for c in cands:
                if c in every and c not in costs:
                    costs[c] = fr.replay(c, (), MAX_REHEARSED)
                    if costs[c] < costs[best]:
                        best = c

        weigh([mixed, *((p, n - p, 0) for p in range(1, n)), *((p, 0, n - p) for p in range(1, n))])
        while True:  # a local search over every P:D:M: a replay costs a run, and there are (n+1)(n+2)/2 - 2
            was = best
            p, d, m = best
            weigh([(p + 1, d - 1, m), (p - 1, d + 1, m), (p + 1, d, m - 1), (p - 1, d, m + 1),
                   (p, d + 1, m - 1), (p, d - 1, m + 1)])
            if best == was:
                break
        self.rehearsals.append(costs)
        self._opening, self._expected = best, costs[best]
        self._whole = fr.trajectories is None or fr.trajectories <= MAX_REHEARSED
        # a refused goal is weighed again a tenth of the run later (the run's length: its cost per
        # trajectory over the trajectories; an open-ended one, ten horizons)
        self._revet_s = (costs[best] * fr.trajectories / 10 if fr.trajectories else 10 * self.horizon_s)
        cut = "" if self._whole else f" (its first {MAX_REHEARSED} trajectories)"
        self.opening_reason = (f"the oracle: of {len(costs)} splits replayed, the one whose replay of this run{cut} "
                               f"ends it soonest, {costs[best] / costs[mixed]:.3f} of all mixed's time")
        p, d, m = best
        return [Role.PREFILL] * p + [Role.DECODE] * d + [Role.MIXED] * m

    def decide(self, snapshot: Snapshot) -> Decision:
        """The allocator's plan on the true future, voted as prorsa's; a goal that wins its votes
        is weighed by replaying the run with it (_weighed) and, if it gains, taken whole at once."""
        if self._opening is None:
            return super().decide(snapshot)
        for ev in snapshot.events:
            self.forecaster.observe(ev)
        now = snapshot.time_s
        engines = self._requests.engines(snapshot)
        forecast = self.forecaster.predict(now, self.forecaster.tracker)
        plan = self.allocator.plan(forecast, engines, locked=self._requests.locked(now, self.dwell_s))
        shown = {"forecast": plan.summary(), "forecast_error": self.forecaster.errors()}
        if not plan.targets or plan.goal == plan.current:
            self._streak = (None, 0)
            return Decision({}, f"hold {_split_name(plan.current)}: {plan.reason}", **shown)
        goal, n = self._streak
        n = n + 1 if goal == plan.goal else 1
        self._streak = (plan.goal, n)
        if n < self.votes:
            return Decision({}, f"vote {n}/{self.votes}: {plan.reason}", **shown)
        self._streak = (None, 0)
        targets = reassign(engines, plan.goal)
        moved, why = self._weighed("decide", now, plan.current, plan.goal, targets)
        if not moved:
            return Decision({}, f"{why}{plan.reason}", **shown)
        self._requests.ask(targets, now)
        return Decision(targets, f"{why}{plan.reason}", **shown)

    def between_steps(self, snapshot: Snapshot) -> Decision:
        """prorsa's pick for the next step (a rehearsal of the step that ran), taken only if the
        replayed run gains by it."""
        if self._opening is None:
            return super().between_steps(snapshot)
        engines, goal, why = self._next_step(snapshot)
        targets = reassign(engines, goal)
        if not targets:
            return Decision({}, why)
        moved, weighed = self._weighed("between_steps", snapshot.time_s,
                                       count_roles([e.role for e in engines]), goal, targets)
        if not moved:
            return Decision({}, f"{weighed}{why}")
        self._requests.ask(targets, snapshot.time_s)
        return Decision(targets, f"{weighed}{why}")

    def _weighed(self, hook: str, now_s: float, current: tuple[int, int, int], goal: tuple[int, int, int],
                 targets: dict[str, Role]) -> tuple[bool, str]:
        """(whether to move, why): the run replayed with the moves made so far and this one ends
        sooner by VET_GAIN than as it goes now (self._expected, its own replay's figure)."""
        assert self.future_run is not None and self._expected is not None
        if not self._whole:
            return False, f"{_split_name(goal)} not weighed: the replay covers the run's opening only; "
        last = self._vetoed.get(goal)
        if last is not None and now_s - last < self._revet_s:
            return False, f"{_split_name(goal)} refused by its replay at {last:.1f} s; "
        if self._vets >= MAX_VETS:
            return False, f"{_split_name(goal)} not weighed: {MAX_VETS} moves weighed already; "
        self._vets += 1
        move: Move = (hook, now_s, tuple(sorted(targets.items())))
        need = self._expected * (1 - VET_GAIN)
        cost = self.future_run.replay(self._opening, [*self._moves, move], MAX_REHEARSED)
        self.rehearsals.append({current: self._expected, goal: cost})
        if cost < need:
            gain, self._expected = self._expected / cost, cost
            self._moves.append(move)
            self._vetoed.clear()
            return True, f"{_split_name(goal)}: the run replayed with this move ends {gain:.3f}x sooner; "
        self._vetoed[goal] = now_s
        return False, (f"{_split_name(goal)} refused: the run replayed with this move takes "
                       f"{cost / self._expected:.3f}x as long; ")
