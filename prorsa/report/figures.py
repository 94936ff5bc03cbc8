"""The numbers a report shows, derived from stored runs only (plots.py draws them, report.py tabulates).

    headline(run)                   the headline figures, each once, unit in the name
    disagreements(run)              where summary.json and metrics.nc / parquet differ, in words
    role_spans(run)                 per engine, (start, end, role code) of every sampled stretch
    switches(run)                   the role changes on the report's clock
    completion_times(run)           end times of the completed trajectories, sorted
    latency_by_turn(run)            mean queue/prefill/transfer/decode/tool seconds per turn index
    demand(run)                     actual demand series, the forecasts stored at switches, and
                                    the forecast error per control interval
    comparison(runs) / sweep_bars(sweep)   makespan and trajectories/s per policy (a sweep's:
                                    one Bars per workload cell, seeds averaged)
    static_best_split(cells)        the split a sweep's static:best stands for there ("2:1")

Every time is on the run's report clock (rundata.py: wall for a live run, body for a simulated one).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from itertools import product

import numpy as np
import pandas as pd

from prorsa.metrics.recorder import RoleChange
from prorsa.metrics.words import metric_words
from prorsa.report.rundata import PHASES, RunData, Sweep
from prorsa.roles import Role

# (row, summary.json key, scale): the headline figures, each once, the unit in the row's name
SUMMARY_ROWS = (
    ("makespan (s)", "makespan_s", 1), ("trajectories expected", "trajectories_expected", 1),
    ("trajectories completed", "trajectories_completed", 1), ("trajectories failed", "trajectories_failed", 1),
    ("throughput (trajectories/s)", "trajectories_per_s", 1), ("turns", "turns", 1),
    ("tokens/s (prefill + decode)", "tokens_per_s", 1), ("decode tokens/s", "decode_tokens_per_s", 1),
    ("prefix cache hit rate (%)", "prefix_hit_rate", 100), ("role switches", "role_switches", 1),
    ("mean trajectory time (s)", "mean_trajectory_s", 1),
)


def headline(run: RunData) -> dict[str, object]:
    """summary.json's figures, then what only metrics.nc gives (completion percentiles, control
    intervals, the last forecast error), each once; the unit is in the key."""
    ds = run.ds
    done = ds.traj_completed.values.astype(bool)
    ends = ds.traj_end_s.values[done]
    out: dict[str, object] = {"policy": run.policy}
    for row, key, scale in SUMMARY_ROWS:
        value = run.summary.get(key)
        out[row] = value * scale if isinstance(value, (int, float)) and scale != 1 else value
    out |= {
        "completion time, median (s)": float(np.percentile(ends, 50)) if done.any() else None,
        "completion time, p90 (s)": float(np.percentile(ends, 90)) if done.any() else None,
        "control intervals": int(ds.sizes.get("control", 0)),
    }
    for metric, value in (last_mape(run) or {}).items():
        out[f"forecast error, {metric_words(metric)} (MAPE %)"] = 100 * value
    return out


def disagreements(run: RunData) -> list[str]:
    """Where summary.json and the stored rows disagree (a resumed run's summary counts every
    session, its metrics.nc only the last): each in words; none for a consistent run."""
    ds, s = run.ds, run.summary
    done = ds.traj_completed.values.astype(bool)
    durations = (ds.traj_end_s.values - ds.traj_start_s.values)[done]
    pairs = [("trajectories completed", s.get("trajectories_completed"), int(done.sum()), "metrics.nc"),
             ("role switches", s.get("role_switches"), int(ds.sizes.get("switch", 0)), "metrics.nc"),
             ("turns", s.get("turns"), len(run.turns), "trajectories.parquet"),
             ("mean trajectory time (s)", s.get("mean_trajectory_s"),
              float(durations.mean()) if done.any() else None, "metrics.nc")]
    return [f"{what}: summary.json {a}, {where} {b}" for what, a, b, where in pairs
            if a is not None and b is not None and not np.isclose(float(a), float(b), rtol=1e-3, atol=1e-6)]


def role_spans(run: RunData) -> dict[str, list[tuple[float, float, int]]]:
    """A sample's role holds until the next sample (the last one until the makespan)."""
    t = run.ds.time.values.astype(float)
    if not len(t):
        return {}
    end = max(float(run.summary.get("makespan_s") or 0.0), float(t[-1]))
    stops = np.append(t[1:], end)
    roles = run.ds.role.values
    spans: dict[str, list[tuple[float, float, int]]] = {}
    for j, engine in enumerate(run.ds.engine.values):
        spans[str(engine)] = [(float(a), float(b), int(r)) for a, b, r in zip(t, stops, roles[:, j]) if r >= 0]
    return spans


def switches(run: RunData) -> list[RoleChange]:
    """The run's role changes with t and drain_s on the report clock."""
    ds, unit = run.ds, run.control_unit
    if "switch_time_s" not in ds.variables:
        return []
    role = {code: Role(name) for code, name in run.role_names.items()}
    out = []
    for i in range(ds.sizes.get("switch", 0)):
        raw = str(ds.switch_forecast.values[i]) if "switch_forecast" in ds.variables else ""
        out.append(RoleChange(float(ds.switch_time_s.values[i]) * unit, str(ds.switch_engine.values[i]),
                              role[int(ds.switch_from.values[i])], role[int(ds.switch_to.values[i])],
                              str(ds.switch_reason.values[i]), float(ds.switch_drain_s.values[i]) * unit,
                              json.loads(raw) if raw.startswith("{") else {}))
    return out


def completion_times(run: RunData) -> np.ndarray:
    ds = run.ds
    return np.sort(ds.traj_end_s.values[ds.traj_completed.values.astype(bool)].astype(float))


def latency_by_turn(run: RunData) -> pd.DataFrame:
    if run.turns.empty:
        return pd.DataFrame(columns=list(PHASES))
    return run.turns.groupby("turn")[list(PHASES)].mean()


def latency_means(run: RunData) -> dict[str, float]:
    """Mean seconds per turn in each phase, over every turn of the run."""
    return {p: float(run.turns[p].mean()) if len(run.turns) else float("nan") for p in PHASES}


def _bins(run: RunData) -> tuple[list[str], list[tuple[float, float]]]:
    """forecast_bin labels and their (lo, hi) horizon offsets in body seconds."""
    if "forecast_bin" not in run.ds.variables:
        return [], []
    labels = [str(b) for b in run.ds.forecast_bin.values]
    spans = []
    for b in labels:
        lo, hi = b.split("@")[1].rstrip("s").split("-")
        spans.append((float(lo), float(hi)))
    return labels, spans


def mape_by_metric(run: RunData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per metric: control times and the MAPE averaged over the horizon bins known then."""
    labels, _ = _bins(run)
    if not labels or "control_t" not in run.ds.variables:
        return {}
    t = run.ds.control_t.values.astype(float) * run.control_unit
    mape = run.ds.forecast_mape.values
    out = {}
    for metric in sorted({b.split("@")[0] for b in labels}):
        cols = [j for j, b in enumerate(labels) if b.split("@")[0] == metric]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row: nothing scored yet
            vals = np.nanmean(mape[:, cols], axis=1) if len(t) else np.zeros(0)
        out[metric] = (t, vals)
    return out


def last_mape(run: RunData) -> dict[str, float] | None:
    """The error at the last interval that had one, per metric: summary.json's forecast_mape."""
    labels, _ = _bins(run)
    if not labels:
        return None
    mape = run.ds.forecast_mape.values
    rows = [i for i in range(mape.shape[0]) if np.isfinite(mape[i]).any()]
    if not rows:
        return None
    row = mape[rows[-1]]
    out: dict[str, list[float]] = {}
    for b, v in zip(labels, row):
        if np.isfinite(v):
            out.setdefault(b.split("@")[0], []).append(float(v))
    return {m: round(float(np.mean(v)), 4) for m, v in out.items()}


@dataclass(frozen=True)
class Demand:
    active_t: np.ndarray  # sample times
    active: np.ndarray  # sequences admitted, all engines
    prefill_edges: np.ndarray  # bin edges of the arrivals below
    prefill_tps: np.ndarray  # tokens appended by turns k > 0, per report-clock second, per bin
    checks: pd.DataFrame  # one row per control interval with a forecast (per switch for runs stored
    #   before metrics.nc kept them all): t, window_s, forecast and realised decode_seqs and
    #   prefill_tps, means over the horizon
    mape: dict[str, tuple[np.ndarray, np.ndarray]]
    missing: list[str]  # series the run does not record, in words


def demand(run: RunData) -> Demand:
    ds = run.ds
    active_t = ds.time.values.astype(float)
    active = ds.active.values.sum(axis=1) if ds.active.size else np.zeros(len(active_t))
    _, spans = _bins(run)
    horizon = max((hi for _, hi in spans), default=None)  # body seconds
    makespan = float(run.summary.get("makespan_s") or (active_t[-1] if len(active_t) else 1.0))
    # Bins as wide as the horizon (a forecast's figures are horizon means), or 1/40 of the run
    width = max(horizon * run.time_scale if horizon else 0.0, makespan / 40, 1e-6)
    edges = np.arange(0.0, makespan + width, width)
    later = run.turns[run.turns.turn > 0]
    tokens, _ = np.histogram(later.start_s.values, bins=edges, weights=later.prefill_tokens.values)
    missing = []
    stored = _stored_forecasts(run)
    if stored is None:
        missing.append("the forecast's values per control interval (this metrics.nc keeps them only at "
                       "role switches, `switch_forecast`)")
        stored = [(s.t, s.forecast) for s in switches(run)]
    checks = _forecast_checks(run, horizon, active_t, active, later, stored)
    if checks.empty:
        missing.append("forecast values (the policy made no forecast)")
    mape = mape_by_metric(run)
    if not mape:
        missing.append("forecast error (no control interval scored a forecast)")
    return Demand(active_t, active, edges, tokens / width, checks, mape, missing)


def _stored_forecasts(run: RunData) -> list[tuple[float, dict[str, float]]] | None:
    """(t on the report clock, figures) per control interval; None when metrics.nc predates them."""
    ds = run.ds
    if "control_forecast" not in ds.variables:
        return None
    names = [str(f) for f in ds.forecast_figure.values]
    out = []
    for t, row in zip(ds.control_t.values, ds.control_forecast.values):
        figures = {k: float(v) for k, v in zip(names, row) if np.isfinite(v)}
        if figures:
            out.append((float(t) * run.control_unit, figures))
    return out


def _forecast_checks(run: RunData, horizon: float | None, active_t: np.ndarray, active: np.ndarray,
                     later: pd.DataFrame, stored: list[tuple[float, dict[str, float]]]) -> pd.DataFrame:
    """Each stored forecast beside what followed it over its horizon (decode: the sampled
    sequences on every engine, which on a mixed engine include those prefilling)."""
    rows = []
    for t, forecast in stored:
        span = forecast.get("horizon_s", horizon)  # body seconds; older runs lack it
        if not forecast or not span:
            continue
        w = span * run.time_scale
        in_window = (active_t >= t) & (active_t < t + w)
        arrived = later.prefill_tokens[(later.start_s >= t) & (later.start_s < t + w)].sum()
        rows.append({"t": t, "window_s": w,
                     "forecast_decode_seqs": forecast.get("decode_seqs_mean", np.nan),
                     "realised_decode_seqs": float(active[in_window].mean()) if in_window.any() else np.nan,
                     "forecast_prefill_tps": forecast.get("prefill_tokens", np.nan) / w,
                     "realised_prefill_tps": float(arrived) / w})
    return pd.DataFrame(rows, columns=["t", "window_s", "forecast_decode_seqs", "realised_decode_seqs",
                                       "forecast_prefill_tps", "realised_prefill_tps"])


@dataclass(frozen=True)
class Bars:
    title: str  # in words: what the panel compares
    labels: list[str]
    makespan_s: np.ndarray
    trajectories_per_s: np.ndarray | None  # None: not recorded
    spread: np.ndarray | None = None  # (2, n) min/max of makespan over the dimensions averaged
    clock: str = "wall"  # the seconds of both figures
    spread_words: str = ""  # what the mean and the whiskers are over


MAX_PANELS = 12  # a sweep with more cells gets a panel per workload, the rest averaged


def comparison(runs: list[RunData]) -> Bars:
    labels = run_labels(runs)
    clocks = sorted({r.clock for r in runs})
    return Bars("stored runs", labels, np.array([_num(r.summary.get("makespan_s")) for r in runs]),
                np.array([_num(r.summary.get("trajectories_per_s")) for r in runs]), clock=" or ".join(clocks))


def sweep_bars(sweep: Sweep) -> list[Bars]:
    """A panel per cell of the sweep (workload, model, ... each of more than one value), never a
    mean across workloads: their makespans differ by an order of magnitude. Seeds are averaged,
    their min-max drawn as whiskers."""
    ds = sweep.ds
    cells = [d for d in ds.makespan_s.dims if d not in ("policy", "seed") and ds.sizes[d] > 1]
    if len(list(product(*(range(ds.sizes[d]) for d in cells)))) > MAX_PANELS:
        cells = [d for d in cells if d == "workload"]
    out = []
    for at in product(*(ds[d].values for d in cells)):
        sub = ds.sel(dict(zip(cells, at)))
        where = ", ".join(f"{d} {v}" for d, v in zip(cells, at))
        out.append(_policy_bars(sub, f"{_sweep_title(sweep)}{': ' + where if where else ''}", sweep.clock))
    return out


def _policy_bars(ds, title: str, clock: str) -> Bars:
    rest = [d for d in ds.makespan_s.dims if d != "policy" and ds.sizes[d] > 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a cell not simulated: NaN

        def per_policy(var: str, how: str) -> np.ndarray:
            other = [d for d in ds[var].dims if d != "policy"]
            return getattr(ds[var], how)(dim=other).values.astype(float) if other else ds[var].values.astype(float)

        spread = np.vstack([per_policy("makespan_s", "min"), per_policy("makespan_s", "max")]) if rest else None
        tps = per_policy("trajectories_per_s", "mean") if "trajectories_per_s" in ds.variables else None
        mean = per_policy("makespan_s", "mean")
    words = f"mean over {', '.join(rest)}; whiskers min-max" if rest else ""
    return Bars(title, [_policy_label(ds, str(p)) for p in ds.policy.values], mean, tps, spread, clock, words)


def _policy_label(ds, policy: str) -> str:
    split = static_best_split(ds) if policy == "static:best" else ""
    return f"static:{split} (best)" if split else policy


def static_best_split(ds) -> str:
    """The static P:D split static:best stands for in these cells of a sweep (sweep/merge.py
    stores it per cell; seeds may pick different ones: each is named); "" when not stored."""
    if "static_best_prefill" not in ds.variables:
        return ""
    pairs = zip(np.ravel(ds.static_best_prefill.values), np.ravel(ds.static_best_decode.values))
    return " or ".join(sorted({f"{int(p)}:{int(d)}" for p, d in pairs if np.isfinite(p) and np.isfinite(d)}))


def _sweep_title(sweep: Sweep) -> str:
    a = sweep.ds.attrs
    if "model" in a and "engines" in a:  # prorsa sim's results.nc: one pipeline, policies compared
        return f"{a.get('name', sweep.name)} ({a.get('mode', '?')}, {a['engines']} x {a.get('gpu', '?')}, {a['model']})"
    return f"sweep {a.get('name', sweep.name)}"


def run_labels(runs: list[RunData]) -> list[str]:
    """The policy names, with the directory where two runs share a policy."""
    policies = [r.policy for r in runs]
    return [p if policies.count(p) == 1 else f"{p} ({r.name})" for p, r in zip(policies, runs)]


def _num(x) -> float:
    return float("nan") if x is None else float(x)

