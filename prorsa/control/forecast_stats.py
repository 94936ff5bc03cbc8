"""The forecaster's memory: running per-family statistics and its own error book.

Used only by control/forecast.py; pure numpy, bounded memory, no clock.

    Samples(maxlen)            recent values; sorted view and suffix sums for conditional lookups
    FamilyStats                one family's tool latencies, observation and decode lengths, and
                               the fate of turn k (last or not); view(pool, priors) -> FamilyView
    cdf(s, x)                      P(X <= x), from sorted samples s
    cond_rest(s, suf, x, tail)     E[X - x | X > x] per x
    cond_cdf(s, e, x, tail)        P(X - e <= x | X > e) per (e, x); cond_bins: per (e, bin)
    shifted_bins(s, t0, edges)     P(t0 + X in bin) per (t0, bin)
    ErrorBook                  forecasts waiting for their time, what happened, MAPE per bin;
                               baselines(start), blend(metric, ...): the forecast it scores

Fallbacks, most specific first: the family's own samples once it has `min_samples`, else all
families pooled, else the prior (a single value). Probabilities (the end hazard per turn, the share
of ends reported after a TOOL phase) shrink instead: the family's counts plus `weight` pseudo-counts of the
pooled estimate, which itself is the pooled counts plus `weight` pseudo-counts of the prior.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

_MAX_TURN = 64  # hazard per turn index up to here; later turns share the last entry


@dataclass(frozen=True)
class Priors:
    tool_s: float = 1.0  # tool latency before any has been seen
    observation_tokens: float = 500.0  # tokens a tool observation appends
    decode_tokens: float = 400.0  # tokens one turn decodes
    end_hazard: float = 0.2  # P(a turn is the last one)
    end_via_tool: float = 0.5  # share of ends reported after a TOOL phase (body convention)
    wait_s: float = 0.1  # submitted -> decoding (queue + prefill)
    min_samples: int = 8  # a family's own samples replace the pooled ones from here
    weight: float = 4.0  # pseudo-counts the prior hazard is worth against observed ends


class Samples:
    """The last `maxlen` values; sorted view cached until the next add."""

    def __init__(self, maxlen: int):
        self._q: deque[float] = deque(maxlen=maxlen)
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, x: float) -> None:
        self._q.append(float(x))
        self._sorted = None

    def __len__(self) -> int:
        return len(self._q)

    def values(self) -> np.ndarray:
        return np.fromiter(self._q, float, len(self._q))

    def mean(self, default: float) -> float:
        return sum(self._q) / len(self._q) if self._q else default

    def sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """(ascending values, suffix sums with a trailing 0)."""
        if self._sorted is None:
            s = np.sort(self.values())
            self._sorted = s, np.append(np.cumsum(s[::-1])[::-1], 0.0)
        return self._sorted


@dataclass(frozen=True, eq=False)
class FamilyView:
    tool: np.ndarray  # sorted tool latencies, s
    dec: np.ndarray  # sorted decode lengths, tokens
    dec_suffix: np.ndarray  # suffix sums of dec
    obs_mean: float  # tokens an observation appends
    dec_mean: float  # tokens a turn decodes
    hazard: np.ndarray  # P(turn k is the last), by k
    tool_on: np.ndarray  # P(another turn | in TOOL at turn k), by k


class FamilyStats:
    def __init__(self, memory: int, priors: Priors):
        self.tool_s = Samples(memory)
        self.obs_tokens = Samples(memory)
        self.decode_tokens = Samples(memory)
        self.ends = np.zeros(_MAX_TURN + 1)  # turns k that were the last
        self.goes_on = np.zeros(_MAX_TURN + 1)  # turns k followed by another
        self.end_from = np.zeros(2)  # ends reported straight after [the decode, a tool phase]
        self._priors = priors

    def turn_fate(self, turn: int, last: bool) -> None:
        (self.ends if last else self.goes_on)[min(turn, _MAX_TURN)] += 1

    def hazard(self, prior: np.ndarray) -> np.ndarray:
        """P(turn k is the last), shrunk toward `prior` by `weight` pseudo-counts."""
        w = self._priors.weight
        return (self.ends + w * prior) / (self.ends + self.goes_on + w)

    def via_tool(self, prior: float) -> float:
        """P(an end is reported after a TOOL phase), shrunk the same way."""
        w = self._priors.weight
        return float((self.end_from[1] + w * prior) / (self.end_from.sum() + w))

    def view(self, pool: FamilyStats, pr: Priors) -> FamilyView:
        def pick(mine: Samples, pooled: Samples, prior: float) -> Samples | float:
            if len(mine) >= pr.min_samples:
                return mine
            return pooled if len(pooled) else prior

        def arr(x: Samples | float) -> tuple[np.ndarray, np.ndarray]:
            if isinstance(x, Samples):
                return x.sorted()
            return np.array([x]), np.array([x, 0.0])

        def mean(x: Samples | float) -> float:
            return x.mean(0.0) if isinstance(x, Samples) else x

        tool, _ = arr(pick(self.tool_s, pool.tool_s, pr.tool_s))
        dec = pick(self.decode_tokens, pool.decode_tokens, pr.decode_tokens)
        dec_sorted, dec_suffix = arr(dec)
        pooled_hazard = pool.hazard(np.full(_MAX_TURN + 1, pr.end_hazard))
        pooled_via = pool.via_tool(pr.end_via_tool)
        hazard, via = ((pooled_hazard, pooled_via) if self is pool
                       else (self.hazard(pooled_hazard), self.via_tool(pooled_via)))
        # In TOOL at turn k, the turn may still be the last (a body that reports every decode's
        # end as TOOL): P(last | TOOL) = h s / (1 - h (1 - s)), s the share of ends via TOOL.
        tool_on = 1.0 - hazard * via / np.maximum(1.0 - hazard * (1.0 - via), 1e-9)
        return FamilyView(tool=tool, dec=dec_sorted, dec_suffix=dec_suffix,
                          obs_mean=mean(pick(self.obs_tokens, pool.obs_tokens, pr.observation_tokens)),
                          dec_mean=mean(dec), hazard=hazard, tool_on=tool_on)


# -- conditional lookups on an empirical distribution (vectorised over trajectories) ----------

def cond_rest(s: np.ndarray, suffix: np.ndarray, x: np.ndarray, tail: float) -> np.ndarray:
    """E[X - x | X > x]; past the largest sample, `tail` times what has elapsed."""
    idx = np.searchsorted(s, x, side="right")
    above = len(s) - idx
    rest = suffix[idx] / np.maximum(above, 1) - x
    return np.where(above > 0, rest, tail * np.maximum(x, 1e-9))


def cdf(s: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(X <= x), elementwise."""
    return np.searchsorted(s, x, side="right") / len(s)


def cond_cdf(s: np.ndarray, e: np.ndarray, x: np.ndarray, tail: float) -> np.ndarray:
    """P(X - e <= x[j] | X > e[i]) as (len(e), len(x)); past the largest sample the rest is taken
    as uniform on (0, 2 tail e], so its mean is `tail` times the elapsed e."""
    base = np.searchsorted(s, e, side="right")
    left = len(s) - base
    below = np.searchsorted(s, e[:, None] + x[None, :], side="right") - base[:, None]
    p = below / np.maximum(left, 1)[:, None]
    uniform = np.clip(x[None, :] / (2.0 * tail * np.maximum(e, 1e-3))[:, None], 0.0, 1.0)
    return np.where((left > 0)[:, None], p, uniform)


def cond_bins(s: np.ndarray, e: np.ndarray, edges: np.ndarray, tail: float) -> np.ndarray:
    """P(X - e in (edges[j], edges[j+1]] | X > e), as cond_cdf."""
    return np.diff(cond_cdf(s, e, edges, tail), axis=1)


def shifted_bins(s: np.ndarray, t0: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """P(t0 + X in (edges[j], edges[j+1]])."""
    cum = np.searchsorted(s, edges[None, :] - t0[:, None], side="right")
    return np.diff(cum, axis=1) / len(s)


# -- error book ----------------------------------------------------------------------------------

METRICS = ("prefill_tps", "decode_seqs")
BASELINES = ("", "_persistence", "_ewma")  # the forecast's own error, then its two baselines'
LIFECYCLE = "_lifecycle"  # the lifecycle model's forecast before the blend, scored beside them
EWMA_ALPHA = 0.3
# The blend: weights on (calibrated lifecycle, lifecycle as it is, persistence, EWMA) in steps of
# 1/BLEND_STEPS, chosen afresh each forecast once MIN_FIT have been scored, from all scored so far
# (up to FIT_WINDOW), a forecast counting half as much every FIT_HALF_LIFE newer ones: which
# predictor is right drifts over a run (the model's statistics start thin; a step's tail is not
# its middle). The level correction forgets more slowly (LEVEL_HALF_LIFE): one burst of 10k-token
# observations swings a short window's sums; so slowly that it went on scaling the model down
# after the bias it corrected had gone, hence the model uncorrected beside it (SWE async prefill
# 0.88-0.94 of the better baseline's MAPE -> 0.78-0.79). One weighting serves every bin: chosen
# per bin, it chased each bin's noise (SWE async prefill: 0.77 of the better baseline's MAPE with
# one, 0.96 per bin).
BLEND_STEPS = 10
MIN_FIT = 8
FIT_WINDOW = 256
FIT_HALF_LIFE = 32.0
LEVEL_HALF_LIFE = 128.0
CALIBRATION = (0.2, 5.0)  # bounds on the lifecycle forecast's level correction


def _simplex(steps: int) -> np.ndarray:
    """Every (w_corrected, w_lifecycle, w_persistence, w_ewma) >= 0 summing to 1 in steps of
    1/steps, the lifecycle-heavy first (argmin keeps the first of equals)."""
    return np.array([(steps - r - p - e, r, p, e) for r in range(steps + 1) for p in range(steps + 1 - r)
                     for e in range(steps + 1 - r - p)], dtype=float) / steps


_WEIGHTS = _simplex(BLEND_STEPS)


def skill(errors: dict[str, float]) -> dict[str, dict[str, float]]:
    """ErrorBook.errors() as metric -> {forecast, persistence, ewma[, lifecycle]}: MAPE averaged
    over the bins."""
    sums: dict[tuple[str, str], list[float]] = {}
    for key, value in errors.items():
        metric = key.split("@")[0]
        base = next((b for b in (*BASELINES[1:], LIFECYCLE) if metric.endswith(b)), "")
        sums.setdefault((metric.removesuffix(base), base.lstrip("_") or "forecast"), []).append(value)
    out: dict[str, dict[str, float]] = {}
    for (metric, who), values in sorted(sums.items()):
        out.setdefault(metric, {})[who] = float(np.mean(values))
    return out


class ErrorBook:
    """Compares each remembered forecast with what then happened, once its horizon has passed
    (plus one bin of grace for late events).

    Realised prefill tokens/s: tokens of turns k > 0 submitted in the bin (new prompts are not
    forecast). Realised decode seqs: time-average of the number of trajectories in DECODE.
    MAPE per horizon bin j = mean over recent forecasts of |forecast - actual| / actual, skipping
    forecasts whose actual was 0 there (MAPE is undefined there; bursty prefill has many).

    Two baselines are scored beside every forecast, on the same bins: persistence (the last bin
    before the forecast, repeated over the horizon) and an exponentially weighted mean of those
    last bins (EWMA_ALPHA per forecast). A forecast that does not beat them is not worth its cost.
    Their keys: "prefill_tps_persistence@...", "prefill_tps_ewma@...", and the same for decode_seqs.

    The book also makes the forecast it scores for prefill (blend): the lifecycle model's forecast
    times its level correction per bin (what arrived over what it forecast, summed over recent
    scored forecasts: its error has a sign, e.g. while the first decodes to end are the short
    ones), mixed with the model's forecast as it is and the two baselines by the convex weights
    whose recent forecasts had the least MAPE. Each predictor is right somewhere else (the model
    on returns it sees coming, the last interval on a level that moves slowly), and which is right
    when is learned from this run's scored errors, never its future. The model's own forecast
    keeps its error under "..._lifecycle@...". Decode sequences are not blended: mixing in the
    baselines there made the forecast worse (search 0.50 -> 0.71 of the better baseline's MAPE).
    """

    def __init__(self, n_bins: int, bin_s: float, window: int):
        self.n_bins, self.bin_s = n_bins, bin_s
        self._pending: deque[tuple[float, list[tuple[str, str, np.ndarray]]]] = deque()
        self._arrivals: list[tuple[float, float]] = []
        self._changes: list[tuple[float, int]] = []
        self._level = 0  # sequences decoding at self._cut
        self._cut = float("-inf")  # changes before this are folded into _level
        self._ape = {f"{k}{b}": [deque(maxlen=window) for _ in range(n_bins)]
                     for k in METRICS for b in (*BASELINES, LIFECYCLE)}  # per horizon bin, recent APEs
        self._means: dict[tuple[str, int], float] = {}  # errors(), per (key, bin)
        self._stale: set[tuple[str, int]] = set()  # whose APEs changed since
        self._ewma: dict[str, float] = {}
        # per metric, the recent scored forecasts that had a lifecycle part, each (bins, [lifecycle,
        # persistence, ewma, actual]): what blend() fits
        self._fit: dict[str, deque[np.ndarray]] = {k: deque(maxlen=FIT_WINDOW) for k in METRICS}

    def arrival(self, t: float, tokens: int) -> None:
        if t >= self._cut:
            self._arrivals.append((t, float(tokens)))

    def decode_change(self, t: float, delta: int) -> None:
        if t < self._cut:
            self._level += delta
        else:
            self._changes.append((t, delta))

    def baselines(self, start: float) -> dict[str, tuple[float, float]]:
        """(persistence, EWMA) per metric for a forecast starting at `start`. Advances the EWMA:
        once per forecast, before remember()."""
        last = np.array([start - self.bin_s, start])  # the bin just before: what persistence repeats
        out = {}
        for key, seen in (("prefill_tps", self._realised_prefill(last)[0]),
                          ("decode_seqs", self._realised_decode(last)[0])):
            ewma = self._ewma[key] = EWMA_ALPHA * seen + (1 - EWMA_ALPHA) * self._ewma.get(key, seen)
            out[key] = (float(seen), float(ewma))
        return out

    def blend(self, metric: str, lifecycle: np.ndarray, persistence: float, ewma: float) -> np.ndarray:
        """The forecast per bin (the class docstring): the lifecycle forecast as it is until
        MIN_FIT forecasts that had a lifecycle part have been scored."""
        out = np.asarray(lifecycle, dtype=float).copy()
        hist = self._fit[metric]
        if len(hist) < MIN_FIT:
            return out
        h = np.stack(hist)  # (forecasts, bins, [lifecycle, persistence, ewma, actual]), oldest first
        age = np.arange(len(h))[::-1, None]
        d, dl = 0.5 ** (age / FIT_HALF_LIFE), 0.5 ** (age / LEVEL_HALF_LIFE)
        made, actual = (dl * h[..., 0]).sum(0), (dl * h[..., 3]).sum(0)
        level = np.clip(np.divide(actual, made, out=np.ones_like(made), where=made > 0), *CALIBRATION)
        seen = h[..., 3] > 0  # MAPE skips what was 0, as errors() does
        wsum = (d * seen).sum(0)  # (bins,)
        keep = wsum > 0  # bins something came in: only they tell the weightings apart
        if not keep.any():
            return out * level
        h, seen, wsum = h[:, keep], seen[:, keep], wsum[keep]
        comps = np.concatenate([h[..., :1] * level[None, keep, None], h[..., :3]], axis=2)
        # (weightings, forecasts, bins): what every weighting would have said, then its weighted
        # APE, in place: this is most of a control step's CPU
        ape = np.einsum("wk,fbk->wfb", _WEIGHTS, comps)
        np.subtract(ape, h[None, ..., 3], out=ape)
        np.abs(ape, out=ape)
        np.divide(ape, np.where(seen, h[..., 3], 1.0)[None], out=ape)
        np.multiply(ape, (d * seen)[None], out=ape)
        per_bin = ape.sum(1) / np.maximum(wsum, 1e-12)[None]
        w = _WEIGHTS[int(np.argmin(per_bin.mean(1)))]
        return w[0] * out * level + w[1] * out + w[2] * persistence + w[3] * ewma

    def remember(self, start: float, prefill_tps: np.ndarray | None, decode_seqs: np.ndarray,
                 lifecycle: tuple[np.ndarray, np.ndarray] | None = None,
                 baselines: dict[str, tuple[float, float]] | None = None) -> None:
        """Keep a forecast, its baselines (from baselines(start) when not given) and `lifecycle`,
        the model's (prefill, decode) forecast before blend(), to score once their time has passed;
        `prefill_tps` None: no blended prefill forecast was made (its baselines and the model's
        are kept still)."""
        base = baselines if baselines is not None else self.baselines(start)
        preds = []  # (metric, what it forecasts, per bin)
        for k, (key, mine) in enumerate((("prefill_tps", prefill_tps), ("decode_seqs", decode_seqs))):
            seen, ewma = base[key]
            preds += [(key, key, mine.copy())] if mine is not None else []
            preds += [(f"{key}_persistence", key, np.full(self.n_bins, seen)),
                      (f"{key}_ewma", key, np.full(self.n_bins, ewma))]
            if lifecycle is not None:
                preds.append((f"{key}{LIFECYCLE}", key, np.asarray(lifecycle[k], dtype=float).copy()))
        self._pending.append((start, preds))

    def score(self, now: float) -> None:
        span = (self.n_bins + 1) * self.bin_s
        while self._pending and self._pending[0][0] + span <= now:
            start, preds = self._pending.popleft()
            edges = start + np.arange(self.n_bins + 1) * self.bin_s
            actual = {"prefill_tps": self._realised_prefill(edges), "decode_seqs": self._realised_decode(edges)}
            for metric, key, pred in preds:
                self._record(metric, pred, actual[key])
            by = {metric: pred for metric, _, pred in preds}
            for key in METRICS:
                if f"{key}{LIFECYCLE}" in by:
                    self._fit[key].append(np.stack([by[f"{key}{LIFECYCLE}"], by[f"{key}_persistence"],
                                                    by[f"{key}_ewma"], actual[key]], axis=1))
        self._prune(self._pending[0][0] if self._pending else now - span)

    def errors(self) -> dict[str, float]:
        # asked every control interval; a mean changes only where a forecast was scored since. A
        # plain sum, not numpy's: a few dozen short windows a step, where the call is the cost (the
        # means are recorded, never decided on)
        for key, j in self._stale:
            if ape := self._ape[key][j]:
                self._means[key, j] = float(sum(ape)) / len(ape)
        self._stale.clear()
        return {f"{key}@{j * self.bin_s:g}-{(j + 1) * self.bin_s:g}s": self._means[key, j]
                for key in self._ape for j in range(self.n_bins) if (key, j) in self._means}

    def _record(self, key: str, pred: np.ndarray, actual: np.ndarray) -> None:
        for j in np.flatnonzero(actual > 0):
            self._ape[key][j].append(abs(pred[j] - actual[j]) / actual[j])
            self._stale.add((key, int(j)))

    def _realised_prefill(self, edges: np.ndarray) -> np.ndarray:
        if not self._arrivals:
            return np.zeros(self.n_bins)
        t, tok = np.array(self._arrivals).T
        j = np.searchsorted(edges, t, side="right") - 1
        ok = (j >= 0) & (j < self.n_bins)
        return np.bincount(j[ok], weights=tok[ok], minlength=self.n_bins) / self.bin_s

    def _realised_decode(self, edges: np.ndarray) -> np.ndarray:
        ch = sorted(self._changes, key=lambda c: c[0])  # stable: same-time changes keep their order
        t = np.array([c[0] for c in ch])
        level = self._level + np.cumsum([c[1] for c in ch]) if ch else np.zeros(0)
        grid = np.unique(np.concatenate([edges, t[(t > edges[0]) & (t < edges[-1])]]))
        i = np.searchsorted(t, grid[:-1], side="right") - 1
        at = np.where(i >= 0, level[np.maximum(i, 0)] if len(level) else 0, self._level)
        j = np.searchsorted(edges, grid[:-1], side="right") - 1
        return np.bincount(j, weights=at * np.diff(grid), minlength=self.n_bins) / self.bin_s

    def _prune(self, cut: float) -> None:
        if cut <= self._cut:
            return
        self._level += sum(d for t, d in self._changes if t < cut)
        self._changes = [c for c in self._changes if c[0] >= cut]
        self._arrivals = [a for a in self._arrivals if a[0] >= cut]
        self._cut = cut
