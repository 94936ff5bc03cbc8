"""Every figure of `prorsa report` and `prorsa sweep`, drawn from real run folders and a real sweep,
checked on its matplotlib objects: integer ticks on axes that count, legends outside the data,
the palette's colours, no line hidden under another, and PNG, SVG and PDF written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from prorsa.metrics import palette, training
from prorsa.report.figures import comparison, sweep_bars
from prorsa.report.rundata import Sweep, load_run
from prorsa.sweep.grid import load_grid
from prorsa.sweep.merge import merge
from prorsa.sweep.run import simulate_point
from tests.sim_output import sim_output

pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from prorsa.report import plots  # noqa: E402
from prorsa.report.style import FORMATS, Style, save  # noqa: E402
from prorsa.sweep.plots import speedup_figure  # noqa: E402

PIPELINE = ("name: rules\nengines: {backend: emulated, count: 3, slots: 8}\npolicy: static:1:2\n"
            "workload: {family: swe, prompts: 3, group_size: 2, max_turns: 4}\n")
BASE = {"name": "tiny", "seed": 0, "policy": "colocated",
        "engines": {"backend": "emulated", "count": 3, "slots": 8, "gpu": "h200", "model": "qwen3-8b"},
        "workload": {"family": "search", "mode": "sync", "prompts": 2, "group_size": 2, "max_turns": 2}}
# an axis whose label says it counts these has whole-number ticks
COUNTS = re.compile(r"\b(turn|version|sequences|engines|steps?)\b")
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-", "svg": b"<?xml"}
PALETTE = {c.lower() for c in (*palette.SERIES, *palette.ROLE_COLOURS.values(), *palette.PHASE_COLOURS.values(),
                               *palette.STATE_COLOURS.values(), *palette.BAR_COLOURS.values(), palette.FORECAST,
                               palette.UNKNOWN)} | {"#000000"}


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory) -> Path:
    return sim_output(tmp_path_factory.mktemp("sim"), PIPELINE, "colocated,prorsa,static:1:2")


@pytest.fixture(scope="module")
def runs(sim_dir):
    return [load_run(d) for d in sorted((sim_dir / "runs").iterdir())]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep as `prorsa sweep` merges it: each point simulated, static:* kept as static:best."""
    base = tmp_path_factory.mktemp("sweep")
    (base / "tiny.yaml").write_text(yaml.safe_dump(BASE))
    (base / "sweep.yaml").write_text(yaml.safe_dump(
        {"base": "tiny.yaml", "axes": {"policy": ["colocated", "prorsa", "static:*"], "workload": ["search", "swe"]}}))
    grid = load_grid(base / "sweep.yaml")
    ds = merge(grid, {p.key: simulate_point(p.cfg, p.spec) for p in grid.points})
    ds.to_netcdf(base / "sweep.nc", engine="netcdf4")
    return Sweep(base / "sweep.nc", ds, "body")


def drawn(fig):
    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def assert_integer_count_axes(fig) -> int:
    """Every axis labelled with a count shows whole numbers only; returns how many it checked."""
    checked = 0
    for ax in fig.axes:
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            if not COUNTS.search(axis.get_label_text()) or not axis.get_visible():
                continue
            lo, hi = min(lo, hi), max(lo, hi)
            shown = [t for t in axis.get_majorticklocs() if lo - 1e-9 <= t <= hi + 1e-9]
            assert shown and all(float(t).is_integer() for t in shown), (axis.get_label_text(), shown)
            labels = [t.get_text() for t in axis.get_majorticklabels() if t.get_text()]
            assert all(re.fullmatch(r"[−-]?\d+", s) for s in labels), (axis.get_label_text(), labels)
            checked += 1
    return checked


def assert_legends_outside(fig, renderer) -> int:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            data = ax.get_window_extent(renderer)
            overlap = min(box.x1, data.x1) - max(box.x0, data.x0), min(box.y1, data.y1) - max(box.y0, data.y0)
            assert min(overlap) <= 0.5, f"legend over the data of {ax.get_title()!r}"
    return len(legends)


def assert_no_hidden_line(fig) -> None:
    """Two lines with the same points must differ in colour, dash or marker, or be drawn once."""
    for ax in fig.axes:
        lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
        for i, a in enumerate(lines):
            for b in lines[i + 1:]:
                same_data = (len(a.get_xdata()) == len(b.get_xdata())
                             and np.allclose(a.get_xdata(), b.get_xdata(), equal_nan=True)
                             and np.allclose(a.get_ydata(), b.get_ydata(), equal_nan=True))
                same_look = (to_hex(a.get_color()), a.get_linestyle(), a.get_marker()) == \
                    (to_hex(b.get_color()), b.get_linestyle(), b.get_marker())
                assert not (same_data and same_look), (a.get_label(), b.get_label())
                assert not same_look or a.get_label().startswith("_"), (a.get_label(), b.get_label())


def assert_palette(fig) -> None:
    for ax in fig.axes:
        for ln in ax.get_lines():
            assert to_hex(ln.get_color()) in PALETTE, (ax.get_title(), ln.get_label(), ln.get_color())
        for patch in ax.patches:
            if patch.get_visible() and patch.get_facecolor()[3] > 0:
                assert to_hex(patch.get_facecolor()) in PALETTE | {"#ffffff"}, (ax.get_title(), patch)


def check(fig, tmp_path: Path, stem: str) -> tuple[int, int]:
    renderer = drawn(fig)
    counts = assert_integer_count_axes(fig)
    legends = assert_legends_outside(fig, renderer)
    assert_no_hidden_line(fig)
    assert_palette(fig)
    linked = save(fig, tmp_path / stem, Style("svg", dpi=60))
    assert linked == tmp_path / f"{stem}.svg"
    for fmt in FORMATS:
        assert (tmp_path / f"{stem}.{fmt}").read_bytes().startswith(MAGIC[fmt]), (stem, fmt)
    return counts, legends


def test_run_figures_keep_the_rules(runs, tmp_path):
    labels = [r.policy for r in runs]
    prorsa = next(r for r in runs if r.policy == "prorsa")
    assert check(plots.role_timeline(prorsa, "prorsa"), tmp_path, "roles")[1] == 1
    counts, legends = check(plots.demand_plot(prorsa, "prorsa"), tmp_path, "demand")
    assert counts == 1 and legends == 3  # sequences; a legend per panel
    assert check(plots.completion_cdf(runs, labels), tmp_path, "completion")[1] == 1
    counts, legends = check(plots.latency_breakdown(runs, labels), tmp_path, "latency")
    assert counts == legends == len(runs)  # the turn index of every panel
    assert check(plots.comparison_bars([comparison(runs)]), tmp_path, "comparison")[1] == 0


def test_the_completion_lines_of_runs_that_finish_together_stay_apart(runs, tmp_path):
    same = [runs[0], runs[0]]
    fig = plots.completion_cdf(same, ["a", "b"])
    check(fig, tmp_path, "twins")
    a, b = fig.axes[0].get_lines()
    assert (a.get_linestyle(), a.get_marker()) != (b.get_linestyle(), b.get_marker())


def test_forecast_panel_says_what_its_forecast_covers(runs):
    prorsa = next(r for r in runs if r.policy == "prorsa")
    top = plots.demand_plot(prorsa, "prorsa").axes[0]
    assert any("current and next turn only" in t.get_text() for t in top.texts)


def test_sweep_figures_name_the_split_static_best_chose(sweep, tmp_path):
    ds = sweep.ds
    groups = sweep_bars(sweep)
    assert len(groups) == 2  # a panel per workload
    for g, w in zip(groups, ds.workload.values):
        cell = ds.sel(workload=w)
        split = f"{int(cell.static_best_prefill.item())}:{int(cell.static_best_decode.item())}"
        assert g.labels == ["colocated", "prorsa", f"static:{split} (best)"]
    check(plots.comparison_bars(groups), tmp_path, "comparison")
    fig = speedup_figure(ds)
    assert check(fig, tmp_path, "speedup")[1] == 1  # one legend under the panels
    texts = [t.get_text() for t in fig.axes[0].texts]
    for w in ds.workload.values:
        cell = ds.sel(workload=w)
        split = f"{int(cell.static_best_prefill.item())}:{int(cell.static_best_decode.item())}"
        assert any(t.endswith(f"x\n{split}") for t in texts), (split, texts)


@pytest.fixture(scope="module")
def training_run(tmp_path_factory) -> Path:
    """A training run's folder as the RL loop leaves it: the real learner and GRPO trainer on the
    tiny model, three updates, train.jsonl and trajectories.parquet with each rollout's version."""
    pytest.importorskip("torch")
    import asyncio

    from prorsa.config.pipeline import TrainConfig
    from prorsa.engine.tiny_model import ensure_tiny_model
    from prorsa.metrics.outputs import write_trajectories
    from prorsa.train.learner import Learner, LearnerFiles
    from prorsa.train.trainer import Trainer, TrainerConfig
    from tests.train.test_learner import _result

    base = tmp_path_factory.mktemp("train")
    pushed: list[Path] = []

    async def push(path: Path) -> None:  # no engines to load the weights into
        pushed.append(path)

    trainer = Trainer(ensure_tiny_model(base / "models"), TrainerConfig(lr=1e-3, micro_batch=4, threads=1))
    learner = Learner(TrainConfig(keep_checkpoints=1), trainer, base / "weights", push, 4, "sync",
                      files=LearnerFiles(log_path=base / "run" / "train.jsonl"))
    (base / "run").mkdir()
    results = []
    for version in range(3):
        for i, reward in enumerate([0.0, 1.0, 0.2 * version, 0.5]):
            results.append(_result(f"s{version}-p{i // 2}-g{i % 2}", prompt=i // 2, reward=reward, version=version))
            learner.on_done(results[-1])
        asyncio.run(learner.update())
    assert len(pushed) == 3
    write_trajectories(base / "run" / "trajectories.parquet", results)
    return base / "run"


def test_reward_curve_names_the_trainers_loss(training_run, tmp_path):
    versions, updates = training.by_version(training_run), training.updates(training_run)
    assert list(versions.policy_version) == [0, 1, 2] and list(updates.version) == [1, 2, 3]
    custom = {"train": {"algorithm": "grpo", "trainer": "examples.custom_trainer:ReinforceTrainer"}}
    assert training.loss_name(custom) == "ReinforceTrainer loss"
    assert training.loss_name({"train": {"algorithm": "grpo", "trainer": None}}) == "GRPO loss"
    fig = plots.reward_curve(versions, updates, training.loss_name(custom))
    counts, legends = check(fig, tmp_path, "reward")
    assert counts == 1 and legends == 1  # policy version
    words = [t.get_text() for t in fig.axes[0].get_legend().get_texts()] + [a.get_ylabel() for a in fig.axes]
    assert "ReinforceTrainer loss" in words and not any("GRPO" in w for w in words)
    assert np.allclose(fig.axes[1].get_lines()[0].get_ydata(), updates.loss)
