"""runtime.cells: 1 unless asked; what a run over cells cannot do is refused in one line naming
runtime.cells and the field in the way; validate and --dry-run show how the cells split."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.config.load import ConfigError
from prorsa.config.pipeline import PipelineConfig
from prorsa.rollout.context import load_run

BASE = {
    "name": "c", "policy": "colocated",
    "engines": {"backend": "emulated", "count": 4, "slots": 4},
    "workload": {"family": "search", "prompts": 3, "group_size": 2, "steps": 1},
    "runtime": {"cells": 2, "dashboard_address": None},
}  # fmt: skip


def _file(tmp_path, **sections):
    data = {k: v for k, v in BASE.items()}
    for key, value in sections.items():
        data[key] = value if not isinstance(value, dict) else {**BASE.get(key, {}), **value}
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


def test_one_cell_unless_asked():
    assert PipelineConfig.model_validate({"name": "x"}).runtime.cells == 1


@pytest.mark.parametrize("sections,field", [
    ({"engines": {"count": 1}}, "engines.count is 1"),
    ({"workload": {"mode": "async", "trajectories": 8}}, "workload.mode is async"),
    ({"workload": {"steps": 2}}, "workload.steps is 2"),
    ({"engines": {"groups": [{"count": 2, "roles": ["prefill"]}, {"count": 2, "roles": ["decode"]}]}},
     "engines.groups is set"),
    ({"engines": {"backend": "vllm"}}, "engines.backend is vllm"),
    ({"engines": {"backend": "vllm"}, "environment": {"dataset": "arith", "tools": ["calculator"], "mode": "live"},
      "train": {}}, "drop train:"),
    ({"environment": {"dataset": "math-tir", "tools": ["python"]}}, "environment: is set"),
])  # fmt: skip
def test_what_cells_cannot_do_is_refused_naming_the_field(tmp_path, sections, field):
    with pytest.raises(ConfigError) as err:
        load_run(_file(tmp_path, **sections))
    msg = str(err.value)
    assert "\n" not in msg
    assert ": runtime.cells: 2 cells " in msg and field in msg, msg


def _cli(*args):
    r = CliRunner().invoke(main, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def test_commands_that_cannot_run_cells_refuse_them(tmp_path):
    f = str(_file(tmp_path))
    for args in (["run", f, "--cluster", "tcp://127.0.0.1:1"], ["sim", f], ["serve", f]):
        r = _cli(*args)
        assert r.exit_code == 2 and r.output.startswith("error: ") and "runtime.cells" in r.output, (args, r.output)
        assert r.output.count("\n") == 1
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "pipeline.json").write_text(PipelineConfig.model_validate(BASE).model_dump_json())
    r = _cli("run", "--resume", str(tmp_path / "run"))
    assert r.exit_code == 2 and "runtime.cells" in r.output and "--resume" in r.output


def test_validate_and_dry_run_show_the_split(tmp_path):
    f = str(_file(tmp_path))
    # 3 groups of 2 on 2 cells of 2 engines: by free slots, the first cell takes the first and third
    assert "2 cells: engines 2+2, trajectories 4+2" in _cli("validate", f).output
    r = _cli("run", f, "--dry-run")
    assert r.exit_code == 0 and "2 cells: engines 2+2, trajectories 4+2" in r.output
    assert "cells" not in _cli("validate", str(_file(tmp_path, runtime={"cells": 1}))).output.split("(")[1]
