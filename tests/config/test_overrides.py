"""KEY=VALUE overrides on the command line (hydra's form), read as YAML and checked by the schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import xarray as xr
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.config.load import ConfigError, load_pipeline, parse_overrides

PIPELINE = """\
name: t
policy: static:2:1
engines: {backend: emulated, count: 3, slots: 8}
workload: {family: swe, prompts: 2, group_size: 2, max_turns: 3}
"""


def test_values_are_read_as_yaml():
    got = parse_overrides(["workload.prompts=64", "policy=static:2:1", "engines.vllm.model=null",
                           "environment.tools=[python, search]", "runtime.processes=true", "name=x=y"])
    assert got == {"workload.prompts": 64, "policy": "static:2:1", "engines.vllm.model": None,
                   "environment.tools": ["python", "search"], "runtime.processes": True, "name": "x=y"}


@pytest.mark.parametrize("item,needle", [
    ("prompts", "expected KEY=VALUE"),
    ("=3", "expected KEY=VALUE"),
    ("workload..prompts=3", "expected KEY=VALUE"),
    ("x=[1,", "not valid YAML"),
])  # fmt: skip
def test_a_malformed_override_is_refused(item, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_overrides([item])


def test_an_override_changes_the_resolved_pipeline(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(PIPELINE)
    cfg = load_pipeline(f, parse_overrides(["workload.prompts=5", "engines.count=4", "policy=static:2:2"]))
    assert (cfg.workload.prompts, cfg.engines.count, cfg.policy) == (5, 4, "static:2:2")


def test_sim_takes_overrides_and_a_seed(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(PIPELINE)
    r = CliRunner().invoke(main, ["sim", str(f), "engines.count=2", "workload.prompts=1", "--seed", "7",
                                  "--policy", "colocated,static:1:1", "--output", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    ds = xr.load_dataset(tmp_path / "out" / "results.nc")
    assert ds.attrs["engines"] == 2 and ds.attrs["seed"] == 7 and list(ds.policy.values) == ["colocated", "static:1:1"]


@pytest.mark.parametrize("args,needle", [
    (["workload.prompts=zero"], "workload.prompts: got 'zero'"),
    (["workload.nope=1"], "workload.nope: unknown field"),
    (["prompts"], "override 'prompts': expected KEY=VALUE"),
])  # fmt: skip
def test_run_refuses_a_bad_override_in_one_line_before_starting(tmp_path, args, needle):
    f = tmp_path / "p.yaml"
    f.write_text(PIPELINE + f"output_dir: {tmp_path / 'runs'}\n")
    r = CliRunner().invoke(main, ["run", str(f), *args])
    assert r.exit_code == 2 and needle in r.output and r.output.count("\n") == 1, r.output
    assert not Path(tmp_path / "runs").exists()


def test_version():
    r = CliRunner().invoke(main, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("prorsa ")
