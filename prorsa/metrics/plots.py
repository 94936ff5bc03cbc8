"""Figures of stored runs (matplotlib, drawn off-screen; figures.py supplies the numbers).

    Style(format, dpi)                  how every figure is written: png | svg | pdf, dots per inch
    role_timeline(run, label, path, style)  a swimlane per engine, coloured by role; switches marked
    demand_plot(run, label, path, style)    actual demand, the stored forecasts, forecast error (%)
    completion_cdf(runs, labels, path, style)    share of each run's trajectories completed over time
    latency_breakdown(runs, labels, path, style) mean seconds per phase of a turn, per turn index
    comparison_bars(groups, path, style)     makespan and trajectories/s per policy, a row per group,
                                             each bar labelled with its value
    reward_curve(versions, updates, path, style)

Titles and legends are words with units; colours come from palette.py, which the dashboard shares.
Figures are built without pyplot, so a report leaves no global state behind and needs no display.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from prorsa.metrics.figures import Bars, completion_times, demand, latency_by_turn, role_spans, switches
from prorsa.metrics.palette import BAR_COLOURS, FORECAST, PHASE_COLOURS, ROLE_COLOURS, role_colour
from prorsa.metrics.rundata import PHASES, RunData
from prorsa.metrics.words import metric_words, number

FORMATS = ("png", "svg", "pdf")
PHASE_WORDS = {"queue_s": "queued", "prefill_s": "prefill", "transfer_s": "KV transfer", "decode_s": "decode",
               "tool_s": "tool"}
MAPE_AXIS_CAP = 300.0  # %: a forecast of a near-empty interval can be off by thousands of percent


@dataclass(frozen=True)
class Style:
    format: str = "png"
    dpi: int = 150  # PNG resolution; SVG and PDF are vector (dpi sizes only embedded rasters)

    def file(self, stem: str) -> str:
        return f"{stem}.{self.format}"


def _save(fig: Figure, path: Path, style: Style) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=style.dpi, format=style.format)
    return path


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _legend_outside(ax, **kw) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False, **kw)


def _time_axis(run: RunData) -> str:
    return f"time since the rollout began ({run.clock} s)"


def role_timeline(run: RunData, label: str, path: Path, style: Style = Style()) -> Path:
    spans = role_spans(run)
    fig = Figure(figsize=(10, 1.2 + 0.45 * max(len(spans), 1)))
    ax = fig.add_subplot()
    ax.set_title(f"Engine roles over time: {label}")
    if not spans:
        _empty(ax, "no engine samples recorded")
        return _save(fig, path, style)
    names = run.role_names
    lanes = {engine: i for i, engine in enumerate(spans)}
    for engine, stretches in spans.items():
        for code, name in names.items():
            bars = [(a, b - a) for a, b, r in stretches if r == code]
            if bars:
                ax.broken_barh(bars, (lanes[engine] - 0.4, 0.8), facecolors=role_colour(name))
    for s in switches(run):
        if s.engine in lanes:
            y = lanes[s.engine]
            ax.plot([s.t, s.t + s.drain_s], [y, y], color="black", lw=2)
            ax.plot([s.t], [y], marker="v", color="black")
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.invert_yaxis()
    ax.set_xlabel(_time_axis(run))
    shown = {names.get(r) for stretches in spans.values() for _, _, r in stretches}
    handles = [Patch(color=c, label=n) for n, c in ROLE_COLOURS.items() if n in shown]
    handles.append(Line2D([], [], marker="v", color="black", label="role switch (line: drain)"))
    _legend_outside(ax, handles=handles)
    return _save(fig, path, style)


def demand_plot(run: RunData, label: str, path: Path, style: Style = Style()) -> Path:
    d = demand(run)
    fig = Figure(figsize=(10, 8))
    top, mid, low = fig.subplots(3, 1, sharex=True)
    top.set_title(f"Demand and its forecast: {label}")
    top.plot(d.active_t, d.active, color=ROLE_COLOURS["decode"], label="admitted sequences, all engines")
    mid.stairs(d.prefill_tps, d.prefill_edges, color=ROLE_COLOURS["prefill"],
               label="prompt tokens arriving (turns after the first)")
    for ax, key in ((top, "decode_seqs"), (mid, "prefill_tps")):
        if not d.checks.empty:
            c = d.checks
            ax.plot(c.t, c[f"realised_{key}"], color="gray", lw=1, label="realised, mean over the horizon")
            ax.plot(c.t, c[f"forecast_{key}"], ".", ms=4, color=FORECAST, label="forecast (horizon mean)")
        _legend_outside(ax)
    top.set_ylabel("sequences")
    mid.set_ylabel(f"tokens per {run.clock} s")
    if d.mape:
        peak = 0.0
        for metric, (t, v) in d.mape.items():
            pct = 100 * v
            low.plot(t, pct, marker=".", label=metric_words(metric))
            peak = max(peak, float(np.nanmax(pct)) if np.isfinite(pct).any() else 0.0)
        low.set_ylabel("forecast error, MAPE (%)")
        if peak > MAPE_AXIS_CAP:
            low.set_ylim(0, MAPE_AXIS_CAP)
            low.set_title(f"axis cut at {MAPE_AXIS_CAP:.0f}%; peak {number(peak)}%", fontsize=8, loc="right")
        _legend_outside(low)
    else:
        _empty(low, "no forecast error recorded")
    low.set_xlabel(_time_axis(run))
    return _save(fig, path, style)


def completion_cdf(runs: list[RunData], labels: list[str], path: Path, style: Style = Style()) -> Path:
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for run, label in zip(runs, labels):
        ends, total = completion_times(run), run.ds.sizes["trajectory"]
        if total:
            ax.step(np.concatenate([[0.0], ends]), 100 * np.arange(len(ends) + 1) / total, where="post",
                    label=f"{label} ({run.clock} clock)")
    clocks = sorted({r.clock for r in runs})
    ax.set_xlabel(f"time since the rollout began ({' or '.join(clocks)} s)")
    ax.set_ylabel("trajectories completed (%)")
    ax.set_ylim(0, 102)
    ax.set_title("Trajectory completion")
    _legend_outside(ax)
    return _save(fig, path, style)


def latency_breakdown(runs: list[RunData], labels: list[str], path: Path, style: Style = Style()) -> Path:
    fig = Figure(figsize=(10, 3.2 * len(runs)))
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, run, label in zip(axes, runs, labels):
        table = latency_by_turn(run)
        ax.set_title(f"Time per turn by phase: {label}")
        if table.empty:
            _empty(ax, "no turns recorded")
            continue
        bottom = np.zeros(len(table))
        for phase in PHASES:
            ax.bar(table.index, table[phase].values, bottom=bottom, color=PHASE_COLOURS[phase],
                   label=PHASE_WORDS[phase])
            bottom += table[phase].values
        ax.set_xlabel("turn (index within the trajectory)")
        ax.set_ylabel(f"mean {run.clock} s")
        _legend_outside(ax)
    return _save(fig, path, style)


def comparison_bars(groups: list[Bars], path: Path, style: Style = Style()) -> Path:
    width = max(10.0, 4.0 + 1.2 * max(len(g.labels) for g in groups))
    fig = Figure(figsize=(width, 3.8 * len(groups)))
    axes = fig.subplots(len(groups), 2, squeeze=False)
    for (left, right), g in zip(axes, groups):
        x = np.arange(len(g.labels))
        err = None if g.spread is None else np.abs(g.spread - g.makespan_s)
        bars = left.bar(x, g.makespan_s, yerr=err, color=BAR_COLOURS["makespan"], capsize=3)
        left.bar_label(bars, labels=[number(v) for v in g.makespan_s], fontsize=8, padding=2)
        left.set_title(f"{g.title}: makespan" + (f" ({g.spread_words})" if err is not None else ""), fontsize=10)
        left.set_ylabel(f"makespan ({g.clock} s; lower is better)")
        left.set_xticks(x, g.labels, rotation=30, ha="right", fontsize=8)
        left.margins(y=0.15)
        if g.trajectories_per_s is None:
            _empty(right, "trajectories/s not recorded")
        else:
            bars = right.bar(x, g.trajectories_per_s, color=BAR_COLOURS["throughput"])
            right.bar_label(bars, labels=[number(v) for v in g.trajectories_per_s], fontsize=8, padding=2)
            right.set_title(f"{g.title}: throughput", fontsize=10)
            right.set_ylabel(f"trajectories per {g.clock} s (higher is better)")
            right.set_xticks(x, g.labels, rotation=30, ha="right", fontsize=8)
            right.margins(y=0.15)
    return _save(fig, path, style)


def reward_curve(versions: pd.DataFrame, updates: pd.DataFrame, path: Path, style: Style = Style()) -> Path:
    """Mean reward of the rollouts each policy version generated, and the trainer's loss."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    ax.plot(versions["policy_version"], versions["reward_mean"], marker="o", label="mean reward of its rollouts")
    ax.set_xlabel("policy version (weight updates pushed)")
    ax.set_ylabel("mean reward")
    ax.set_title("Reward by policy version")
    if "loss" in updates:
        loss = ax.twinx()
        loss.plot(updates["version"] - 1, updates["loss"], color="tab:gray", linestyle="--", label="GRPO loss")
        loss.set_ylabel("GRPO loss of the update it went into")
        loss.legend(fontsize=8, loc="lower right")
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path, style)
