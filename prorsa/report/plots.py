"""Figures of stored runs (matplotlib, drawn off-screen; figures.py supplies the numbers).

    role_timeline(run, label) -> Figure       a swimlane per engine, coloured by role; switches marked
    demand_plot(run, label) -> Figure         actual demand, the stored forecasts, forecast error (%)
    completion_cdf(runs, labels) -> Figure    share of each run's trajectories completed over time
    latency_breakdown(runs, labels) -> Figure mean seconds per phase of a turn, per turn index
    comparison_bars(groups) -> Figure         makespan and trajectories/s per policy, a row per group,
                                              each bar labelled with its value
    reward_curve(versions, updates, loss_name) -> Figure

style.save writes each as PNG, SVG and PDF. Titles and legends are words with units; legends sit
beside the axes, never over the data; axes that count (turns, versions, sequences) have integer
ticks; colours, markers and dashes come from style.py and palette.py, which the dashboard shares.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from prorsa.metrics.palette import BAR_COLOURS, FORECAST, PHASE_COLOURS, ROLE_COLOURS, UNKNOWN, role_colour
from prorsa.metrics.words import metric_words, number
from prorsa.report.figures import Bars, completion_times, demand, latency_by_turn, role_spans, switches
from prorsa.report.rundata import PHASES, RunData
from prorsa.report.style import FONT, count_axis, figure, legend_beside, series

PHASE_WORDS = {"queue_s": "queued", "prefill_s": "prefill", "transfer_s": "KV transfer", "decode_s": "decode",
               "tool_s": "tool"}
MAPE_AXIS_CAP = 300.0  # %: a forecast of a near-empty interval can be off by thousands of percent
# Why the forecast sits below what followed (control/forecast.py): it is built from the trajectories
# live when it is made, their running turn and the next one; later turns and new prompts are not in it
FORECAST_SCOPE = ("forecast: the trajectories live at the time, their current and next turn only\n"
                  "(later turns and prompts not yet sent are not forecast, so over a horizon of\n"
                  "several turns it falls below what was realised)")


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _time_axis(run: RunData) -> str:
    return f"time since the rollout began ({run.clock} s)"


def role_timeline(run: RunData, label: str) -> Figure:
    spans = role_spans(run)
    fig = figure(10, 1.4 + 0.45 * max(len(spans), 1))
    ax = fig.add_subplot()
    ax.set_title(f"Engine roles over time: {label}")
    if not spans:
        _empty(ax, "no engine samples recorded")
        return fig
    names = run.role_names
    lanes = {engine: i for i, engine in enumerate(spans)}
    for engine, stretches in spans.items():
        for code, name in names.items():
            bars = [(a, b - a) for a, b, r in stretches if r == code]
            if bars:
                ax.broken_barh(bars, (lanes[engine] - 0.4, 0.8), facecolors=role_colour(name))
    moves = switches(run)
    for s in moves:
        if s.engine in lanes:
            y = lanes[s.engine]
            ax.plot([s.t, s.t + s.drain_s], [y, y], color="black", lw=2)
            ax.plot([s.t], [y], marker="v", color="black")
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.invert_yaxis()
    ax.set_xlabel(_time_axis(run))
    shown = {names.get(r) for stretches in spans.values() for _, _, r in stretches}
    handles = [Patch(color=c, label=n) for n, c in ROLE_COLOURS.items() if n in shown]
    if moves:
        handles.append(Line2D([], [], marker="v", color="black", label="role switch (line: drain)"))
    legend_beside(ax, handles=handles)
    return fig


def demand_plot(run: RunData, label: str) -> Figure:
    d = demand(run)
    fig = figure(10, 8.5)
    top, mid, low = fig.subplots(3, 1, sharex=True)
    top.set_title(f"Demand and its forecast: {label}")
    top.plot(d.active_t, d.active, color=ROLE_COLOURS["decode"], label="admitted sequences, all engines")
    mid.stairs(d.prefill_tps, d.prefill_edges, color=ROLE_COLOURS["prefill"],
               label="prompt tokens arriving (turns after the first)")
    for ax, key in ((top, "decode_seqs"), (mid, "prefill_tps")):
        if not d.checks.empty:
            c = d.checks
            ax.plot(c.t, c[f"realised_{key}"], color=UNKNOWN, lw=1.5, marker="o", ms=3,
                    label="realised, mean over the horizon")
            ax.plot(c.t, c[f"forecast_{key}"], linestyle="none", marker="x", ms=5, color=FORECAST,
                    label="forecast (horizon mean)")
        legend_beside(ax)
    if not d.checks.empty:
        top.text(1.01, 0.0, FORECAST_SCOPE, transform=top.transAxes, fontsize=FONT - 1, va="bottom",
                 color="dimgray")
    top.set_ylabel("sequences")
    count_axis(top.yaxis)
    mid.set_ylabel(f"tokens per {run.clock} s")
    if d.mape:
        peak = 0.0
        for i, (names, t, v) in enumerate(_same_series(d.mape)):
            pct = 100 * v
            low.plot(t, pct, label=_same_words([metric_words(m) for m in names]), **series(i))
            peak = max(peak, float(np.nanmax(pct)) if np.isfinite(pct).any() else 0.0)
        low.set_ylabel("forecast error, MAPE (%)")
        if peak > MAPE_AXIS_CAP:
            low.set_ylim(0, MAPE_AXIS_CAP)
            low.set_title(f"axis cut at {MAPE_AXIS_CAP:.0f}%; peak {number(peak)}%", fontsize=FONT, loc="right")
        legend_beside(low)
    else:
        _empty(low, "no forecast error recorded")
    low.set_xlabel(_time_axis(run))
    return fig


def _same_series(curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[tuple[list[str], np.ndarray, np.ndarray]]:
    """Curves that are equal drawn once under all their names: the blend leaves decoding
    sequences the lifecycle model's own, and one line on top of the other would hide it."""
    out: list[tuple[list[str], np.ndarray, np.ndarray]] = []
    for name, (t, v) in curves.items():
        same = next((names for names, u, w in out if len(u) == len(t) and np.allclose(u, t)
                     and np.allclose(w, v, equal_nan=True)), None)
        if same is None:
            out.append(([name], t, v))
        else:
            same.append(name)
    return out


def _same_words(words: list[str]) -> str:
    """'decoding sequences (= lifecycle model before the blend)': the others' own part, in brackets."""
    rest = [w.removeprefix(f"{words[0]}, ") for w in words[1:]]
    return words[0] + (f" (= {'; '.join(rest)})" if rest else "")


def completion_cdf(runs: list[RunData], labels: list[str]) -> Figure:
    fig = figure(8, 4.5)
    ax = fig.add_subplot()
    for i, (run, label) in enumerate(zip(runs, labels)):
        ends, total = completion_times(run), run.ds.sizes["trajectory"]
        if total:
            ax.step(np.concatenate([[0.0], ends]), 100 * np.arange(len(ends) + 1) / total, where="post",
                    label=f"{label} ({run.clock} clock)", markevery=max(1, len(ends) // 8), **series(i))
    clocks = sorted({r.clock for r in runs})
    ax.set_xlabel(f"time since the rollout began ({' or '.join(clocks)} s)")
    ax.set_ylabel("trajectories completed (%)")
    ax.set_ylim(0, 102)
    ax.set_title("Trajectory completion")
    legend_beside(ax)
    return fig


def latency_breakdown(runs: list[RunData], labels: list[str]) -> Figure:
    fig = figure(10, 0.4 + 3.0 * len(runs))
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
        count_axis(ax.xaxis)
        ax.set_ylabel(f"mean {run.clock} s")
        legend_beside(ax)
    return fig


def comparison_bars(groups: list[Bars]) -> Figure:
    width = max(10.0, 4.0 + 1.2 * max(len(g.labels) for g in groups))
    fig = figure(width, 3.8 * len(groups))
    axes = fig.subplots(len(groups), 2, squeeze=False)
    for (left, right), g in zip(axes, groups):
        x = np.arange(len(g.labels))
        err = None if g.spread is None else np.abs(g.spread - g.makespan_s)
        bars = left.bar(x, g.makespan_s, yerr=err, color=BAR_COLOURS["makespan"], capsize=3)
        left.bar_label(bars, labels=[number(v) for v in g.makespan_s], fontsize=FONT, padding=2)
        left.set_title(f"{g.title}: makespan" + (f" ({g.spread_words})" if err is not None else ""), fontsize=10)
        left.set_ylabel(f"makespan ({g.clock} s; lower is better)")
        left.set_xticks(x, g.labels, rotation=30, ha="right", fontsize=FONT)
        left.margins(y=0.15)
        if g.trajectories_per_s is None:
            _empty(right, "trajectories/s not recorded")
        else:
            bars = right.bar(x, g.trajectories_per_s, color=BAR_COLOURS["throughput"])
            right.bar_label(bars, labels=[number(v) for v in g.trajectories_per_s], fontsize=FONT, padding=2)
            right.set_title(f"{g.title}: throughput", fontsize=10)
            right.set_ylabel(f"trajectories per {g.clock} s (higher is better)")
            right.set_xticks(x, g.labels, rotation=30, ha="right", fontsize=FONT)
            right.margins(y=0.15)
    return fig


def reward_curve(versions: pd.DataFrame, updates: pd.DataFrame, loss_name: str) -> Figure:
    """Mean reward of the rollouts each policy version generated, and the trainer's loss."""
    fig = figure(8, 4.5)
    ax = fig.add_subplot()
    ax.plot(versions["policy_version"], versions["reward_mean"], label="mean reward of its rollouts", **series(0))
    ax.set_xlabel("policy version (weight updates pushed)")
    count_axis(ax.xaxis)
    ax.set_ylabel("mean reward")
    ax.set_title("Reward by policy version")
    handles = ax.get_legend_handles_labels()[0]
    if "loss" in updates:
        loss = ax.twinx()
        loss.plot(updates["version"] - 1, updates["loss"], label=loss_name, **series(1))
        loss.set_ylabel(f"{loss_name} of the update it went into")
        handles += loss.get_legend_handles_labels()[0]
    # beside the right-hand axis's labels, so neither axis's data is under it
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.12, 1.0), borderaxespad=0.0, fontsize=FONT,
              frameon=False)
    return fig
