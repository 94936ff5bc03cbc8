"""PNG plots of stored runs (matplotlib, drawn off-screen; figures.py supplies the numbers).

    role_timeline(run, path)          a swimlane per engine, coloured by role; switches marked
    demand_plot(run, path)            actual demand, the forecasts stored at switches, forecast error
    completion_cdf(runs, path)        share of each run's trajectories completed over time
    latency_breakdown(runs, path)     mean queue/prefill/transfer/decode/tool seconds per turn index
    comparison_bars(groups, path)     makespan and trajectories/s per policy, one row per group

Figures are built without pyplot, so a report leaves no global state behind and needs no display.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from prorsa.metrics.figures import Bars, completion_times, demand, latency_by_turn, role_spans, switches
from prorsa.metrics.rundata import PHASES, RunData

ROLE_COLOURS = {"prefill": "tab:blue", "decode": "tab:orange", "mixed": "tab:green"}
PHASE_COLOURS = dict(zip(PHASES, ("tab:gray", "tab:blue", "tab:purple", "tab:orange", "tab:olive")))


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    return path


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def role_timeline(run: RunData, path: Path) -> Path:
    spans = role_spans(run)
    fig = Figure(figsize=(10, 1.0 + 0.45 * max(len(spans), 1)))
    ax = fig.add_subplot()
    ax.set_title(f"{run.name}: engine roles ({run.policy})")
    if not spans:
        _empty(ax, "no engine samples recorded")
        return _save(fig, path)
    names = run.role_names
    lanes = {engine: i for i, engine in enumerate(spans)}
    for engine, stretches in spans.items():
        for code, colour in ((c, ROLE_COLOURS.get(n, "tab:red")) for c, n in names.items()):
            bars = [(a, b - a) for a, b, r in stretches if r == code]
            if bars:
                ax.broken_barh(bars, (lanes[engine] - 0.4, 0.8), facecolors=colour)
    for s in switches(run):
        if s.engine in lanes:
            y = lanes[s.engine]
            ax.plot([s.t, s.t + s.drain_s], [y, y], color="black", lw=2)
            ax.plot([s.t], [y], marker="v", color="black")
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.invert_yaxis()
    ax.set_xlabel(f"{run.clock} seconds since the rollout began")
    shown = {names.get(r) for stretches in spans.values() for _, _, r in stretches}
    handles = [Patch(color=c, label=n) for n, c in ROLE_COLOURS.items() if n in shown]
    handles.append(Line2D([], [], marker="v", color="black", label="switch (line: drain)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return _save(fig, path)


def demand_plot(run: RunData, path: Path) -> Path:
    d = demand(run)
    fig = Figure(figsize=(10, 8))
    top, mid, low = fig.subplots(3, 1, sharex=True)
    top.set_title(f"{run.name}: demand, forecasts, forecast error")
    top.plot(d.active_t, d.active, label="active sequences, all engines (sampled)")
    mid.stairs(d.prefill_tps, d.prefill_edges, label="prefill tokens arriving, turns > 0")
    for ax, key in ((top, "decode_seqs"), (mid, "prefill_tps")):
        if not d.checks.empty:
            c = d.checks
            ax.plot(c.t, c[f"realised_{key}"], color="black", lw=1, label="realised, mean over the next horizon")
            ax.plot(c.t, c[f"forecast_{key}"], ".", ms=4, color="tab:red", label="forecast at t (horizon mean)")
        ax.legend(fontsize=8)
    top.set_ylabel("sequences")
    mid.set_ylabel(f"tokens / {run.clock} s")
    if d.mape:
        for metric, (t, v) in d.mape.items():
            low.plot(t, v, marker=".", label=metric)
        low.set_ylabel("forecast MAPE")
        low.legend(fontsize=8)
    else:
        _empty(low, "no forecast error recorded")
    low.set_xlabel(f"{run.clock} seconds since the rollout began")
    return _save(fig, path)


def completion_cdf(runs: list[RunData], labels: list[str], path: Path) -> Path:
    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for run, label in zip(runs, labels):
        ends, total = completion_times(run), run.ds.sizes["trajectory"]
        if total:
            ax.step(np.concatenate([[0.0], ends]), np.arange(len(ends) + 1) / total, where="post",
                    label=f"{label} ({run.clock} s)")
    ax.set_xlabel("seconds since the rollout began")
    ax.set_ylabel("share of trajectories completed")
    ax.set_ylim(0, 1.02)
    ax.set_title("trajectory completion")
    ax.legend(fontsize=8)
    return _save(fig, path)


def latency_breakdown(runs: list[RunData], labels: list[str], path: Path) -> Path:
    fig = Figure(figsize=(10, 3.2 * len(runs)))
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, run, label in zip(axes, runs, labels):
        table = latency_by_turn(run)
        ax.set_title(f"{label}: mean per-turn latency by turn index")
        if table.empty:
            _empty(ax, "no turns recorded")
            continue
        bottom = np.zeros(len(table))
        for phase in PHASES:
            ax.bar(table.index, table[phase].values, bottom=bottom, color=PHASE_COLOURS[phase],
                   label=phase.removesuffix("_s"))
            bottom += table[phase].values
        ax.set_xlabel("turn")
        ax.set_ylabel(f"{run.clock} seconds")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def comparison_bars(groups: list[Bars], path: Path) -> Path:
    fig = Figure(figsize=(11, 3.5 * len(groups)))
    axes = fig.subplots(len(groups), 2, squeeze=False)
    for (left, right), g in zip(axes, groups):
        x = np.arange(len(g.labels))
        err = None if g.spread is None else np.abs(g.spread - g.makespan_s)
        left.bar(x, g.makespan_s, yerr=err, color="tab:blue", capsize=3)
        left.set_title(f"{g.title}: makespan" + (" (mean, min-max)" if err is not None else ""))
        left.set_ylabel("seconds")
        left.set_xticks(x, g.labels, rotation=30, ha="right", fontsize=8)
        if g.trajectories_per_s is None:
            _empty(right, "trajectories/s not recorded")
        else:
            right.bar(x, g.trajectories_per_s, color="tab:orange")
            right.set_title(f"{g.title}: trajectories / s")
            right.set_xticks(x, g.labels, rotation=30, ha="right", fontsize=8)
    return _save(fig, path)


def reward_curve(versions: pd.DataFrame, updates: pd.DataFrame, path: Path) -> Path:
    """Mean reward of the rollouts each policy version generated, and the trainer's loss."""
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    ax.plot(versions["policy_version"], versions["reward_mean"], marker="o", label="mean reward of its rollouts")
    ax.set_xlabel("policy version (weight updates pushed)")
    ax.set_ylabel("mean reward")
    ax.set_title("reward curve")
    if "loss" in updates:
        loss = ax.twinx()
        loss.plot(updates["version"] - 1, updates["loss"], color="tab:gray", linestyle="--", label="GRPO loss")
        loss.set_ylabel("loss of the update it went into")
        loss.legend(fontsize=8, loc="lower right")
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)
