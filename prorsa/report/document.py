"""`prorsa report`: figures and a Markdown summary of stored runs, from their files only.

    split_inputs(paths) -> (run dirs, sweep files)   a directory is a run, a file a sweep Dataset
    default_output(paths) -> Path                    RUN/report for one run, else report/ beside the first
    write_report(run_dirs, sweep_files, out, style) -> Path   report.md, with its figures beside it

What it writes (PREFIX is empty for one run, else the run's directory name and a dash; each
figure as .png, .svg and .pdf, report.md linking the style's format, EXT):

    report.md                 the figures of every run side by side, then a section per run
    completion.EXT            trajectory completion CDF, every run
    latency.EXT               per-turn latency breakdown (queue/prefill/transfer/decode/tool)
    comparison.EXT            makespan and trajectories/s per policy: two or more runs, or a
                              sweep (a panel per workload)
    PREFIXroles.EXT           the run's role timeline, a swimlane per engine
    PREFIXdemand.EXT          the run's demand, its forecasts and their error

Numbers are rounded to four significant figures with their units in the headers (words.py);
every row and heading appears once, and only when it has something under it.
Bad input raises ReportError naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from prorsa.metrics import training
from prorsa.metrics.words import number, plain_reason
from prorsa.report import plots
from prorsa.report.figures import (Bars, comparison, demand, disagreements, headline, latency_means, run_labels,
                                    switches, sweep_bars)
from prorsa.report.plots import PHASE_WORDS
from prorsa.report.rundata import PHASES, ReportError, RunData, Sweep, load_run, load_sweep
from prorsa.report.style import Style, save

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


def write_report(run_dirs: list[Path], sweep_files: list[Path], out: Path, style: Style = Style()) -> Path:
    if not run_dirs and not sweep_files:
        raise ReportError("nothing to report: give a run directory or a sweep Dataset")
    runs = [load_run(p) for p in run_dirs]
    sweeps = [load_sweep(p) for p in sweep_files]
    try:
        out.mkdir(parents=True, exist_ok=True)
        text = _render(runs, sweeps, out, style)
        (out / "report.md").write_text(text)
    except OSError as e:
        raise ReportError(f"{e.filename or out}: cannot write ({e.strerror or e})") from None
    return out / "report.md"


def _render(runs: list[RunData], sweeps: list[Sweep], out: Path, style: Style) -> str:
    labels = run_labels(runs)
    md = ["# Prorsa report", ""]
    md += [f"- `{r.name}`: policy {r.policy}; times in {r.clock} seconds since the rollout began" for r in runs]
    md += [f"- `{s.name}`: {s.ds.sizes['policy']} policies compared; times in {s.clock} seconds" for s in sweeps]
    md.append("")
    if runs:
        md += _summary(runs, labels)
    groups = ([comparison(runs)] if len(runs) > 1 and not _compared(runs, sweeps) else [])
    groups += [g for s in sweeps for g in sweep_bars(s)]
    if groups:
        md += _comparison(groups, out, style)
    if runs:
        save(plots.completion_cdf(runs, labels), out / "completion", style)
        save(plots.latency_breakdown(runs, labels), out / "latency", style)
        md += ["## Trajectory completion", "", f"![completion]({style.file('completion')})", ""]
        md += _latency(runs, labels, style)
    for run, label, prefix in zip(runs, labels, _prefixes(runs)):
        md += _run_section(run, label, prefix, out, style)
        md += _training_section(run, prefix, out, style)
    return "\n".join(md) + "\n"


def _compared(runs: list[RunData], sweeps: list[Sweep]) -> bool:
    """A sweep Dataset already compares these runs' policies (prorsa sim --output: results.nc)."""
    return any({r.policy for r in runs} <= {str(p) for p in s.ds.policy.values} for s in sweeps)


def _summary(runs: list[RunData], labels: list[str]) -> list[str]:
    figures = [headline(r) for r in runs]
    keys = [k for k in dict.fromkeys(k for f in figures for k in f) if k != "policy"]
    keys = [k for k in keys if any(f.get(k) is not None for f in figures)]  # nothing recorded: no row
    md = ["## Summary", "", _row(["figure", *labels]), _row(["---"] * (len(runs) + 1))]
    md += [_row([k, *(fmt(f.get(k)) for f in figures)]) for k in keys] + [""]
    notes = [f"- `{r.name}`: {d}" for r in runs for d in disagreements(r)]
    if notes:
        md += ["summary.json and the stored rows differ:", "", *notes, ""]
    return md


def _comparison(groups: list[Bars], out: Path, style: Style) -> list[str]:
    save(plots.comparison_bars(groups), out / "comparison", style)
    md = ["## Policy comparison", "", f"![comparison]({style.file('comparison')})", ""]
    for g in groups:
        tps = g.trajectories_per_s
        md += [f"{g.title}" + (f" ({g.spread_words})" if g.spread_words else "") + ":", "",
               _row(["policy", f"makespan ({g.clock} s)", f"trajectories per {g.clock} s"]), _row(["---"] * 3)]
        md += [_row([label, fmt(g.makespan_s[i]), fmt(None if tps is None else tps[i])])
               for i, label in enumerate(g.labels)] + [""]
    return md


def _latency(runs: list[RunData], labels: list[str], style: Style) -> list[str]:
    means = [latency_means(r) for r in runs]
    md = ["## Per-turn latency", "", f"![latency]({style.file('latency')})", "",
          "Mean seconds per turn in each phase:", "", _row(["phase", *labels]), _row(["---"] * (len(runs) + 1))]
    md += [_row([PHASE_WORDS[p], *(fmt(m[p]) for m in means)]) for p in PHASES]
    return md + [""]


def _run_section(run: RunData, label: str, prefix: str, out: Path, style: Style) -> list[str]:
    roles, dem = style.file(f"{prefix}roles"), style.file(f"{prefix}demand")
    save(plots.role_timeline(run, label), out / f"{prefix}roles", style)
    save(plots.demand_plot(run, label), out / f"{prefix}demand", style)
    sw = switches(run)
    md = [f"## {run.name}" + ("" if run.name == run.policy else f" ({run.policy})"), "", f"![roles]({roles})", "", f"Role switches: {len(sw)}.", ""]
    if sw:
        md += [_row([f"t ({run.clock} s)", "engine", "switch", "drain (s)", "reason"]), _row(["---"] * 5)]
        md += [_row([fmt(s.t), s.engine, f"{s.from_role.value} -> {s.to_role.value}", fmt(s.drain_s),
                     plain_reason(s.reason)]) for s in sw[:MAX_SWITCH_ROWS]]
        if len(sw) > MAX_SWITCH_ROWS:
            md.append(f"\n({len(sw) - MAX_SWITCH_ROWS} more in metrics.nc)")
        if run.time_scale != 1.0:
            md.append(f"\nReasons quote the policy's own clock: body seconds, x {run.time_scale:g} in wall seconds.")
        md.append("")
    md += [f"![demand]({dem})", ""]
    d = demand(run)
    if not d.checks.empty:
        shown = d.checks.iloc[np.unique(np.linspace(0, len(d.checks) - 1, MAX_FORECAST_ROWS).round().astype(int))]
        md += [f"Forecasts beside what followed over their horizon ({len(shown)} of {len(d.checks)}, "
               "evenly spaced; means over the horizon):", "",
               _row([f"t ({run.clock} s)", "horizon (s)", "decoding sequences, forecast", "realised",
                     f"prefill tokens per {run.clock} s, forecast", "realised"]), _row(["---"] * 6)]
        md += [_row([fmt(v) for v in row]) for row in shown.itertuples(index=False)] + [""]
        md += [f"The {plots.FORECAST_SCOPE.replace(chr(10), ' ')}.", ""]
    if run.clock == "wall" and run.control_unit != 1.0:
        md += [f"Control records are stamped in body seconds; shown here x {run.control_unit:g} "
               "(the engines' time scale) to share the wall clock.", ""]
    if d.missing:
        md += ["Not recorded in this run: " + "; ".join(d.missing) + ".", ""]
    return md


def _training_section(run: RunData, prefix: str, out: Path, style: Style) -> list[str]:
    versions, ups = training.by_version(run.path), training.updates(run.path)
    if versions is None or ups is None:
        return []
    reward = style.file(f"{prefix}reward")
    fig = plots.reward_curve(versions, ups, training.loss_name(run.pipeline))
    save(fig, out / f"{prefix}reward", style)
    md = [f"### Training ({run.name})", "", f"![reward]({reward})", "",
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
    """A table cell: four significant figures (words.number)."""
    return number(value)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
