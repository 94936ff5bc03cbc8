"""`prorsa report` on stored runs: files, plots, figures equal to the Dataset's; bad input; and the
progress display's plain lines when the console is not a terminal."""

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner
from rich.console import Console

from prorsa.agent.loop import TrajectoryResult, TurnResult
from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.cli import main
from prorsa.control.forecast import ForecastSummary
from prorsa.engine.base import EngineStats
from prorsa.metrics.outputs import (metrics_dataset, summarise, write_dataset, write_summary,
                                    write_trajectories)
from prorsa.console.progress import Progress
from prorsa.metrics.recorder import ControlRecord, RoleChange, RunRecorder
from prorsa.roles import Role

matplotlib_image = pytest.importorskip("matplotlib.image")

PIPELINE = """\
name: rep
seed: 1
policy: {policy}
engines: {{backend: emulated, count: 3, slots: 8, time_scale: 0}}
workload: {{family: swe, mode: sync, prompts: 3, group_size: 2, steps: 1, max_turns: 3, token_scale: 0.5,
           tool_time_scale: 0}}
runtime: {{metrics_interval_s: 0.05, control_interval_s: 0.05, dashboard_address: null}}
"""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def live_run(base: Path, policy: str) -> Path:
    f = base / f"{policy.replace(':', '_')}.yaml"
    f.write_text(PIPELINE.format(policy=policy))
    out = base / "runs" / policy.replace(":", "_")
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(f), f"output_dir={out}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = out.iterdir()
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Two small stored runs from `prorsa run` on emulated engines at time scale 0."""
    base = tmp_path_factory.mktemp("live")
    return [live_run(base, "prorsa"), live_run(base, "static:2:1")]


def synthetic_run(run_dir: Path) -> Path:
    """A run with a role switch and scored forecasts, written by the run's own writers; its engines
    ran at time scale 0.5, so its control records are stamped in body seconds (2x wall), which the
    writer puts on the wall clock."""
    rec = RunRecorder(engines=["engine-0", "engine-1"], slots=8, expected=2)
    for t, roles, active in ((0.0, "mm", (1, 1)), (1.0, "mm", (2, 3)), (2.0, "pm", (1, 2)), (3.0, "pm", (0, 0))):
        role = {"m": Role.MIXED, "p": Role.PREFILL}
        rec.sample(t, [EngineStats(f"engine-{j}", role[r], 0, a, 10 * a, 1000)
                       for j, (r, a) in enumerate(zip(roles, active))])
    forecast = ForecastSummary(decode_seqs_mean=3.0, prefill_tokens=400.0, horizon_s=1.0)
    rec.control(ControlRecord(2.0, {}, "move to P1 M1", forecast, {}))
    rec.control(ControlRecord(4.0, {}, "move", None, {"decode_seqs@0-0.5s": 0.2, "decode_seqs@0.5-1s": 0.4,
                                                      "prefill_tps@0-0.5s": 1.0}))
    rec.role_change(RoleChange(2.0, "engine-0", Role.MIXED, Role.PREFILL, "move to P1 M1", 1.0, forecast))
    for i in range(2):
        spec = TrajectorySpec(f"t{i}", "swe", i, 0, 0, (TurnSpec(100, 10, 0.1, False), TurnSpec(50, 10, 0.0, True)), i)
        turns = [TurnResult(f"t{i}", 0, "engine-0", "engine-1", 100, 0, 10, start_s=0.1, end_s=0.9, queue_s=0.1,
                            prefill_s=0.2, decode_s=0.4, tool_s=0.1),
                 TurnResult(f"t{i}", 1, "engine-0", "engine-1", 50 + i, 100, 10, start_s=1.1 + i, end_s=1.8 + i,
                            queue_s=0.1, prefill_s=0.1, transfer_s=0.1, decode_s=0.3)]
        result = TrajectoryResult(spec, turns, "completed", start_s=0.1, end_s=1.8 + i)
        for turn in turns:
            rec.on_turn(spec, turn)
        rec.on_done(result)
    run_dir.mkdir(parents=True)
    (run_dir / "pipeline.json").write_text(json.dumps({"engines": {"backend": "emulated", "time_scale": 0.5}}))
    write_trajectories(run_dir / "trajectories.parquet", rec.trajectories)
    write_dataset(run_dir / "metrics.nc", metrics_dataset(rec, {"name": "syn", "policy": "prorsa"}, time_scale=0.5))
    write_summary(run_dir / "summary.json", summarise(rec, 3.0, "prorsa", "0" * 16, "syn"))
    return run_dir


def report(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, ["report", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.stdout, res.stderr


def table(md: str, first_header: str) -> dict[str, list[str]]:
    """The Markdown table whose header starts with first_header: first cell -> the other cells."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    img = matplotlib_image.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert img.std() > 0.01  # something is drawn


def test_report_of_one_run_has_every_plot_and_the_stored_figures(runs, tmp_path):
    run_dir = runs[0]
    code, out, err = report(str(run_dir), "--output", str(tmp_path / "r"))
    assert code == 0, err
    assert "report.md" in out
    for name in ("roles.png", "demand.png", "completion.png", "latency.png"):
        assert_png(tmp_path / "r" / name)
    assert not (tmp_path / "r" / "comparison.png").exists()  # one run: nothing to compare

    md = (tmp_path / "r" / "report.md").read_text()
    rows = {k: v[0] for k, v in table(md, "figure").items()}
    summary = json.loads((run_dir / "summary.json").read_text())
    ds = xr.load_dataset(run_dir / "metrics.nc")
    assert "`" + run_dir.name + "`: policy prorsa" in md and summary["policy"] == "prorsa"
    for row, key in (("makespan (s)", "makespan_s"), ("throughput (trajectories/s)", "trajectories_per_s"),
                     ("tokens/s (prefill + decode)", "tokens_per_s"), ("mean trajectory time (s)", "mean_trajectory_s")):
        assert float(rows[row].replace(",", "")) == pytest.approx(summary[key], rel=5e-3), key  # 3-4 figures
    for row, key in (("trajectories expected", "trajectories_expected"), ("trajectories completed", "trajectories_completed"),
                     ("trajectories failed", "trajectories_failed"), ("turns", "turns"), ("role switches", "role_switches")):
        assert int(rows[row].replace(",", "")) == summary[key], key
    done = ds.traj_completed.values
    assert int(done.sum()) == summary["trajectories_completed"] == 6
    assert int(rows["control intervals"]) == ds.sizes["control"] > 0
    ends = ds.traj_end_s.values[done]
    assert float(rows["completion time, median (s)"]) == pytest.approx(float(np.percentile(ends, 50)), rel=5e-3)
    assert "differ" not in md  # summary.json and the stored rows agree: no check rows
    # each figure once, rounded: no row twice, no float noise
    block = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    names = [line.split("|")[1].strip() for line in block.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(names) == len(set(names)) > 10
    assert [x for x in re.findall(r"\b\d+\.\d+\b", md) if len(x.replace(".", "").lstrip("0")) > 4] == []
    assert "Not recorded in this run:" not in md.split("## Per-turn latency")[0]
    latency = table(md, "phase")
    assert set(latency) == {"queued", "prefill", "KV transfer", "decode", "tool"}


def test_default_output_is_inside_the_run(runs):
    code, out, err = report(str(runs[1]))
    assert code == 0, err
    assert (runs[1] / "report" / "report.md").is_file()


def test_a_run_without_forecasts_says_what_is_not_recorded(runs, tmp_path):
    code, _, err = report(str(runs[1]), "--output", str(tmp_path))
    assert code == 0, err
    md = (tmp_path / "report.md").read_text()
    (line,) = [x for x in md.splitlines() if x.startswith("Not recorded in this run:")]
    assert "forecast values (the policy made no forecast)" in line
    assert "forecast error (no control interval scored a forecast)" in line  # a static policy forecasts nothing


def test_every_control_interval_keeps_its_roles_and_forecast(runs, tmp_path):
    # prorsa's; read and closed at once: netCDF4 crashes opening a file still held open
    ds = xr.load_dataset(runs[0] / "metrics.nc")
    assert ds.control_role.dims == ("control", "engine") and set(np.unique(ds.control_role)) <= {0, 1, 2}
    figures = [str(f) for f in ds.forecast_figure.values]
    assert {"decode_seqs_mean", "prefill_tokens"} <= set(figures)
    forecast = ds.control_forecast.sel(forecast_figure="decode_seqs_mean").values
    assert np.isfinite(forecast).sum() > ds.sizes["switch"]  # not only where it switched
    code, _, err = report(str(runs[0]), "--output", str(tmp_path))
    assert code == 0, err
    md = (tmp_path / "report.md").read_text()
    shown, total = map(int, re.search(r"\((\d+) of (\d+), evenly spaced", md).groups())
    assert total == np.isfinite(forecast).sum() and shown == min(total, 20)
    assert "forecast's values per control interval" not in md


def test_several_runs_and_a_sweep_compare_policies(runs, tmp_path):
    sweep = tmp_path / "results.nc"
    xr.Dataset({"makespan_s": (("policy", "seed"), [[10.0, 12.0], [8.0, 9.0]]),
                "trajectories_per_s": (("policy", "seed"), [[1.0, 1.0], [2.0, 3.0]])},
               coords={"policy": ["colocated", "prorsa"]},
               attrs={"clock": "body seconds", "mode": "sync"}).to_netcdf(sweep, engine="netcdf4")
    code, _, err = report(*map(str, runs), str(sweep), "--output", str(tmp_path / "cmp"))
    assert code == 0, err
    out = tmp_path / "cmp"
    assert_png(out / "comparison.png")
    for run_dir in runs:
        assert_png(out / f"{run_dir.name}-roles.png")
        assert_png(out / f"{run_dir.name}-demand.png")
    md = (out / "report.md").read_text()
    rows = table(md.split("## Policy comparison", 1)[1], "policy")  # its first table: the runs
    for run_dir in runs:
        s = json.loads((run_dir / "summary.json").read_text())
        assert float(rows[s["policy"]][0]) == pytest.approx(s["makespan_s"], rel=5e-3)
        assert float(rows[s["policy"]][1]) == pytest.approx(s["trajectories_per_s"], rel=5e-3)
    sweep_rows = table(md.split("sweep results.nc (mean over seed; whiskers min-max):", 1)[1], "policy")
    assert sweep_rows == {"colocated": ["11", "1"], "prorsa": ["8.5", "2.5"]}


def test_switches_and_forecasts_are_put_on_the_wall_clock(tmp_path):
    run_dir = synthetic_run(tmp_path / "syn")
    code, _, err = report(str(run_dir), "--output", str(tmp_path / "r"))
    assert code == 0, err
    md = (tmp_path / "r" / "report.md").read_text()
    rows = {k: v[0] for k, v in table(md, "figure").items()}
    assert rows["forecast error, decoding sequences (MAPE %)"] == "30"
    assert rows["forecast error, prefill tokens/s (MAPE %)"] == "100"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["forecast_mape"] == {"decode_seqs": 0.3, "prefill_tps": 1.0}
    # body 2.0 s at time scale 0.5 is wall 1.0 s; the drain of 1.0 body s is 0.5 wall s
    ds = xr.load_dataset(run_dir / "metrics.nc")
    assert list(ds.switch_time_s.values) == [1.0] and list(ds.control_t.values) == [1.0, 2.0]
    assert table(md, "t (wall s)") == {"1": ["engine-0", "mixed -> prefill", "0.5", "move to P1 M1"]}
    # horizon 1 body s = 0.5 wall s: forecast 3 seqs vs the sample at 1.0 (2 + 3); 400 tokens over
    # 0.5 s vs the one later turn that started in [1.0, 1.5): 50 tokens
    assert ["t (wall s)", "horizon (s)"] == [c.strip() for c in md.split("Forecasts beside")[1].splitlines()[2].split("|")[1:3]]
    check = table(md.split("Forecasts beside")[1], "t (wall s)")["1"]
    assert check == ["0.5", "3", "5", "800", "100"]
    assert "time scale" not in md  # one clock: nothing to convert
    assert_png(tmp_path / "r" / "roles.png")

    # a run stored before metrics.nc kept one clock: its control records in body seconds, no
    # `clock` attribute; the report converts them with pipeline.json's time scale
    ds["switch_time_s"] = ds.switch_time_s / 0.5
    ds["switch_drain_s"] = ds.switch_drain_s / 0.5
    ds["control_t"] = ds.control_t / 0.5
    del ds.attrs["clock"], ds.attrs["time_scale"]
    write_dataset(run_dir / "metrics.nc", ds)
    code, _, err = report(str(run_dir), "--output", str(tmp_path / "old"))
    assert code == 0, err
    old = (tmp_path / "old" / "report.md").read_text()
    assert table(old, "t (wall s)") == table(md, "t (wall s)") and "x 0.5 (the engines' time scale)" in old
    assert table(old.split("Forecasts beside")[1], "t (wall s)")["1"] == check


def corrupt(runs, tmp_path, name: str, data: bytes) -> Path:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(runs[0], bad, ignore=shutil.ignore_patterns("report"))
    (bad / name).write_bytes(data)
    return bad / name


@pytest.mark.parametrize("name", ["metrics.nc", "summary.json", "trajectories.parquet"])
def test_a_corrupt_file_is_named_in_one_line(runs, tmp_path, name):
    bad = corrupt(runs, tmp_path, name, b"{not what it should be")
    code, _, err = report(str(bad.parent), "--output", str(tmp_path / "r"))
    assert code == 2
    assert err.startswith(f"error: {bad}: cannot read") and err.count("\n") == 1
    assert "Traceback" not in err


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    xr.Dataset({"x": ("a", [1.0])}).to_netcdf(tmp_path / "other.nc", engine="netcdf4")
    cases = {str(tmp_path / "missing.nc"): "no such file or directory",
             str(tmp_path / "empty"): "not a run directory (no metrics.nc",
             str(tmp_path / "other.nc"): "not a sweep Dataset"}
    for path, why in cases.items():
        code, _, err = report(path)
        assert code == 2, path
        assert err.startswith(f"error: {path}: {why}") and err.count("\n") == 1, err


def test_a_dataset_that_is_not_a_run_is_refused(runs, tmp_path):
    bad = corrupt(runs, tmp_path, "metrics.nc", b"")
    xr.Dataset({"x": ("a", [1.0])}).to_netcdf(bad, engine="netcdf4")
    code, _, err = report(str(bad.parent))
    assert code == 2 and err.startswith(f"error: {bad}: not a run's metrics (no variable role")


def test_progress_without_a_terminal_prints_plain_status_lines():
    rec = RunRecorder(engines=["engine-0", "engine-1"], slots=4, expected=4)
    rec.sample(0.0, [EngineStats("engine-0", Role.PREFILL, 1, 2, 10, 100),
                     EngineStats("engine-1", Role.DECODE, 0, 3, 10, 100)])

    def output(terminal: bool) -> str:
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=terminal, width=120)
        with Progress(rec, console, plain_every_s=0.0) as progress:
            for _ in range(3):
                progress.refresh()
            rec.turns += 1  # the run moved: a line again
            progress.refresh()
        return buf.getvalue()

    plain = output(terminal=False)
    lines = plain.splitlines()
    assert len(lines) == 2  # three refreshes of one state are one line
    assert all(line.startswith("[") and "trajectories 0/4" in line and "roles P1:50% D1:75%" in line
               for line in lines)
    assert "turns 0" in lines[0] and "turns 1" in lines[1]
    assert "\x1b" not in plain and "\r" not in plain
    assert not set(plain) & set("━╸╺█▏▌")
    # the same display on a terminal is a bar redrawn in place: the check above can tell them apart
    rich_out = output(terminal=True)
    assert "\x1b[" in rich_out and set(rich_out) & set("━╸╺")


def test_a_sim_output_folder_and_a_folder_of_runs_are_reported(tmp_path):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("name: s\nengines: {backend: emulated, count: 2, slots: 8}\npolicy: static:1:1\n"
                        "workload: {family: swe, prompts: 2, group_size: 2, max_turns: 3}\n")
    sim = CliRunner().invoke(main, ["sim", str(pipeline), "--policy", "colocated,static:1:1",
                                    "--output", str(tmp_path / "sim")])
    assert sim.exit_code == 0, sim.output
    code, _, err = report(str(tmp_path / "sim"))
    assert code == 0, err
    md = (tmp_path / "sim" / "report" / "report.md").read_text()
    assert "results.nc" in md and {"colocated", "static:1:1"} <= set(table(md.split("## Policy comparison", 1)[1], "policy"))
    code, _, err = report(str(tmp_path / "sim" / "runs"), "--output", str(tmp_path / "all"))  # a folder of runs
    assert code == 0, err
    for policy in ("colocated", "static_1_1"):
        assert_png(tmp_path / "all" / f"{policy}-roles.png")
