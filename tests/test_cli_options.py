"""Options that mean the same on every command: KEY=VALUE on sweep, -v after the command, --output
as the exact folder written, validate and sweep reading a sweep file alike."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import yaml
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.sweep.grid import load_grid

BASE = {
    "name": "tiny", "policy": "colocated",
    "engines": {"backend": "emulated", "count": 2, "slots": 4, "time_scale": 0.0},
    "workload": {"family": "search", "prompts": 1, "group_size": 2, "max_turns": 2, "tool_time_scale": 0.0},
    "runtime": {"dashboard_address": None},
}


def _files(tmp_path, sweep: dict):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(BASE))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_sweep_overrides_go_over_the_files_at_every_point(tmp_path):
    path = _files(tmp_path, {"base": "tiny.yaml", "axes": {"seed": [0, 1]}, "overrides": {"workload.prompts": 2}})
    assert {p.cfg.workload.prompts for p in load_grid(path).points} == {2}
    grid = load_grid(path, {"workload.prompts": 3, "workload.max_turns": 4})
    assert {(p.cfg.workload.prompts, p.cfg.workload.max_turns) for p in grid.points} == {(3, 4)}


def test_sweep_refuses_a_bad_override_in_one_line(tmp_path):
    path = _files(tmp_path, {"base": "tiny.yaml", "axes": {"seed": [0, 1]}})
    for args, needle in ((["workload.prompts=zero"], "workload.prompts: got 'zero'"),
                         (["seed=3"], "override seed is set by the seed axis")):
        r = CliRunner().invoke(main, ["sweep", str(path), *args, "--output", str(tmp_path / "out")])
        assert r.exit_code == 2 and needle in r.output and r.output.count("\n") == 1, r.output
        assert not (tmp_path / "out").exists()


def test_validate_and_sweep_report_the_same_first_error(tmp_path):
    """A sweep written without `axes:` or `base:` is still read as a sweep by validate."""
    for i, sweep in enumerate(({"policy": ["colocated", "prorsa"], "seed": [0]},
                               {"base": "tiny.yaml", "policy": ["colocated"]},
                               {"base": "tiny.yaml", "axes": {"policy": ["nope"]}})):
        path = _files(tmp_path, sweep)
        first = CliRunner().invoke(main, ["validate", str(path)])
        second = CliRunner().invoke(main, ["sweep", str(path), "--output", str(tmp_path / f"o{i}")])
        assert first.exit_code == second.exit_code == 2, (first.output, second.output)
        assert first.output.startswith("error: ") and first.output == second.output


def test_verbose_is_taken_after_the_command_too(tmp_path):
    root, ours = logging.getLogger(), logging.getLogger("prorsa")
    level, handlers, our_level = root.level, list(root.handlers), ours.level
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(BASE))
    for args in (["-v", "validate", str(tmp_path / "p.yaml")], ["validate", str(tmp_path / "p.yaml"), "-v"],
                 ["validate", "--verbose", str(tmp_path / "p.yaml")]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0 and r.output.startswith("ok: "), (args, r.output)
        # -v: Prorsa's own log; the libraries' stay quiet
        assert ours.level == logging.INFO and root.level == logging.WARNING, args
        ours.setLevel(our_level)
    for args in (["-vv", "validate", str(tmp_path / "p.yaml")], ["-v", "validate", str(tmp_path / "p.yaml"), "-v"]):
        assert CliRunner().invoke(main, args).exit_code == 0
        assert root.level == logging.INFO and ours.level == logging.INFO, args  # -vv: Dask's and vLLM's too
        root.setLevel(level)
    assert CliRunner().invoke(main, ["validate", str(tmp_path / "p.yaml")]).exit_code == 0
    assert root.level == logging.WARNING and ours.level == logging.WARNING  # without -v
    root.setLevel(level)
    ours.setLevel(our_level)
    assert root.handlers == handlers  # pytest's own log capture is left in place


def test_run_output_is_the_run_folder_itself(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(BASE))
    out = tmp_path / "here"
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(tmp_path / "p.yaml"), "--engine", "emulated",
                           "--output", str(out), "-v"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["trajectories_completed"] == 2
    assert " INFO " in proc.stderr  # -v after the command logs what Dask does
    # a second run into the same folder would mix two runs: refused, pointing at the other ways
    again = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "--output", str(out)])
    assert again.exit_code == 2 and again.output.count("\n") == 1
    assert "exists and is not empty" in again.output and f"output_dir={out}" in again.output


def test_sim_model_error_reaches_the_policies_and_a_bad_one_is_refused_in_one_line(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(BASE))
    bad = CliRunner().invoke(main, ["sim", str(tmp_path / "tiny.yaml"), "--policy", "colocated",
                                    "--model-error", "decode=fast"])
    assert bad.exit_code == 2 and bad.output == "error: --model-error: model scale decode: got 'fast'; expected a number\n"
    out = tmp_path / "out"
    ok = CliRunner().invoke(main, ["sim", str(tmp_path / "tiny.yaml"), "--policy", "colocated",
                                   "--model-error", "prefill=0.8,decode=1.25", "--output", str(out)])
    assert ok.exit_code == 0, ok.output
    import xarray as xr

    with xr.open_dataset(out / "results.nc") as ds:
        assert ds.attrs["model_error"] == "prefill=0.8,decode=1.25"


def test_validate_takes_overrides_as_run_does(tmp_path):
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(BASE))
    ok = CliRunner().invoke(main, ["validate", str(tmp_path / "p.yaml"), "policy=colocated", "workload.prompts=3"])
    assert ok.exit_code == 0 and "policy colocated" in ok.output, ok.output
    bad = CliRunner().invoke(main, ["validate", str(tmp_path / "p.yaml"), "workload.prompts=0"])
    assert bad.exit_code == 2 and "workload.prompts" in bad.output and "no such file" not in bad.output
    alone = CliRunner().invoke(main, ["validate", "policy=colocated"])
    assert alone.exit_code == 2 and "give the pipeline file they apply to" in alone.output
