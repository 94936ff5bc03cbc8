"""Bad recordings end `prorsa trace import` with one line naming the file and the line or field,
exit code 2 and no traceback; a good one writes a trace `prorsa validate` accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prorsa.cli import main

DATA = Path(__file__).resolve().parents[2] / "data" / "importers"


def _import(*args: str):
    return CliRunner().invoke(main, ["trace", "import", *args])


def _error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _write(tmp_path: Path, name: str, lines: list) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


SESSION = {"session_id": "s", "sub_requests": [{"input_toks": 10, "output_toks": 2, "tool_duration_ns": 0}]}


@pytest.mark.parametrize("lines, fmt, expected", [
    # a count written as a string: the line and the field's place in the record
    ([SESSION, {"session_id": "t", "sub_requests": [{"input_toks": "12", "output_toks": 1}]}], "auto",
     r"bad\.jsonl:2: field 'sub_requests\.0\.input_toks': should be an integer, got '12'"),
    ([SESSION, '{"session_id": "t", "sub_requests": ['], "llmservingsim", r"bad\.jsonl:2: bad JSON"),
    ([{"schema": "dynamo.agent.trace.v1", "event_type": "request_end", "agent_context": {"session_id": "a"},
       "request": {"request_id": "r", "input_tokens": 5, "request_received_ms": 1, "output_tokens": 1}}], "auto",
     r"bad\.jsonl:1: field 'event_time_unix_ms': missing"),
    ([{"schema": "dynamo.agent.trace.v1", "event_type": "request_end", "event_time_unix_ms": 3,
       "agent_context": {"session_type_id": "x"}, "request": {}}], "dynamo",
     r"bad\.jsonl:1: field 'agent_context\.trajectory_id': missing"),
    ([{"created": 1, "usage": {"prompt_tokens": -3, "completion_tokens": 1}}], "auto",
     r"bad\.jsonl:1: field 'usage\.prompt_tokens': should be >= 0, got -3"),
    ([{"traj": 1, "turn": 0, "appended_tokens": 5, "decode_tokens": 1, "tool_latency_s": 0.1, "done": False},
      {"traj": 1, "turn": 2, "appended_tokens": 5, "decode_tokens": 1, "tool_latency_s": 0, "done": True}], "auto",
     r"bad\.jsonl:2: field 'turn': expected turn 1 of trajectory '1', got 2"),
    ([{"traj": 1.5, "turn": 0, "appended_tokens": 5, "decode_tokens": 1, "tool_latency_s": 0, "done": True}],
     "turns", r"bad\.jsonl:1: field 'traj': should be a string or an integer id, got 1\.5"),
    ([{"traj": 1, "turn": 0, "appended_tokens": 5, "decode_tokens": 1, "tool_latency_s": 0.1, "done": False}],
     "auto", r"bad\.jsonl:1: field 'done': trajectory '1' ends at turn 0 without done=true"),
    ([{"hello": 1}], "auto", r"bad\.jsonl: cannot tell the format from its first record \(hello\)"),
    ([{"session_id": "z", "sub_requests": [{"input_toks": 0, "output_toks": 3}]}], "auto",
     r"bad\.jsonl:1: trajectory 'z' call 0: the first call's prompt has no tokens"),
    ([SESSION, SESSION], "auto", r"bad\.jsonl:2: trajectory id 's' also at .*bad\.jsonl:1"),
])
def test_bad_lines_give_one_error_line(tmp_path, lines, fmt, expected):
    import re

    line = _error_line(_import(str(_write(tmp_path, "bad.jsonl", lines)), "-o", str(tmp_path / "out.jsonl"),
                               "--format", fmt))
    assert re.search(expected, line), line
    assert not (tmp_path / "out.jsonl").exists()


def test_a_trajectory_file_without_token_counts(tmp_path):
    doc = json.loads((DATA / "miniswe.traj.json").read_text())
    del doc["messages"][4]["extra"]["response"]["usage"]
    path = tmp_path / "run.traj.json"
    path.write_text(json.dumps(doc, indent=1))
    line = _error_line(_import(str(path), "-o", str(tmp_path / "out.jsonl")))
    assert "run.traj.json: field 'messages.4.extra.response.usage': missing" in line


def test_a_good_import_writes_a_trace_validate_accepts(tmp_path):
    out = tmp_path / "out.jsonl"
    result = _import(str(DATA / "dynamo.jsonl"), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "2 trajectories, 3 turns (read as dynamo)" in result.output
    checked = CliRunner().invoke(main, ["validate", str(out)])
    assert checked.exit_code == 0 and "trace: 2 trajectories, 3 turns" in checked.output


def test_a_missing_source_and_an_unwritable_output(tmp_path):
    assert _import(str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl")).exit_code == 2
    line = _error_line(_import(str(DATA / "openai.jsonl"), "-o", str(tmp_path / "no" / "such" / "o.jsonl")))
    assert line.startswith("error: --output: cannot write")
