"""`prorsa report`: PNG plots and a Markdown summary of stored runs, from their files only.

    split_inputs(paths) -> (run dirs, sweep files)   a directory is a run, a file a sweep Dataset
    default_output(paths) -> Path                    RUN/report for one run, else report/ beside the first
    write_report(run_dirs, sweep_files, out) -> Path report.md, with its PNGs beside it

What it writes (PREFIX is empty for one run, else the run's directory name and a dash):

    report.md                 the figures of every run side by side, then a section per run
    completion.png            trajectory completion CDF, every run
    latency.png               per-turn latency breakdown (queue/prefill/transfer/decode/tool)
    comparison.png            makespan and trajectories/s per policy: two or more runs, or a sweep
    PREFIXroles.png           the run's role timeline, a swimlane per engine
    PREFIXdemand.png          the run's demand, its forecasts and their error

Bad input raises ReportError naming the file.
"""

from __future__ import annotations

import numbers
import re
from pathlib import Path

import numpy as np

from prorsa.metrics import plots, training
from prorsa.metrics.figures import (Bars, comparison, demand, headline, latency_means, run_labels, switches,
                                    sweep_bars)
from prorsa.metrics.rundata import PHASES, ReportError, RunData, Sweep, load_run, load_sweep

MAX_SWITCH_ROWS = 30  # a run that flaps would drown the report; the Dataset keeps them all
MAX_FORECAST_ROWS = 20  # one per control interval would be hundreds


def split_inputs(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(run directories, Dataset files). A folder that is no run itself but holds them counts as
    its runs: `prorsa sim --output DIR` (results.nc and runs/<policy>/), or a folder of runs."""
    runs: list[Path] = []
    files: list[Path] = []
    for p in paths:
        if p.is_file():
            files.append(p)
        elif p.is_dir() and not (p / "summary.json").exists() and (inside := _runs_in(p)):
            runs += inside
            files += [p / "results.nc"] if (p / "results.nc").is_file() else []
        else:
            runs.append(p)  # load_run names what is wrong with it
    return runs, files


def _runs_in(folder: Path) -> list[Path]:
    base = folder / "runs" if (folder / "results.nc").is_file() and (folder / "runs").is_dir() else folder
    return sorted(d for d in base.iterdir() if d.is_dir() and (d / "summary.json").is_file())


def default_output(paths: list[Path]) -> Path:
    if len(paths) == 1 and not paths[0].is_file():
        return paths[0] / "report"
    return paths[0].parent / "report"


def write_report(run_dirs: list[Path], sweep_files: list[Path], out: Path) -> Path:
    if not run_dirs and not sweep_files:
        raise ReportError("nothing to report: give a run directory or a sweep Dataset")
    runs = [load_run(p) for p in run_dirs]
    sweeps = [load_sweep(p) for p in sweep_files]
    try:
        out.mkdir(parents=True, exist_ok=True)
        text = _render(runs, sweeps, out)
        (out / "report.md").write_text(text)
    except OSError as e:
        raise ReportError(f"{e.filename or out}: cannot write ({e.strerror or e})") from None
    return out / "report.md"


def _render(runs: list[RunData], sweeps: list[Sweep], out: Path) -> str:
    labels = run_labels(runs)
    md = ["# Prorsa report", ""]
    md += [f"- `{r.name}`: policy {r.policy}, times in {r.clock} seconds" for r in runs]
    md += [f"- `{s.name}`: sweep Dataset, {s.ds.sizes['policy']} policies, times in {s.clock} seconds"
           for s in sweeps]
    md.append("")
    if runs:
        md += _summary(runs, labels)
    groups = ([comparison(runs)] if len(runs) > 1 else []) + [sweep_bars(s) for s in sweeps]
    if groups:
        md += _comparison(groups, out)
    if runs:
        plots.completion_cdf(runs, labels, out / "completion.png")
        plots.latency_breakdown(runs, labels, out / "latency.png")
        md += ["## Trajectory completion", "", "![completion](completion.png)", ""]
        md += _latency(runs, labels)
    for run, prefix in zip(runs, _prefixes(runs)):
        md += _run_section(run, prefix, out)
        md += _training_section(run, prefix, out)
    return "\n".join(md) + "\n"


def _summary(runs: list[RunData], labels: list[str]) -> list[str]:
    figures = [headline(r) for r in runs]
    keys = list(dict.fromkeys(k for f in figures for k in f))
    md = ["## Summary", "", _row(["figure", *labels]), _row(["---"] * (len(runs) + 1))]
    md += [_row([k, *(fmt(f.get(k)) for f in figures)]) for k in keys]
    md += ["", "Rows from `dataset_trajectories` on are recomputed from metrics.nc and trajectories.parquet "
           "(`forecast_mape_*`: the last scored control interval, as summary.json's `forecast_mape`).", ""]
    return md


def _comparison(groups: list[Bars], out: Path) -> list[str]:
    plots.comparison_bars(groups, out / "comparison.png")
    md = ["## Policy comparison", "", "![comparison](comparison.png)", ""]
    for g in groups:
        tps = g.trajectories_per_s
        md += [f"{g.title}:", "", _row(["policy", "makespan_s", "trajectories_per_s"]), _row(["---"] * 3)]
        md += [_row([label, fmt(g.makespan_s[i]), fmt(None if tps is None else tps[i])])
               for i, label in enumerate(g.labels)]
        if g.spread is not None:
            md.append("\n(makespan: mean over the Dataset's other dimensions)")
        md.append("")
    return md


def _latency(runs: list[RunData], labels: list[str]) -> list[str]:
    means = [latency_means(r) for r in runs]
    md = ["## Per-turn latency", "", "![latency](latency.png)", "",
          "Mean seconds per turn in each phase:", "",
          _row(["phase", *labels]), _row(["---"] * (len(runs) + 1))]
    md += [_row([p.removesuffix("_s"), *(fmt(m[p]) for m in means)]) for p in PHASES]
    return md + [""]


def _run_section(run: RunData, prefix: str, out: Path) -> list[str]:
    plots.role_timeline(run, out / f"{prefix}roles.png")
    plots.demand_plot(run, out / f"{prefix}demand.png")
    sw = switches(run)
    md = [f"## {run.name} ({run.policy})", "", f"![roles]({prefix}roles.png)", "",
          f"Role switches: {len(sw)}.", ""]
    if sw:
        md += [_row(["t_s", "engine", "change", "drain_s", "reason"]), _row(["---"] * 5)]
        md += [_row([fmt(s.t), s.engine, f"{s.from_role.value} -> {s.to_role.value}", fmt(s.drain_s), s.reason])
               for s in sw[:MAX_SWITCH_ROWS]]
        if len(sw) > MAX_SWITCH_ROWS:
            md.append(f"\n({len(sw) - MAX_SWITCH_ROWS} more in metrics.nc)")
        md.append("")
    md += [f"![demand]({prefix}demand.png)", ""]
    d = demand(run)
    if not d.checks.empty:
        cols = list(d.checks.columns)
        shown = d.checks.iloc[np.unique(np.linspace(0, len(d.checks) - 1, MAX_FORECAST_ROWS).round().astype(int))]
        md += ["Forecasts beside what followed over their horizon (per "
               f"{run.clock} second; {len(shown)} of {len(d.checks)}, evenly spaced):", "",
               _row(cols), _row(["---"] * len(cols))]
        md += [_row([fmt(v) for v in row]) for row in shown.itertuples(index=False)] + [""]
    if run.clock == "wall" and run.control_unit != 1.0:
        md += [f"Control records are stamped in body seconds; shown here x {run.control_unit:g} "
               "(the engines' time scale) to share the wall clock.", ""]
    md += ["Not recorded in this run:", ""] + [f"- {m}" for m in d.missing] + [""]
    return md


def _training_section(run: RunData, prefix: str, out: Path) -> list[str]:
    versions, ups = training.by_version(run.path), training.updates(run.path)
    if versions is None or ups is None:
        return []
    plots.reward_curve(versions, ups, out / f"{prefix}reward.png")
    md = [f"### Training ({run.name})", "", f"![reward]({prefix}reward.png)", "",
          "The rollouts of each policy version (wall seconds since the rollout began):", "",
          _row(["version", "trajectories", "reward_mean", "rollout_start_s", "rollout_end_s", "makespan_s"]),
          _row(["---"] * 6)]
    md += [_row([str(int(r.policy_version)), str(int(r.trajectories)), fmt(r.reward_mean), fmt(r.rollout_start_s),
                 fmt(r.rollout_end_s), fmt(r.makespan_s)]) for r in versions.itertuples()]
    cols = [c for c in ("version", "trajectories", "dropped_stale", "max_staleness", "reward_mean", "loss", "kl",
                        "clip_fraction", "train_s", "push_s") if c in ups]
    md += ["", "Weight updates (`reward_mean`: of the trajectories trained):", "", _row(cols), _row(["---"] * len(cols))]
    md += [_row([fmt(v) for v in row]) for row in ups[cols].itertuples(index=False)]
    return md + [""]


def _prefixes(runs: list[RunData]) -> list[str]:
    if len(runs) == 1:
        return [""]
    out: list[str] = []
    for r in runs:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", r.name)
        name, n = base, 1
        while f"{name}-" in out:
            n += 1
            name = f"{base}_{n}"
        out.append(f"{name}-")
    return out


def fmt(value) -> str:
    """A table cell: floats to 4 decimals, so a figure reads back as round(value, 4)."""
    if value is None:
        return "n/a"
    if isinstance(value, (numbers.Integral, str)):
        return str(value)
    value = float(value)
    return "n/a" if value != value else f"{value:.4f}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
