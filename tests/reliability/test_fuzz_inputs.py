"""Generated malformed inputs through the command line: each gives one `error:` line naming the
file, exit code 2 and no traceback; whatever happens to be valid gives one `ok:` line.

Pipelines, sweeps and traces go through `prorsa validate` (which reads a pipeline's trace whole),
bad traces also through `prorsa run` (refused before any cluster starts), stored pipelines
through `prorsa run --resume`, and damaged manifests through the run journal. In process with
click's CliRunner, so thousands of inputs take seconds; the slow mark runs ten times as many.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prorsa.cli import main
from prorsa.metrics.journal import MANIFEST, JournalError, RunJournal

REPO = Path(__file__).resolve().parents[2]
WORK = Path(tempfile.mkdtemp(prefix="prorsa-fuzz-"))  # hypothesis reruns a test body; one dir serves all

BASE = {
    "name": "fuzz",
    "seed": 1,
    "policy": "static:2:1",
    "engines": {"backend": "emulated", "count": 3, "slots": 8, "time_scale": 0.1, "gpu": "h200",
                "model": "qwen3-8b", "vllm": {"model": "tiny", "max_model_len": 2048}},
    "workload": {"family": "swe", "mode": "sync", "prompts": 2, "group_size": 2, "steps": 1,
                 "max_turns": 4, "token_scale": 0.5, "tool_time_scale": 0.1},
    "runtime": {"turn_shape": "driver", "tool_workers": 1, "metrics_interval_s": 0.5,
                "control_interval_s": 1.0, "turn_retries": 2, "dashboard_address": None,
                "output_batch": 4, "output_flush_s": 1.0},
    "environment": {"dataset": "math-tir", "tools": ["python", "calculator"], "reward": "exact_match",
                    "max_observation_tokens": 256, "sandbox": {"wall_s": 5, "cpu_s": 5}},
}


def _paths(d: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in d.items():
        out.append(prefix + (k,))
        if isinstance(v, dict):
            out += _paths(v, prefix + (k,))
    return out


PATHS = _paths(BASE)
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=24))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
# fields whose minimum is 1, a wrong value each must be refused
AT_LEAST_ONE = [("engines", "count"), ("engines", "slots"), ("workload", "prompts"), ("workload", "group_size"),
                ("workload", "steps"), ("runtime", "tool_workers"), ("runtime", "output_batch")]
NOT_A_COUNT = st.integers(-2**70, 0) | st.text(max_size=8).filter(lambda t: not t.strip().isdigit()) \
    | st.lists(st.integers(), max_size=2) | st.just(float("nan")) | st.floats(0.01, 0.99)


def _mutated(data: dict, path: tuple, value, delete: bool) -> dict:
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return data


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=True)


def assert_clean(result, named: str, must_fail: bool = False) -> None:
    """One line: `ok:` with exit 0, or `error:` naming the file with exit 2; never a traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    out = result.output
    assert "Traceback" not in out
    if must_fail or result.exit_code:
        assert result.exit_code == 2, out
        assert out.startswith("error: ") and out.count("\n") == 1, out
        assert named in out, out
    else:
        assert out.startswith("ok: ") and out.count("\n") == 1, out


def _settings(n: int):
    return settings(max_examples=n, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def examples(fast: int):
    """`fast` examples in the fast suite, ten times as many under the slow mark."""
    return pytest.mark.parametrize("n", [fast, pytest.param(fast * 10, marks=pytest.mark.slow)], ids=["fast", "slow"])


# --- pipelines --------------------------------------------------------------------------------

@examples(150)
def test_mutated_pipelines_are_refused_cleanly_or_run(n):
    f = WORK / "mutated.yaml"

    @_settings(n)
    @given(st.lists(st.tuples(st.sampled_from(PATHS) | st.lists(st.text(min_size=1, max_size=6), min_size=1,
                                                                   max_size=3).map(tuple), VALUES, st.booleans()),
                    min_size=1, max_size=3))
    def check(mutations):
        data = BASE
        for path, value, delete in mutations:
            data = _mutated(data, path, value, delete)
        f.write_text(yaml.safe_dump(data, allow_unicode=True))
        assert_clean(_invoke("validate", str(f)), str(f))

    check()


@examples(100)
def test_wrong_values_are_refused_naming_the_field(n):
    f = WORK / "wrong.yaml"

    @_settings(n)
    @given(st.sampled_from(AT_LEAST_ONE), NOT_A_COUNT)
    def check(path, value):
        f.write_text(yaml.safe_dump(_mutated(BASE, path, value, False)))
        r = _invoke("validate", str(f))
        assert_clean(r, str(f), must_fail=True)
        assert ".".join(path) in r.output

    check()


@examples(100)
def test_unknown_keys_are_refused_naming_them(n):
    f = WORK / "unknown.yaml"
    sections = [()] + [p for p in PATHS if isinstance(_get(BASE, p), dict)]

    @_settings(n)
    @given(st.sampled_from(sections), st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True), SCALARS)
    def check(section, key, value):
        if key in (_get(BASE, section) if section else BASE):
            return
        f.write_text(yaml.safe_dump(_mutated(BASE, section + (key,), value, False)))
        r = _invoke("validate", str(f))
        assert_clean(r, str(f), must_fail=True)
        assert ".".join(section + (key,)) in r.output and "unknown field" in r.output

    check()


def _get(d: dict, path: tuple):
    for k in path:
        d = d[k]
    return d


YAML_TOKENS = st.sampled_from(["name:", " t", "\n", "  ", "engines:", "{", "}", "[", "]", ",", ":", "-", "'",
                               '"', "!!python/object:os.system", "&a", "*a", "<<:", "? ", "\t", "|", ">",
                               "%YAML 1.2", "---", "...", "1e999", ".nan", "~", "\x00", "\ufeff", "count: ",
                               "policy: ", "workload:", "trace: ", "base: "])


@examples(200)
def test_any_text_is_refused_cleanly(n):
    f = WORK / "junk.yaml"

    @_settings(n)
    @given(st.binary(max_size=200) | st.lists(YAML_TOKENS, max_size=40).map("".join).map(str.encode)
           | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
    def check(raw):
        f.write_bytes(raw)
        assert_clean(_invoke("validate", str(f)), str(f))

    check()


def test_nesting_deeper_than_the_parser_recurses_is_refused(tmp_path):
    f = tmp_path / "deep.yaml"
    f.write_text("name: t\nengines: " + "[" * 20000 + "]" * 20000 + "\n")
    r = _invoke("validate", str(f))
    assert_clean(r, str(f), must_fail=True)
    assert "nested too deeply" in r.output


# --- sweeps -----------------------------------------------------------------------------------

SWEEP = {"name": "fz", "base": "base.yaml",
         "axes": {"policy": ["colocated", "static:1:2"], "seed": [0, 1], "n_gpus": [3]},
         "overrides": {"workload.prompts": 2}}
SWEEP_PATHS = _paths(SWEEP) + [("axes", a) for a in ("workload", "model", "gpu", "mode")]


@examples(60)
def test_mutated_sweeps_are_refused_cleanly(n):
    (WORK / "base.yaml").write_text(yaml.safe_dump({k: v for k, v in BASE.items() if k != "environment"}))
    f = WORK / "sweep.yaml"

    @_settings(n)
    @given(st.lists(st.tuples(st.sampled_from(SWEEP_PATHS), VALUES, st.booleans()), min_size=1, max_size=3))
    def check(mutations):
        data = SWEEP
        for path, value, delete in mutations:
            data = _mutated(data, path, value, delete)
        data.setdefault("base", "base.yaml")  # a pipeline has no base: without one it is read as a pipeline
        f.write_text(yaml.safe_dump(data, allow_unicode=True))
        assert_clean(_invoke("validate", str(f)), str(f))

    check()


# --- traces -----------------------------------------------------------------------------------

@st.composite
def traces(draw) -> list[list[dict]]:
    """A valid trace, as lines grouped per trajectory."""
    out = []
    for i in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 4))
        lines = [{"traj": f"t{i}", "turn": k, "appended_tokens": draw(st.integers(1 if k == 0 else 0, 5000)),
                  "decode_tokens": draw(st.integers(1, 2000)),
                  "tool_latency_s": 0.0 if k == n - 1 else draw(st.floats(0, 30)), "done": k == n - 1}
                 for k in range(n)]
        if draw(st.booleans()):
            lines[0] |= {"family": "swe", "seed": draw(st.integers(0, 2**32 - 1)), "step": 0, "prompt": i, "group": 0}
        out.append(lines)
    return out


def _flat(trace: list[list[dict]]) -> list[dict]:
    return [line for traj in trace for line in traj]


BAD_TYPES = {"traj": [1, None, ""], "turn": ["0", 0.5, -1, True], "appended_tokens": ["9", 1.5, -3, 2**40],
             "decode_tokens": [0, -1, "x", 2.0, 2**31], "tool_latency_s": ["1s", -0.5, None, 1e300],
             "done": ["yes", 1, None], "seed": [-1, 2**32, "s"], "family": ["", 3]}


@st.composite
def broken_traces(draw) -> bytes:
    """A valid trace with one defect that must be refused."""
    trace = draw(traces())
    lines = _flat(trace)
    kind = draw(st.sampled_from(["cut", "type", "unknown", "missing", "no_done", "repeat", "done_latency",
                                 "not_object", "utf8", "nan", "empty"]))
    text = [json.dumps(line) for line in lines]
    i = draw(st.integers(0, len(lines) - 1))
    if kind == "cut":
        text[i] = text[i][:draw(st.integers(1, len(text[i]) - 1))]
    elif kind == "type":
        field = draw(st.sampled_from(sorted(BAD_TYPES)))
        text[i] = json.dumps(lines[i] | {field: draw(st.sampled_from(BAD_TYPES[field]))})
    elif kind == "unknown":
        text[i] = json.dumps(lines[i] | {draw(st.from_regex(r"x[a-z]{0,6}", fullmatch=True)): 1})
    elif kind == "missing":
        field = draw(st.sampled_from(["traj", "turn", "appended_tokens", "decode_tokens", "tool_latency_s", "done"]))
        text[i] = json.dumps({k: v for k, v in lines[i].items() if k != field})
    elif kind == "no_done":
        longer = [t for t in trace if len(t) > 1]
        if not longer:
            return b""  # one-turn trajectories only: an empty trace is the defect instead
        last = draw(st.sampled_from(longer))[-1]
        text = [json.dumps(line) for line in lines if line is not last]
    elif kind == "repeat":
        text.insert(i, text[i])
    elif kind == "done_latency":
        j = next(k for k, line in enumerate(lines) if line["done"])
        text[j] = json.dumps(lines[j] | {"tool_latency_s": draw(st.floats(0.001, 10))})
    elif kind == "not_object":
        text[i] = draw(st.sampled_from(["[1, 2]", "3", '"turn"', "null", "true", "{}"]))
    elif kind == "utf8":
        return ("\n".join(text) + "\n").encode() + b"\xff\xfe\x80"
    elif kind == "nan":
        text[i] = json.dumps(lines[i] | {"tool_latency_s": float("nan")})
    elif kind == "empty":
        return draw(st.sampled_from([b"", b"\n\n", b"   \n"]))
    return ("\n".join(text) + "\n").encode()


def _trace_pipeline(name: str) -> tuple[Path, Path]:
    trace = WORK / f"{name}.jsonl"
    f = WORK / f"{name}.yaml"
    f.write_text(yaml.safe_dump({"name": "fuzz-trace", "policy": "static:2:1",
                                 "engines": {"backend": "emulated", "count": 3, "time_scale": 0.05},
                                 "workload": {"trace": trace.name, "prompts": 2, "group_size": 1},
                                 "runtime": {"dashboard_address": None}}))
    return f, trace


@examples(200)
def test_broken_traces_are_refused_naming_the_trace(n):
    f, trace = _trace_pipeline("broken")

    @_settings(n)
    @given(broken_traces())
    def check(raw):
        trace.write_bytes(raw)
        r = _invoke("validate", str(f))
        assert_clean(r, str(f), must_fail=True)
        assert "workload.trace" in r.output and trace.name in r.output

    check()


@examples(80)
def test_valid_traces_pass(n):
    f, trace = _trace_pipeline("valid")

    @_settings(n)
    @given(traces(), st.randoms())
    def check(trace_lines, rnd):
        # interleaving trajectories keeps a trace valid: each one's turns stay in order
        slots = [i for i, traj in enumerate(trace_lines) for _ in traj]
        rnd.shuffle(slots)
        interleaved = [trace_lines[i].pop(0) for i in slots]
        trace.write_text("".join(json.dumps(line) + "\n" for line in interleaved))
        r = _invoke("validate", str(f))
        assert_clean(r, str(f))
        assert r.exit_code == 0, r.output

    check()


@examples(100)
def test_any_trace_text_is_refused_cleanly(n):
    f, trace = _trace_pipeline("junk")
    line = st.fixed_dictionaries({}, optional={k: VALUES for k in
                                               ("traj", "turn", "appended_tokens", "decode_tokens",
                                                "tool_latency_s", "done", "seed", "step")}).map(json.dumps)

    @_settings(n)
    @given(st.lists(line | st.text(max_size=40), max_size=6).map("\n".join).map(str.encode) | st.binary(max_size=120))
    def check(raw):
        trace.write_bytes(raw)
        assert_clean(_invoke("validate", str(f)), str(f))

    check()


@examples(20)
def test_run_refuses_a_broken_trace_before_starting_a_cluster(n):
    f, trace = _trace_pipeline("run")

    @_settings(n)
    @given(broken_traces())
    def check(raw):
        trace.write_bytes(raw)
        r = _invoke("run", str(f), f"output_dir={WORK / 'runs'}")
        assert_clean(r, str(f), must_fail=True)
        assert not (WORK / "runs").exists()  # refused before a run directory, let alone a cluster

    check()


# --- stored pipelines and manifests (resume) ---------------------------------------------------

@examples(100)
def test_resume_refuses_a_damaged_pipeline_json(n):
    run_dir = WORK / "stored"
    run_dir.mkdir(exist_ok=True)
    good = json.dumps(BASE)

    @_settings(n)
    @given(st.integers(1, len(good) - 1), st.binary(max_size=8))
    def check(cut, junk):
        (run_dir / "pipeline.json").write_bytes(good[:cut].encode() + junk)
        assert_clean(_invoke("run", "--resume", str(run_dir)), str(run_dir), must_fail=True)

    check()


@examples(100)
def test_damaged_manifests_are_refused_or_read(n):
    run_dir = WORK / "journal"
    run_dir.mkdir(exist_ok=True)
    good = {"version": 1, "config_hash": "h", "complete": False, "trajectories": 0, "parts": []}

    @_settings(n)
    @given(st.binary(max_size=80) | st.dictionaries(st.sampled_from(sorted(good)), VALUES).map(
        lambda d: json.dumps(good | d).encode()))
    def check(raw):
        (run_dir / MANIFEST).write_bytes(raw)
        try:
            RunJournal.open(run_dir, "h").close()
        except JournalError as e:
            assert "\n" not in str(e) and str(run_dir) in str(e)

    check()


# --- a few as real processes -------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["validate", "{d}/deep.yaml"],
    ["validate", "{d}/broken.yaml"],
    ["run", "{d}/broken.yaml"],
    ["run", "--resume", "{d}/absent"],
])
def test_real_process_gives_one_error_line(tmp_path, args):
    (tmp_path / "deep.yaml").write_text("name: t\nengines: " + "[" * 20000 + "]" * 20000 + "\n")
    (tmp_path / "broken.yaml").write_text("name: t\nworkload: {trace: t.jsonl}\n")
    (tmp_path / "t.jsonl").write_text('{"traj": "a", "turn": 0, "appended_tokens": 5, "decode_tokens": 0, '
                                      '"tool_latency_s": 0, "done": true}\n')
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", *[a.format(d=tmp_path) for a in args]],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
