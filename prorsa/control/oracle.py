"""The oracle: prorsa's allocator fed with the true future of a replayed workload (simulator only).

    oracle[:horizon_s[:hysteresis[:max_switches[:votes[:min_gain]]]]]   as prorsa, but its forecast knows each
        live trajectory's remaining turns exactly: decode lengths, tool latencies, which turn is the
        last and what each observation appends. Only timing is still estimated (the measured
        decode rate and submit-to-decode wait), so the gap between prorsa and the oracle is the
        price of forecasting, and the gap between the oracle and the lower bound the rest.

It needs PolicyContext.future (traj_id -> TrajectorySpec, tool latencies in body seconds), which
only the simulator can give; a live run has no future to read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from prorsa.agent.trace import TrajectorySpec
from prorsa.control.adaptive import Prorsa
from prorsa.control.forecast import Forecast, Forecaster
from prorsa.control.lifecycle import LifecycleTracker, Phase
from prorsa.control.policy import PolicyContext, register


class TrueFutureForecaster(Forecaster):
    """Learns rates and waits like the Forecaster; predicts from the specs instead of statistics."""

    def __init__(self, future: Callable[[str], TrajectorySpec], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.future = future

    def predict(self, now_s: float, tracker: LifecycleTracker) -> Forecast:
        n, bin_s = self.n_bins, self.bin_s
        end = now_s + n * bin_s
        mids = now_s + (np.arange(n) + 0.5) * bin_s
        rate = self.decode_rate()
        wait = self._wait.mean(self.priors.wait_s)
        arrive_tok, arrive_n = np.zeros(n), np.zeros(n)
        seqs, kv = np.zeros(n), np.zeros(n)
        backlog = backlog_turns = fresh = 0.0
        under: list[tuple[float, float]] = []  # (weight, cached context under a prefill)
        dec_of_arrivals: list[float] = []
        remaining: list[float] = []
        live = tracker.live()
        for s in live:
            turns = self.future(s.traj_id).turns
            k, ctx = s.turn, s.context  # ctx: before turn k's append
            turn = turns[k]
            if s.phase.rank <= Phase.PREFILL.rank:
                backlog += turn.appended_tokens
                backlog_turns += 1
                fresh += k == 0
                under.append((1.0, ctx))
                start = max(s.since_s + wait, now_s)
            elif s.phase is Phase.DECODE:
                start = s.since_s
                remaining.append(max(turn.decode_tokens - (now_s - s.since_s) * rate, 1.0))
            else:  # TOOL: turn k's decode is over
                start = None
            while k < len(turns):
                turn = turns[k]
                if start is not None:  # turn k decodes from `start`
                    stop = max(start + turn.decode_tokens / rate, now_s)
                    on = (mids >= start) & (mids < stop)
                    seqs += on
                    kv += on * (ctx + turn.appended_tokens + (mids - start).clip(0) * rate)
                    if turn.done:
                        break
                    tool_end = stop + turn.tool_latency_s
                elif turn.done:  # the last turn's (empty) tool: it is about to end
                    break
                else:
                    tool_end = max(s.since_s + turn.tool_latency_s, now_s)
                ctx += turn.appended_tokens + turn.decode_tokens
                k += 1
                if tool_end >= end or k >= len(turns):
                    break
                nxt = turns[k]
                b = int((tool_end - now_s) // bin_s)
                arrive_tok[b] += nxt.appended_tokens
                arrive_n[b] += 1
                under.append((1.0, ctx))
                dec_of_arrivals.append(nxt.decode_tokens)
                start = tool_end + wait
        w = sum(x for x, _ in under)
        fc = Forecast(
            start_s=now_s, bin_s=bin_s, prefill_tokens_per_s=arrive_tok / bin_s,
            prefill_turns_per_s=arrive_n / bin_s, decode_seqs=seqs, kv_tokens=kv,
            backlog_tokens=backlog, backlog_turns=backlog_turns, backlog_fresh_turns=fresh,
            prefill_prefix_tokens=sum(x * c for x, c in under) / w if w else 0.0,
            decode_tokens_per_turn=(float(np.mean(dec_of_arrivals)) if dec_of_arrivals
                                    else self._pool.decode_tokens.mean(self.priors.decode_tokens)),
            decode_tps_per_seq=rate,
            decode_remaining_tokens=float(np.mean(remaining)) if remaining else 0.0, live=len(live))
        self.book.remember(now_s, fc.prefill_tokens_per_s, fc.decode_seqs)
        self.book.score(now_s)
        return fc


@register("oracle")
class Oracle(Prorsa):
    """oracle[:horizon_s[:hysteresis[:max_switches[:votes[:min_gain]]]]] (defaults as prorsa; simulator only)."""

    def __init__(self, *args: str, context: PolicyContext | None = None) -> None:
        if context is None or context.future is None:
            raise ValueError("the oracle reads the workload's future, which only `prorsa sim` has")
        super().__init__(*args, context=context)
        self.name = ":".join(("oracle", *args))
        self.prior = context.future_means or self.prior  # it opens on the run's own means
        old = self.forecaster
        self.forecaster = TrueFutureForecaster(context.future, old.horizon_s, old.bin_s,
                                               decode_tps=old._prior_tps)
