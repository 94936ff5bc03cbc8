"""Demand forecast: what the live trajectories will ask of the engines over the next few seconds.

Demand, per horizon bin (start_s + [j, j+1) * bin_s):
    prefill tokens/s   observation tokens arriving to be prefilled (turns coming back from tools)
    decode seqs        sequences decoding, averaged over the bin
    KV tokens          KV held by those sequences
plus what waits already (the prefill backlog). The allocator turns these into a role split.

    Forecaster(horizon_s, bin_s)   one per policy; decode_tps is the rate assumed before any is seen
    observe(ev)                    every lifecycle event, as it arrives: learns the per-family
                                   statistics and records what happened (for errors())
    predict(now_s, tracker)        -> Forecast over [now_s, now_s + horizon_s); remembered for errors()
    errors()                       MAPE per horizon bin of past forecasts, once their time has passed,
                                   beside persistence's, an EWMA's and the lifecycle model's alone

How a live trajectory of family f becomes demand (statistics learned online, see FamilyStats;
every lookup is the empirical distribution, conditioned on the time already spent):
    TOOL since t0      unless turn k was its last, its next turn arrives at t0 + X, X ~ tool
                       latency given X > elapsed, bringing obs_f prefill tokens, then decodes
                       dec_f after the usual wait
    DECODE since t0    decodes until dec_f given the time it has decoded runs out, then unless
                       turn k is its last (hazard h_k) calls a tool and arrives as above
    QUEUED / PREFILL   its known append is backlog now; it decodes after the remaining wait
Ends and arrivals are binned; a turn that ends or arrives in a bin is taken at its middle.
A decode or tool that has outlasted every remembered one is expected to last as long again: the
first decodes of a step to end are its short ones, so outlasting them says little about a cap.

The prefill tokens/s a Forecast carries are not the model's alone: ErrorBook.blend corrects the
model's level per bin by what arrived over what it forecast, and mixes that, the model as it is,
the last interval and the EWMA by the weights whose recent scored forecasts erred least
(forecast_stats.py). Turns follow the blended tokens at the model's tokens per turn. Decode
sequences are the model's.
The decode rate (tokens/s per sequence) is measured from DECODE -> TOOL durations: that includes
batching and the engines as they are, which a cost model of some other machine does not; the
injected `decode_tps` only stands in until the first decode has finished.
New trajectories (prompts not yet submitted) are not forecast; they show up as backlog.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from prorsa.control.forecast_stats import (ErrorBook, FamilyStats, FamilyView, Priors, Samples, cdf,
                                           cond_bins, cond_cdf, cond_rest, shifted_bins)
from prorsa.control.lifecycle import LifecycleEvent, LifecycleTracker, Phase, TrajectoryState

_TOOL_TAIL = 1.0  # past every remembered tool latency, expect it to last as long again (heavy tail)
_DECODE_TAIL = 1.0  # past every remembered decode length, expect it to last as long again


class _Traj:
    """predict()'s working columns, one row per live trajectory."""

    def __init__(self, rank: np.ndarray, elapsed: np.ndarray, turn: np.ndarray, ctx: np.ndarray,
                 app: np.ndarray, dec: np.ndarray, n_bins: int):
        n = len(rank)
        self.elapsed, self.turn, self.ctx, self.app, self.dec = elapsed, turn, ctx, app, dec
        self.tool = rank == Phase.TOOL.rank
        self.decoding = rank == Phase.DECODE.rank
        self.pre = rank <= Phase.PREFILL.rank  # queued or prefilling
        self.arrive = np.zeros((n, n_bins))  # P(its next turn arrives in bin b)
        self.occ = np.zeros((n, n_bins))  # P(it is decoding this turn at bin b's middle)
        self.start = np.zeros(n)  # when this turn's decode starts (relative; 0 if running)
        self.rest = np.zeros(n)  # expected seconds of this turn's decode still to come
        self.gen = np.where(self.tool, dec, 0.0)  # tokens this turn generated so far
        self.obs = np.zeros(n)  # expected tokens of its next observation
        self.dec_turn = np.zeros(n)  # expected tokens a turn of its family decodes
        self.prefix = np.zeros(n)  # context under its next turn's append


@dataclass(frozen=True)
class ForecastSummary:
    """A forecast's figures for the decision log, the run's outputs and the dashboard: totals and
    peaks over its horizon (body seconds)."""

    live: float = 0.0  # trajectories it was built from
    backlog_tokens: float = 0.0  # prefill tokens queued or prefilling at its start
    prefill_tokens: float = 0.0  # prefill tokens arriving over the horizon (turns k > 0)
    prefill_peak_tps: float = 0.0
    prefill_peak_at_s: float = 0.0  # after the forecast's start
    decode_seqs_mean: float = 0.0  # sequences decoding, averaged over the horizon
    decode_seqs_peak: float = 0.0
    kv_tokens_peak: float = 0.0
    decode_tps_per_seq: float = 0.0  # the per-sequence decode rate it assumed
    horizon_s: float = 0.0

    def figures(self) -> dict[str, float]:
        """Name -> value, as metrics.nc and the JSON endpoint store them."""
        return asdict(self)


@dataclass(frozen=True, eq=False)
class Forecast:
    start_s: float  # bin j covers start_s + [j, j+1) * bin_s
    bin_s: float
    prefill_tokens_per_s: np.ndarray  # per bin: prefill tokens arriving (turns k > 0), per second
    prefill_turns_per_s: np.ndarray  # per bin: turns arriving, per second
    decode_seqs: np.ndarray  # per bin: sequences decoding, time-averaged
    kv_tokens: np.ndarray  # per bin: KV tokens held by the decoding sequences
    backlog_tokens: float = 0.0  # prefill tokens queued or prefilling at start_s
    backlog_turns: float = 0.0  # turns queued or prefilling at start_s
    backlog_fresh_turns: float = 0.0  # of those, first turns (a prompt: nothing cached anywhere)
    prefill_prefix_tokens: float = 0.0  # mean cached context under a prefill (arrivals, backlog)
    decode_tokens_per_turn: float = 0.0  # mean tokens a turn decodes (a prefill engine recomputes them)
    decode_tps_per_seq: float = 0.0  # the per-sequence decode rate this forecast assumed
    decode_remaining_tokens: float = 0.0  # mean tokens still to decode per decoding sequence now
    live: int = 0  # trajectories it was built from

    @property
    def n_bins(self) -> int:
        return len(self.decode_seqs)

    @property
    def horizon_s(self) -> float:
        return self.n_bins * self.bin_s

    def summary(self) -> ForecastSummary:
        peak = int(np.argmax(self.prefill_tokens_per_s)) if self.n_bins else 0
        return ForecastSummary(
            live=float(self.live),
            backlog_tokens=float(self.backlog_tokens),
            prefill_tokens=float(self.prefill_tokens_per_s.sum() * self.bin_s),
            prefill_peak_tps=float(self.prefill_tokens_per_s.max(initial=0.0)),
            prefill_peak_at_s=float(peak * self.bin_s),
            decode_seqs_mean=float(self.decode_seqs.mean()) if self.n_bins else 0.0,
            decode_seqs_peak=float(self.decode_seqs.max(initial=0.0)),
            kv_tokens_peak=float(self.kv_tokens.max(initial=0.0)),
            decode_tps_per_seq=float(self.decode_tps_per_seq),
            horizon_s=float(self.horizon_s),
        )


class Forecaster:
    def __init__(self, horizon_s: float = 4.0, bin_s: float = 0.5, *, decode_tps: float = 50.0,
                 priors: Priors = Priors(), memory: int = 512, error_window: int = 64):
        if horizon_s <= 0 or bin_s <= 0 or decode_tps <= 0:
            raise ValueError("horizon_s, bin_s and decode_tps must be positive")
        self.bin_s = float(bin_s)
        self.n_bins = max(1, round(horizon_s / bin_s))
        self.horizon_s = self.n_bins * self.bin_s
        self._edges = np.arange(self.n_bins + 1) * self.bin_s  # relative to now
        self._mid = self._edges[:-1] + 0.5 * self.bin_s
        self._points = np.concatenate([self._edges, self._mid])
        self.priors = priors
        self._prior_tps = float(decode_tps)
        self._memory = memory
        # learning needs each event's predecessor; a policy predicts from this same view
        self.tracker = LifecycleTracker()
        self._queued_at: dict[str, float] = {}  # traj -> when its current turn was submitted
        self._families: dict[str, FamilyStats] = {}
        self._pool = FamilyStats(memory, priors)  # all families together: the first fallback
        self._rate = Samples(memory)  # tokens/s of finished decodes (pooled: engines, not tasks)
        self._rate_tokens = Samples(memory)  # their lengths, to weigh the rates
        self._wait = Samples(memory)  # submitted -> decoding, seconds (pooled)
        # the whole run's sums (not the recent window: a step's tail is its longest trajectories)
        self._sums = dict.fromkeys(("prompt_tokens", "observation_tokens", "decode_tokens", "tool_s", "turns"), 0.0)
        self._counts = dict.fromkeys(self._sums, 0)
        self.book = ErrorBook(self.n_bins, self.bin_s, error_window)

    # -- learning ------------------------------------------------------------------------------

    def observe(self, ev: LifecycleEvent) -> None:
        prev = self.tracker.get(ev.traj_id)
        if not self.tracker.apply(ev):
            return
        fam = self._families.get(ev.family)
        if fam is None:
            fam = self._families[ev.family] = FamilyStats(self._memory, self.priors)
        both = (fam, self._pool)
        new_turn = prev is None or ev.turn > prev.turn
        if new_turn and ev.phase.rank <= Phase.PREFILL.rank:
            self._queued_at[ev.traj_id] = ev.time_s
            if ev.turn == 0 and ev.tokens > 0:
                self._count("prompt_tokens", ev.tokens)
            if ev.turn > 0:
                self.book.arrival(ev.time_s, ev.tokens)
                if ev.tokens > 0:
                    self._count("observation_tokens", ev.tokens)
                    for f in both:
                        f.obs_tokens.add(ev.tokens)
        if prev is not None and ev.turn == prev.turn + 1:  # turn k went on: its first event
            for f in both:
                f.turn_fate(prev.turn, last=False)
                if prev.phase is Phase.TOOL:
                    f.tool_s.add(ev.time_s - prev.since_s)
            if prev.phase is Phase.TOOL:
                self._count("tool_s", ev.time_s - prev.since_s)
        if ev.phase.finished:
            if ev.phase is Phase.DONE:
                self._count("turns", ev.turn + 1)
            for f in both:
                f.turn_fate(ev.turn, last=True)
                if prev is not None:
                    f.end_from[int(prev.phase is Phase.TOOL)] += 1
        if ev.phase is Phase.DECODE and ev.traj_id in self._queued_at:
            self._wait.add(ev.time_s - self._queued_at.pop(ev.traj_id))
        was_decoding = prev is not None and prev.phase is Phase.DECODE
        if was_decoding != (ev.phase is Phase.DECODE):
            self.book.decode_change(ev.time_s, 1 if ev.phase is Phase.DECODE else -1)
        if ev.phase is Phase.TOOL or (ev.phase.finished and was_decoding):
            self._decode_finished(prev, ev, both)
        if ev.phase.finished:
            self._queued_at.pop(ev.traj_id, None)

    def _decode_finished(self, prev: TrajectoryState | None, ev: LifecycleEvent,
                         both: tuple[FamilyStats, FamilyStats]) -> None:
        """A decode ended (TOOL, or DONE/FAILED right after it): its length and rate."""
        if ev.tokens > 0:
            self._count("decode_tokens", ev.tokens)
            for f in both:
                f.decode_tokens.add(ev.tokens)
        if ev.tokens > 0 and prev is not None and prev.phase is Phase.DECODE and prev.turn == ev.turn:
            seconds = ev.time_s - prev.since_s
            if seconds > 0:
                self._rate.add(ev.tokens / seconds)
                self._rate_tokens.add(ev.tokens)

    def decode_rate(self) -> float:
        """Tokens/s per decoding sequence: recent decodes, weighted by their length."""
        if len(self._rate) == 0:
            return self._prior_tps
        r, w = self._rate.values(), self._rate_tokens.values()
        return float(w.sum() / (w / r).sum())  # total tokens over total seconds

    def _count(self, key: str, x: float) -> None:
        self._sums[key] += x
        self._counts[key] += 1

    def means(self, min_ended: int = 8) -> dict[str, float] | None:
        """The workload as observed over the run, as WorkloadHint's means (no concurrency); None
        until `min_ended` trajectories have ended (a turn count is only known at the end)."""
        if self._counts["turns"] < min_ended:
            return None
        pr = self.priors
        default = {"prompt_tokens": 0.0, "observation_tokens": pr.observation_tokens,
                   "decode_tokens": pr.decode_tokens, "tool_s": 0.0, "turns": 1.0}
        return {k: self._sums[k] / n if (n := self._counts[k]) else default[k] for k in self._sums}

    def tally(self, key: str) -> tuple[int, float]:
        """(count, sum) of one of WorkloadHint's means as observed so far."""
        return self._counts.get(key, 0), self._sums.get(key, 0.0)

    def observed(self, min_count: int) -> dict[str, float]:
        """The run's means so far (WorkloadHint's keys) of those observed at least `min_count` times."""
        return {k: self._sums[k] / n for k, n in self._counts.items() if n >= min_count}

    # -- predicting ----------------------------------------------------------------------------

    def predict(self, now_s: float, tracker: LifecycleTracker, blend: bool = True) -> Forecast:
        """`blend` False: the lifecycle model's prefill as it is, for a policy that will not act on
        this forecast (prorsa holding a rehearsed split): the blend refits its weights over every
        recent scored forecast (most of a control step's CPU) and reads the error book without
        writing it, so what is forecast later does not change. The blended forecast's own error is
        then scored only where one was made."""
        names, rows = tracker.table()
        rows = rows[np.lexsort((rows[:, 1], rows[:, 0]))]  # by family, then phase: groups are slices
        fam, rank, since, turn, ctx, app, dec = rows.T
        t = _Traj(rank, np.maximum(now_s - since, 0.0), turn, ctx, app, dec, self.n_bins)
        rate = self.decode_rate()
        wait = self._wait.mean(self.priors.wait_s)
        decode_seqs, kv = np.zeros(self.n_bins), np.zeros(self.n_bins)
        starts = np.flatnonzero(np.diff(fam, prepend=-1.0)).tolist() + [len(fam)]
        for lo, hi in zip(starts[:-1], starts[1:]):
            a, b = lo + np.searchsorted(rank[lo:hi], [Phase.DECODE.rank, Phase.TOOL.rank])
            groups = slice(lo, a), slice(a, b), slice(b, hi)  # queued/prefill, decode, tool
            seqs, held = self._family(self._view(names[int(fam[lo])]), groups, t, rate, wait)
            decode_seqs += seqs
            kv += held
        growth = np.maximum(self._mid[None, :] - t.start[:, None], 0.0) * rate
        decode_seqs += t.occ.sum(0)
        kv += (t.occ * ((t.ctx + t.app + t.gen)[:, None] + growth)).sum(0)
        arrivals = t.arrive.sum(1)
        weights = np.concatenate([arrivals, t.pre.astype(float)])
        cached = np.concatenate([t.prefix, t.ctx])  # under the next turn's / the queued append
        tps, turns = (t.arrive * t.obs[:, None]).sum(0) / self.bin_s, t.arrive.sum(0) / self.bin_s
        base = self.book.baselines(now_s)
        tps_b = self.book.blend("prefill_tps", tps, *base["prefill_tps"]) if blend else tps
        # Turns follow the blended tokens bin by bin at the model's tokens per turn: the allocator
        # reads the append size off their ratio.
        append = (tps.sum() / turns.sum() if turns.sum() > 0
                  else self._pool.obs_tokens.mean(self.priors.observation_tokens))
        fc = Forecast(
            start_s=now_s, bin_s=self.bin_s,
            prefill_tokens_per_s=tps_b, prefill_turns_per_s=_follow(turns, tps, tps_b, 1.0 / max(append, 1.0)),
            decode_seqs=decode_seqs, kv_tokens=kv,
            backlog_tokens=float(t.app[t.pre].sum()), backlog_turns=float(t.pre.sum()),
            backlog_fresh_turns=float((t.pre & (t.turn == 0)).sum()),
            prefill_prefix_tokens=float(weights @ cached / weights.sum()) if weights.sum() else 0.0,
            decode_tokens_per_turn=(float(arrivals @ t.dec_turn / arrivals.sum()) if arrivals.sum()
                                    else self._pool.decode_tokens.mean(self.priors.decode_tokens)),
            decode_remaining_tokens=float(t.rest[t.decoding].mean() * rate) if t.decoding.any() else 0.0,
            decode_tps_per_seq=rate, live=len(rows))
        self.book.remember(now_s, fc.prefill_tokens_per_s if blend else None, fc.decode_seqs,
                           lifecycle=(tps, decode_seqs), baselines=base)
        self.book.score(now_s)
        return fc

    def _family(self, v: FamilyView, groups: tuple[slice, slice, slice], t: _Traj, rate: float,
                wait: float) -> tuple[np.ndarray, np.ndarray]:
        """Fill in t's rows of one family (its queued, decoding and tool rows are the three
        slices); return the decode seqs and KV its arrivals add."""
        mp, md, mt = groups
        m = slice(mp.start, mt.stop)
        dur = v.dec / rate  # decode durations, seconds, sorted
        edges, mid = self._edges, self._mid
        t.obs[m], t.dec_turn[m] = v.obs_mean, v.dec_mean
        # The current decode: when it ends (per bin) and whether it still runs (bin middles).
        e = t.elapsed[md]
        c = cond_cdf(dur, e, self._points, _DECODE_TAIL)  # at edges, then at middles
        ends_d = np.diff(c[:, :self.n_bins + 1], axis=1)
        t.occ[md] = 1.0 - c[:, self.n_bins + 1:]
        t.rest[md] = cond_rest(dur, v.dec_suffix / rate, e, _DECODE_TAIL)
        t.gen[md] = e * rate
        w = np.maximum(wait - t.elapsed[mp], 0.0)
        ends_p = shifted_bins(dur, w, edges)
        t.occ[mp] = (mid[None, :] >= w[:, None]) * (1.0 - cdf(dur, mid[None, :] - w[:, None]))
        t.start[mp], t.rest[mp] = w, v.dec_mean / rate
        # Then a tool, with P(another turn); or a tool already running, conditioned on its age.
        hop = shifted_bins(v.tool, mid, edges)  # [a, b]: ended mid-bin a, back in bin b
        k = np.minimum(t.turn, len(v.hazard) - 1).astype(int)  # hazard index of each row's turn
        for rows, ends in ((md, ends_d), (mp, ends_p)):
            t.arrive[rows] = (1.0 - v.hazard[k[rows]])[:, None] * (ends @ hop)
        t.arrive[mt] = v.tool_on[k[mt]][:, None] * cond_bins(v.tool, t.elapsed[mt], edges, _TOOL_TAIL)
        t.prefix[m] = t.ctx[m] + t.app[m] + t.gen[m] + t.rest[m] * rate  # tool rows: rest = 0
        # What the arrivals decode: from mid-bin a plus the wait, for a decode length of f.
        lag = mid[None, :] - mid[:, None] - wait
        kernel = (lag >= 0) * (1.0 - cdf(dur, lag))
        arr = t.arrive[m]
        held = (arr * (t.prefix[m] + v.obs_mean + 0.5 * v.dec_mean)[:, None]).sum(0) @ kernel
        return arr.sum(0) @ kernel, held

    def errors(self) -> dict[str, float]:
        return self.book.errors()

    def _view(self, family: str) -> FamilyView:
        return self._families.get(family, self._pool).view(self._pool, self.priors)


def _follow(part: np.ndarray, total: np.ndarray, blended: np.ndarray, ratio: float) -> np.ndarray:
    """`part` per bin for the `blended` total instead of `total`: each bin's own part / total where
    the model put some there, else `ratio`."""
    each = np.divide(part, total, out=np.full_like(part, ratio), where=total > 1e-9)
    return blended * each
