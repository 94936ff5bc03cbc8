"""A bad pipeline file: one line naming the file, the field and the problem; exit 2; no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.config.load import ConfigError, load_pipeline
from prorsa.rollout.context import load_run

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
name: t
policy: static:2:1
engines: {count: 3}
workload: {family: swe, prompts: 2, group_size: 2}
"""

CASES = [
    # (file text, substrings the message must contain)
    ("name: t\nengines: {count: -1}\n", ["engines.count", "-1", "greater than or equal to 1"]),
    ("name: t\nengines: {cuont: 3}\n", ["engines.cuont", "unknown field"]),
    ("name: t\npolicy: magic\n", ["policy", "unknown policy 'magic'", "colocated"]),
    ("name: t\npolicy: static:1:1\nengines: {count: 3}\n", ["assigns 2 engines", "has 3"]),
    ("name: t\npolicy: static:a:b\n", ["policy", "static:P:D"]),
    ("name: t\nworkload: {family: chess}\n", ["workload.family", "chess", "swe"]),
    ("name: t\nworkload: {mode: async}\n", ["workload", "trajectories", "duration_s"]),
    ("name: t\nengines: {backend: tpu}\n", ["engines.backend", "tpu", "emulated"]),
    ("name: t\nengines: {model: qwen3-8b, ep: 4}\n", ["engines", "ep=4 needs an MoE model", "qwen3-8b"]),
    ("name: t\npolicy: prorsa:x\n", ["policy", "prorsa"]),
    ("name: t\npolicy: prorsa:-1\n", ["policy", "horizon_s", "greater than 0", "prorsa[:horizon_s"]),
    ("name: t\npolicy: {name: prorsa, min_gain: -1}\n", ["policy", "min_gain", "greater than or equal to 0"]),
    ("name: t\npolicy: {name: prorsa, horizon: 3}\n", ["policy", "horizon", "not permitted"]),
    ("name: t\npolicy: {horizon_s: 3}\n", ["policy", "needs name"]),
    ("name: t\nworkload: {trace: nowhere.jsonl}\n", ["workload.trace", "nowhere.jsonl", "no such file"]),
    ("name: t\nworkload: {mix: {swe: 1, chess: 2}}\n", ["workload.mix", "unknown task family 'chess'", "math-tir"]),
    ("name: t\nworkload: {mix: {swe: -1, search: 2}}\n", ["workload.mix", "weight of 'swe' is -1.0", ">= 0"]),
    ("name: t\nworkload: {mix: {swe: 0, search: 0}}\n", ["workload.mix", "every weight is 0"]),
    ("name: t\nworkload: {mix: {}}\n", ["workload.mix", "at least one family"]),
    ("name: t\nworkload: {mix: {swe: true}}\n", ["workload.mix", "not a boolean"]),
    ("name: t\nworkload: {mix: {swe: lots}}\n", ["workload.mix.swe", "'lots'", "valid number"]),
    ("name: t\nworkload: {mix_end: {swe: 1}, steps: 3}\n", ["workload:", "mix_end", "needs mix"]),
    ("name: t\nworkload: {mix: {swe: 1}, family: swe}\n", ["workload:", "give mix or family, not both"]),
    ("name: t\nworkload: {mix: {swe: 1}, trace: t.jsonl}\n", ["workload:", "give mix or trace, not both"]),
    ("name: t\nworkload: {mix: {swe: 1}, mix_end: {search: 1}, mode: async, trajectories: 8}\n",
     ["workload:", "mix_end", "needs mode sync"]),
    ("name: t\nworkload: {mix: {swe: 1}, mix_end: {search: -2}}\n", ["workload.mix_end", "weight of 'search'"]),
    ("engines: {count: 3}\n", ["name", "missing"]),
    ("name: t\nengines: [1, 2\n", ["not valid YAML", "line"]),
    ("- just\n- a list\n", ["expected a mapping", "list"]),
    ("name: 'has space'\n", ["name", "has space"]),
    ("name: t\nruntime: {sticky_overload: 0.5}\n", ["runtime.sticky_overload", "0.5", "at least 1, cost, or null"]),
    ("name: t\nruntime: {sticky_overload: cheap}\n", ["runtime.sticky_overload", "cheap", "at least 1, cost, or null"]),
    ("name: t\nruntime: {dashboard_address: 'no.such.host.invalid:8787'}\n",
     ["runtime.dashboard_address", "no.such.host.invalid", "does not resolve"]),
    ("name: t\nruntime: {dashboard_address: '127.0.0.1:99999'}\n", ["runtime.dashboard_address", "HOST:PORT"]),
]


@pytest.mark.parametrize("text,needles", CASES)
def test_bad_file_names_field(tmp_path, text, needles):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_run(f)  # the schema (config/), then the cross-checks (rollout/context.py), as a command loads
    msg = str(err.value)
    assert "\n" not in msg
    assert str(f) in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_good_file_loads(tmp_path):
    f = tmp_path / "good.yaml"
    f.write_text(GOOD)
    cfg = load_pipeline(f)
    assert cfg.engines.count == 3 and cfg.policy == "static:2:1"


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_pipeline(tmp_path / "absent.yaml")


def test_config_is_frozen(tmp_path):
    f = tmp_path / "good.yaml"
    f.write_text(GOOD)
    cfg = load_pipeline(f)
    with pytest.raises(Exception):
        cfg.engines.count = 5


def test_validate_command_exit_codes(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text("name: t\nengines: {count: 0}\n")
    r = CliRunner().invoke(main, ["validate", str(good)])
    assert r.exit_code == 0 and "ok:" in r.output
    r = CliRunner().invoke(main, ["validate", str(good), str(bad)])
    assert r.exit_code == 2
    assert "engines.count" in r.output


@pytest.mark.parametrize("pipeline", sorted((REPO / "pipelines").glob("*.yaml")))
def test_shipped_pipelines_validate(pipeline):
    load_run(pipeline)  # the schema and the cross-checks: policies, profiles, rewards, tools, traces


def test_run_with_bad_file_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nworkload: {prompts: zero}\n")
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().count("\n") == 0
    assert "workload.prompts" in proc.stderr and "'zero'" in proc.stderr


@pytest.mark.parametrize("output", ["a-file", "a-file/below", "/proc/prorsa-runs"])
def test_an_output_where_no_run_directory_can_be_made_is_one_line(tmp_path, output):
    (tmp_path / "a-file").write_text("")
    good = tmp_path / "good.yaml"
    good.write_text(GOOD + f"output_dir: {tmp_path / output}\n")  # /proc/... stays absolute
    r = CliRunner().invoke(main, ["run", str(good), "--engine", "emulated"])
    assert r.exit_code == 2 and "cannot make the run directory" in r.output, r.output
    assert not any(tmp_path.rglob("pipeline.json"))


def test_a_name_too_long_for_a_directory_is_refused_by_validate(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: " + "n" * 300 + "\n")
    r = CliRunner().invoke(main, ["validate", str(f)])
    assert r.exit_code == 2 and "name" in r.output and "at most 200 characters" in r.output, r.output


def test_validate_reads_a_bare_trace(tmp_path):
    good = CliRunner().invoke(main, ["validate", str(REPO / "tests" / "data" / "small_trace.jsonl")])
    assert good.exit_code == 0 and "(trace: 4 trajectories, 8 turns)" in good.output, good.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"traj": 1.5}\n')
    r = CliRunner().invoke(main, ["validate", str(bad)])
    assert r.exit_code == 2 and f"{bad}:1: field 'traj'" in r.output and r.output.count("\n") == 1, r.output


@pytest.mark.parametrize("text, said", [
    ("name: t\nworkload: {promts: 4}\n", "workload.promts: unknown field; did you mean 'prompts'?"),
    ("name: t\nengins: {count: 2}\n", "engins: unknown field; did you mean 'engines'?"),
    ("name: t\nengines: {vllm: {max_model_lenn: 4}}\n", "engines.vllm.max_model_lenn: unknown field; did you mean "
     "'max_model_len'?"),
    ("name: t\nruntime: {metrics_interval: 1}\n", "did you mean 'metrics_interval_s'?"),
    ("name: t\nzzz: 1\n", "zzz: unknown field"),
])
def test_a_mistyped_key_is_told_the_nearest_field(tmp_path, text, said):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert said in str(info.value)
    assert "zzz" not in text or "did you mean" not in str(info.value)
