"""The prorsa policy: engine roles that follow the load (reactive, the threshold policy, is in
control/reactive.py; the bookkeeping of asked-for switches in control/requests.py).

    prorsa[:horizon_s[:hysteresis[:max_switches[:votes[:min_gain]]]]]
        lifecycle events -> Forecaster -> Allocator each interval; a new goal split must win
        `votes` intervals in a row by more than min_gain of the goal being carried out (or of
        the current split), and an engine that switched stays put for `horizon_s`.
        Where the body lends it the simulator (PolicyContext.rehearse): model-predictive on a
        step's horizon instead. It opens on the split whose rehearsal of an earlier run's
        trajectories ends soonest, or with no prior, on engines of several DP-attention ranks or
        with weight updates declared, on the split of least worst-case regret over the plausible
        workloads' rehearsals (control/opening.py); between synchronous steps it rehearses the
        step that just ran and the one before it. A rehearsed split is held (a sync step's
        length; an async run's whole).
        With engine groups (PolicyContext.groups) `prorsa` builds adaptive_groups.ProrsaGroups:
        the same policy over role counts per group.

    decide(snapshot)          folds snapshot.events in (prorsa), returns Decision(targets, reason,
                              forecast, forecast_error); called once per control interval by the body
    between_steps(snapshot)   prorsa: the next synchronous step's roles (snapshot.finished: the step)

Both are deterministic functions of the snapshots they were given, and both plan from the roles
they requested, not only the ones observed: a switch still draining is not asked for twice
(plan, requested and observed kept apart; a request the snapshots never confirm is dropped after
Requests.timeout_s and planned afresh).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from prorsa.agent.trace import TrajectorySpec
from prorsa.config.policies import ProrsaArgs, shorthand
from prorsa.control.allocator import Allocator, Capacity, Plan, score, splits
from prorsa.control.calibration import Calibration
from prorsa.control.forecast import Forecaster
from prorsa.control.lifecycle import Phase
from prorsa.control.opener import Opener
from prorsa.control.opening import Opening, every_split, steady_forecast
from prorsa.control.policy import Decision, PolicyContext, Snapshot, WorkloadHint, register
from prorsa.control.reactive import Reactive  # noqa: F401  registers "reactive" beside "prorsa"
from prorsa.control.rehearsal import MAX_REHEARSED, REHEARSAL_GAIN, Rehearsal
from prorsa.control.rehearsal import split_name as _split_name
from prorsa.control.veto import ReplayVeto
from prorsa.control.replayed import decodes_as, scaled_decodes
from prorsa.control.requests import Requests
from prorsa.control.prior_check import PRIOR_SAMPLES, Censored, contradiction
from prorsa.loads import EngineLoad
from prorsa.roles import Role


_TIE = 1e-3  # steady-state costs this close are the fluid model's tie, not a preference
# The constants below were chosen on the tuning set: the paper table's cells at seed 0 and the
# priors.py, drivers.py and drift.py cells built from them (benchmarks/README.md, "Where prorsa was
# not tuned"); the held-out set chose none. Each one's evidence: docs/notes/allocator-experiments.md
# (REHEARSAL_GAIN and FINALIST_BAND: control/rehearsal.py; VETO_EVIDENCE: control/veto.py;
# OPENING_WINDOWS: control/opener.py).
TREND_BOUND = 4.0  # a step-over-step drift carried forward is taken as at most this factor
# between steps, the finalists (rehearsed within rehearsal.FINALIST_BAND of the fastest) are
# rehearsed again on RESAMPLES resamples of the step: one draw ranks splits a few percent apart by
# its own lengths (priors.py --table drivers --steps 3: no prior 0.961-1.004 -> 0.987-1.006)
RESAMPLES = 3


@register("prorsa", args=ProrsaArgs)
class Prorsa:
    """prorsa[:horizon_s[:hysteresis[:max_switches[:votes[:min_gain]]]]] (defaults 4:2:1:2:0.15;
    config/policies.py ProrsaArgs)."""

    def __init__(self, args: ProrsaArgs | None = None, *, context: PolicyContext | None = None) -> None:
        args = args or ProrsaArgs()
        ctx = context or PolicyContext.default()
        self.horizon_s = args.horizon_s
        self.votes = args.votes
        self.capacity = Capacity.from_cost(ctx.cost, ctx.slots, ctx.kv_capacity_tokens, layouts=ctx.layouts)
        # Until decodes are measured, assume a half-full engine at a 4k context.
        prior_tps = 1.0 / self.capacity.for_role(Role.DECODE).decode_step(max(ctx.slots / 2, 1), 4096)
        self.forecaster = Forecaster(self.horizon_s, self.horizon_s / 8, decode_tps=prior_tps)
        self.allocator = Allocator(self.capacity, hysteresis=args.hysteresis,
                                   max_switches_per_interval=args.max_switches, min_gain=args.min_gain)
        # An engine that switched stays until its gain has been seen (a horizon), and a switch
        # not seen through within ten intervals (or 30 s) is taken as lost and planned afresh.
        self.dwell_s = max(self.horizon_s, 2 * ctx.interval_s)
        self.name = shorthand("prorsa", args)
        self.prior = ctx.prior
        self.concurrency = ctx.concurrency
        self.asynchronous = ctx.asynchronous
        self.prior_trajectories = ctx.prior_trajectories
        self.prior_dropped = f"{ctx.prior_dropped}; " if ctx.prior_dropped else ""
        self._requests = Requests(timeout_s=max(30.0, 10 * ctx.interval_s))
        self._committed: tuple[int, int, int] | None = None  # the goal being carried out
        self._streak: tuple[tuple[int, int, int] | None, int] = (None, 0)  # candidate goal, votes
        self._held: tuple[int, int, int] | None = None  # a rehearsed split, kept until the next step
        self.opening_reason = ""  # why initial_roles chose its split, in words
        self._held_on_prior = False  # ... rehearsed on the prior's trajectories: dropped if they prove wrong
        self._decode_mean: float | None = None  # the last step's mean decode, for the drift
        # The step before the last, as it ran: rehearsed beside the last one, since one step's
        # replay ranks splits within a few percent by its own seed (drivers.py's EP4 cell, three
        # steps: the second step's replay put all mixed 1.1% ahead of P2 D6, the third step then
        # ran 161 s all mixed against ~141 s on a split; both steps replayed: 413.4 s against 427.5)
        self._step_before: list[TrajectorySpec] = []
        # the model rehearsals run on, corrected step by step against what the engines did; only a
        # synchronous run with a simulator lent has steps to hold the model against, so only it
        # folds events into the calibration's leg clock
        self.calibration = Calibration()
        self.rehearsal = Rehearsal(ctx.rehearse, self.calibration)
        self.veto = ReplayVeto(self.rehearsal, self.concurrency)
        self.opener = Opener(ctx, self.capacity, self.rehearsal)
        self._calibrating = self.rehearse is not None and not self.asynchronous

    @property
    def rehearse(self):
        """The simulator the body lends (PolicyContext.rehearse), or None: the one the rehearsals use."""
        return self.rehearsal.rehearse

    @property
    def opening(self) -> Opening | None:
        """The no-prior opening's choice and its regrets, once rehearsed."""
        return self.opener.opening

    @property
    def rehearsals(self) -> list[dict]:
        """Each rehearsal's makespans, for the record."""
        return self.rehearsal.log

    def initial_roles(self, n_engines: int) -> list[Role]:
        """Given an earlier run's trajectories (and the simulator), the split whose rehearsal of
        them ends soonest, if by REHEARSAL_GAIN ahead of the no-prior opening (Opener.base),
        held through the first step. Else the split the allocator scores best
        for the steady state the prior implies (an earlier run's means, or the pipeline's declared
        ones), unless all-mixed is within min_gain of it; with no prior, Opener.unprimed. Mixed
        is the default: it serves either phase at once, leaves MIXED cheaply, and a rollout
        opens with a burst of prompts that every engine can help prefill. But the roles a run
        opens with are the ones its first turns settle on (their prefixes stay where they ran),
        and moving there later costs drains: on an MoE model the opening decides most of the gain.

        Of the splits the steady state scores alike, the one with the most mixed engines: where
        the prefill engines absorb the steady appends, a mixed engine and a decode engine score
        the same, and the mixed one can still take a burst of prefill (the opening's prompts)."""
        base = None
        if self.prior is not None:
            goal = self._steady_split(self.prior, n_engines)
            base = self.opener.base(n_engines)
        elif self.prior_trajectories and self.rehearse is not None:
            goal = (0, 0, n_engines)  # the earlier run's own rehearsal decides (_rehearsed)
        else:
            goal, held = self.opener.unprimed(n_engines)
            self._held = goal if held else None
        p, d, m = self._rehearsed(self.opener.specs(), n_engines, goal, base=base)
        self._held_on_prior = self._held is not None and self.prior is not None
        self.calibration.begin(0.0, (p, d, m))
        self.opening_reason = self.prior_dropped + self._why_opening((p, d, m), n_engines)
        return [Role.PREFILL] * p + [Role.DECODE] * d + [Role.MIXED] * m

    def _why_opening(self, split: tuple[int, int, int], n_engines: int) -> str:
        """initial_roles' choice in words, for the run's console."""
        return self.opener.why(split, n_engines, self.prior, self._held_on_prior)

    def _prior_contradicted(self, now_s: float) -> str:
        """Why the prior is not this run's workload ("" while it may be), by the means the run
        has observed PRIOR_SAMPLES times (appends as they are queued, decodes as they end). A
        wrong family's rehearsed split, held through the run, cost EP16 SWE up to 0.58 of the best
        fixed split against 0.90 with no prior at all (benchmarks/priors.py --table drivers)."""
        if self.prior is None:
            return ""
        return contradiction(self.prior, self.forecaster.observed(PRIOR_SAMPLES), self._censored(now_s))

    def _censored(self, now_s: float) -> Censored:
        """What the trajectories still running bound (control/prior_check.py)."""
        live = self.forecaster.tracker.live()
        tools = [now_s - t.since_s for t in live if t.phase is Phase.TOOL]
        f = self.forecaster
        return Censored(len(tools), sum(tools), *f.tally("tool_s"), len(live), sum(t.turn + 1 for t in live),
                        *f.tally("turns"))

    def _rehearsed(self, specs, n_engines: int, fluid: tuple[int, int, int],
                   older: Sequence[TrajectorySpec] = (), resamples: int = 0,
                   base: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
        """The split whose rehearsal (the body's simulator replaying `specs` as one step, and
        `older` as another: their makespans summed) ends soonest, of: all mixed, every P:D, every
        P prefill beside mixed ones, and the fluid model's pick; `base` (default all mixed) unless
        the best beats it by REHEARSAL_GAIN. With `resamples`, the finalists are ranked by their
        mean over the rehearsal and that many resamples of it (Rehearsal.over_resamples). `fluid`
        where nothing can be rehearsed (no simulator lent, nothing observed, or more trajectories
        than is worth it)."""
        if self.rehearse is None or not specs or n_engines < 2 or len(specs) > MAX_REHEARSED:
            return fluid
        mixed = (0, 0, n_engines)
        base = base or mixed
        cands = [mixed, fluid, *every_split(n_engines)[1:]]
        times = self.rehearsal.over_resamples(self.rehearsal.times(specs, older, cands), base, specs, older,
                                              resamples)
        best = min(times, key=lambda c: (times[c], cands.index(c)))
        self._held = best if times[best] * (1 + self.calibration.margin(REHEARSAL_GAIN)) < times[base] else base
        return self._held

    def _steady_split(self, hint: WorkloadHint | None, n_engines: int,
                      keep: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
        """The split the steady state of `hint` scores best, unless `keep` (default all mixed)
        scores within min_gain of it."""
        keep = keep or (0, 0, n_engines)
        if hint is None or n_engines < 2:
            return keep
        fc = steady_forecast(hint, self.capacity, n_engines, self.forecaster.n_bins, self.forecaster.bin_s)
        cands = splits(n_engines)
        costs = score(self.capacity, fc, cands[:, 0], cands[:, 1], cands[:, 2])
        kept = costs[(cands == keep).all(axis=1)]
        if len(kept) and kept[0] <= (1 + self.allocator.min_gain) * float(costs.min()):
            return keep
        tied = cands[costs <= (1 + _TIE) * float(costs.min())]
        p, d, m = (int(x) for x in tied[np.lexsort((tied[:, 0], -tied[:, 2]))[0]])
        return p, d, m

    def learned(self) -> WorkloadHint | None:
        """The workload as this run has observed it (once enough trajectories ended), else the prior."""
        means = self.forecaster.means()
        if means is None:
            return self.prior
        concurrency = self.concurrency or (self.prior.concurrency if self.prior else 0)
        return WorkloadHint(concurrency=concurrency, **means) if concurrency else self.prior

    def between_steps(self, snapshot: Snapshot) -> Decision:
        """Between synchronous steps nothing is in flight, so a switch drains nothing: the next
        step opens on the split a rehearsal of the step that just ran, and of the one before it,
        ends soonest (their decodes carried forward by the step-over-step trend: response lengths
        drift as a policy learns),
        else on the steady split of what the steps so far observed (a prior until then)."""
        engines, goal, why = self._next_step(snapshot)
        targets = reassign(engines, goal)
        self._requests.ask(targets, snapshot.time_s)
        return Decision(targets, why)

    def _next_step(self, snapshot: Snapshot) -> tuple[list[EngineLoad], tuple[int, int, int], str]:
        """between_steps' engines (in their requested roles), goal split and reason."""
        for ev in snapshot.events:
            self.forecaster.observe(ev)
            if self._calibrating:
                self.calibration.observe(ev)
        checked = ""
        if self._calibrating and len(snapshot.finished) <= MAX_REHEARSED:
            checked = self.calibration.end(snapshot.finished, self.rehearse)
        hint = self.learned()
        engines = self._requests.engines(snapshot)
        before, self._held, self._held_on_prior = len(self.rehearsals), None, False
        ahead, trend = self._carried_forward(snapshot.finished)
        older = decodes_as(ahead, self._step_before)
        self._step_before = list(snapshot.finished)
        goal = self._rehearsed(ahead, len(engines), self._steady_split(hint, len(engines)), older, RESAMPLES)
        how = "steady state" if len(self.rehearsals) == before else (
            f"rehearsed on {len(ahead)} trajectories"
            + (f" and the {len(older)} of the step before" if older else "")
            + (f", decodes x{trend:.2f}" if trend != 1.0 else ""))
        self._committed, self._streak = None, (None, 0)
        what = "no workload observed yet" if hint is None else (
            f"{hint.turns:.1f} turns of {hint.decode_tokens:.0f} decoded tokens, {hint.tool_s:.2f}s tools")
        self.calibration.begin(snapshot.time_s, goal)
        checked = f"; last {checked}" if checked else ""
        return engines, goal, f"next step: {_split_name(goal)} ({how}) for {what}{checked}"

    def _carried_forward(self, finished: Sequence[TrajectorySpec]) -> tuple[list[TrajectorySpec], float]:
        """The step that ran, its decodes scaled by the last step-over-step change of their mean
        (bounded to TREND_BOUND either way): the next step as a persistence of the drift."""
        if not finished:
            return [], 1.0
        mean = float(np.mean([t.decode_tokens for s in finished for t in s.turns]))
        previous, self._decode_mean = self._decode_mean, mean
        if previous is None or previous <= 0:
            return list(finished), 1.0
        trend = min(max(mean / previous, 1 / TREND_BOUND), TREND_BOUND)
        if abs(trend - 1.0) < 0.02:  # no drift to speak of: replay the step as it ran
            return list(finished), 1.0
        return scaled_decodes(finished, trend), trend

    def decide(self, snapshot: Snapshot) -> Decision:
        for ev in snapshot.events:
            self.forecaster.observe(ev)  # folds the event into forecaster.tracker too
            if self._calibrating:
                self.calibration.observe(ev)
        engines = self._requests.engines(snapshot)
        dropped = self._prior_contradicted(snapshot.time_s) if self._held_on_prior else ""
        # a held split reads no forecast: it is made for the record, unblended (Forecaster.predict)
        forecast = self.forecaster.predict(snapshot.time_s, self.forecaster.tracker,
                                           blend=self._held is None or bool(dropped))
        if dropped:
            self._held, self._held_on_prior, self.prior = None, False, None
            reopen = self._reopened(engines, snapshot.time_s)
            if reopen is not None:
                return Decision(reopen[0], f"{dropped}{reopen[1]}", forecast=forecast.summary(),
                                forecast_error=self.forecaster.errors())
        if self._held is not None:
            # the rehearsal ran the whole step, its tail included, in this split: the horizon's
            # fluid model, which does not see where prefixes lie, is not asked to undo it
            return Decision({}, f"{dropped}hold {_split_name(self._held)}: rehearsed for this "
                            f"{'run' if self.asynchronous else 'step'}",
                            forecast=forecast.summary(), forecast_error=self.forecaster.errors())
        plan = self.allocator.plan(forecast, engines, anchor=self._committed,
                                   locked=self._requests.locked(snapshot.time_s, self.dwell_s))
        targets, why = self._vote(plan, snapshot.finished)
        self._requests.ask(targets, snapshot.time_s)
        if targets:
            self.calibration.moved()
        return Decision(targets, f"{dropped}{why}{plan.reason}", forecast=plan.summary(),
                        forecast_error=self.forecaster.errors())

    def _reopened(self, engines: list[EngineLoad], now_s: float) -> tuple[dict[str, Role], str] | None:
        """A prior found wrong leaves the run where its prior's split put it; it goes where a run
        told nothing opens (Opener.unprimed, held as that is), early, while few decodes are there to
        drain. Left to
        the fluid model's votes instead, a terminal run's prior held SWE MoE sync all mixed to its
        end: dropped at 3 s, the goals it voted for changed each interval while the drains grew
        (0.928 of the best fixed split; benchmarks/priors.py --table paper)."""
        opening, held = self.opener.unprimed(len(engines))
        self._held = opening if held else None
        targets = reassign(engines, opening)
        if not targets:
            return None
        self._requests.ask(targets, now_s)
        self.calibration.moved()
        self._committed = opening
        return targets, f"reopen as with no prior: {_split_name(opening)}"

    def _vote(self, plan: Plan, finished: Sequence[TrajectorySpec] = ()) -> tuple[dict[str, Role], str]:
        """A new goal must win `votes` plans in a row, then its replay (control/veto.py); a committed
        goal is carried on at once."""
        if not plan.targets:
            if plan.goal == plan.current:  # reached (or never left); else blocked for now: keep it
                self._committed = None
            self._streak = (None, 0)
            return {}, ""
        if plan.goal == self._committed:
            return plan.targets, ""
        goal, n = self._streak
        n = n + 1 if goal == plan.goal else 1
        self._streak = (plan.goal, n)
        if n < self.votes:
            return {}, f"vote {n}/{self.votes}: "
        self._streak = (None, 0)
        veto = self.veto(plan.current, plan.goal, plan.best, finished)
        if veto:
            return {}, veto
        self._committed = plan.goal
        return plan.targets, ""

def reassign(engines: list[EngineLoad], goal: tuple[int, int, int]) -> dict[str, Role]:
    """Targets that bring `engines` to `goal` (prefill, decode, mixed counts), moving the fewest:
    an engine keeps its role while the goal still wants one more of it."""
    want = dict(zip((Role.PREFILL, Role.DECODE, Role.MIXED), goal))
    movers = []
    for e in engines:
        if want.get(e.role, 0) > 0:
            want[e.role] -= 1
        else:
            movers.append(e.engine_id)
    missing = [role for role, n in want.items() for _ in range(n)]
    return dict(zip(movers, missing))
