"""The JSONL trace format: reading the example, exact round trips, and one-line errors."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from prorsa.agent.trace import TraceError, TrajectorySpec, TurnSpec, read_trace, write_trace

DATA = Path(__file__).resolve().parents[1] / "data"
SMALL = DATA / "small_trace.jsonl"


def test_small_trace_reads_in_order_of_first_appearance():
    specs = read_trace(SMALL)
    assert [s.traj_id for s in specs] == ["django-101", "q-7", "aime-3", "tb-bench-12"]
    assert [s.family for s in specs] == ["swe", "search", "math-tir", "trace"]
    django = specs[0]
    assert django.turns == (
        TurnSpec(1800, 240, 0.35, False),
        TurnSpec(950, 410, 1.2, False),
        TurnSpec(4200, 95, 0.0, True),
    )
    assert django.context_tokens == 1800 + 240 + 950 + 410 + 4200 + 95
    # Defaults for the optional per-trajectory fields; explicit ones kept.
    assert (django.step, django.prompt_index, django.group_index) == (0, 0, 0)
    assert django.seed == zlib.crc32(b"django-101")
    aime = specs[2]
    assert (aime.seed, aime.step, aime.prompt_index, aime.group_index) == (7, 0, 2, 1)
    assert aime.turns[1].appended_tokens == 0  # an empty observation is allowed after turn 0


def test_default_family_is_the_readers_choice():
    assert read_trace(SMALL, default_family="terminal")[3].family == "terminal"


def test_round_trip_is_exact(tmp_path):
    specs = read_trace(SMALL)
    out = tmp_path / "again.jsonl"
    write_trace(out, specs)
    assert read_trace(out) == specs
    first = out.read_text()
    write_trace(out, read_trace(out))
    assert out.read_text() == first  # a fixed point: the format loses nothing
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write cleaned up


def test_round_trip_keeps_awkward_floats(tmp_path):
    spec = TrajectorySpec(
        traj_id="x", family="swe", prompt_index=5, group_index=3, step=9, seed=2**32 - 1,
        turns=(TurnSpec(1, 1, 0.1 + 0.2, False), TurnSpec(0, 7, 1e-300, False), TurnSpec(3, 2, 0, True)),
    )
    write_trace(tmp_path / "t.jsonl", [spec])
    assert read_trace(tmp_path / "t.jsonl") == [spec]


def _line(**over) -> str:
    base = {"traj": "t", "turn": 0, "appended_tokens": 10, "decode_tokens": 5,
            "tool_latency_s": 0.0, "done": True}
    base.update(over)
    return json.dumps({k: v for k, v in base.items() if v is not _DROP})


_DROP = object()
_OK0 = _line(done=False, tool_latency_s=0.5)

MALFORMED = [
    # (lines, line number in the error, field named, words in the problem)
    ([_OK0, '{"traj": "t", "turn": 1,'], 2, None, "bad JSON"),
    (["[1, 2]"], 1, None, "JSON object"),
    ([_line(done=_DROP)], 1, "done", "missing"),
    ([_line(traj=_DROP)], 1, "traj", "missing"),
    ([_line(traj="")], 1, "traj", "non-empty"),
    ([_line(traj=1.5)], 1, "traj", "an integer id"),
    ([_line(traj=True)], 1, "traj", "an integer id"),
    ([_line(decode_tokens=-3)], 1, "decode_tokens", "-3"),
    ([_OK0, _line(turn=1, appended_tokens=-1)], 2, "appended_tokens", "-1"),
    ([_line(decode_tokens="12")], 1, "decode_tokens", "integer"),
    ([_line(decode_tokens=12.0)], 1, "decode_tokens", "integer"),
    ([_line(done="yes")], 1, "done", "boolean"),
    ([_line(tool_latency_s=-0.1)], 1, "tool_latency_s", "-0.1"),
    ([_line(colour="red")], 1, "colour", "unknown field"),
    ([_line(appended_tokens=0)], 1, "appended_tokens", "prompt"),
    ([_OK0, _line(turn=2)], 2, "turn", "expected turn 1"),
    ([_line(turn=1)], 1, "turn", "expected turn 0"),
    ([_OK0, _line(turn=0)], 2, "turn", "expected turn 1"),
    ([_OK0, _line(turn=1, done=False, tool_latency_s=1.0)], 2, "done", "without done=true"),
    ([_line(), _line(turn=1)], 2, "turn", "after its final turn 0"),
    ([_line(tool_latency_s=2.5)], 1, "tool_latency_s", "final turn"),
    ([_line(done=False, family="swe"), _line(turn=1, family="search")], 2, "family", "disagrees"),
    ([_line(seed=-1)], 1, "seed", "-1"),
    ([_line(start_s=-2.5)], 1, "start_s", "-2.5"),
    ([_line(start_s="10")], 1, "start_s", "valid number"),
    ([_line(start_s=True)], 1, "start_s", "valid number"),
    ([_line(start_s=1e9)], 1, "start_s", "less than or equal"),
    ([_line(done=False, start_s=3.0), _line(turn=1, start_s=4.0)], 2, "start_s", "disagrees"),
]


@pytest.mark.parametrize("lines, lineno, field, words", MALFORMED)
def test_malformed_trace_names_file_line_and_field(tmp_path, lines, lineno, field, words):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}:{lineno}: ")
    if field is not None:
        assert f"'{field}'" in msg
    assert words in msg


def test_release_times_read_and_write_back(tmp_path):
    path = tmp_path / "staggered.jsonl"
    path.write_text("\n".join([_line(traj="a", start_s=0), _line(traj="b", start_s=12.5),
                               _line(traj="c", done=False, tool_latency_s=0.5), _line(traj="c", turn=1, start_s=3)]))
    specs = read_trace(path)
    assert [s.start_s for s in specs] == [0.0, 12.5, 3.0]  # an int is a number of seconds too; any line may carry it
    assert isinstance(specs[0].start_s, float)
    out = tmp_path / "again.jsonl"
    write_trace(out, specs)
    assert read_trace(out) == specs
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x.get("start_s") for x in lines] == [0.0, 12.5, 3.0, None]  # on turn 0 only
    write_trace(out, read_trace(SMALL))
    assert "start_s" not in out.read_text()  # written only when set
    with pytest.raises(ValueError, match="start_s must be a finite number >= 0"):
        TrajectorySpec("x", "swe", 0, 0, 0, (TurnSpec(1, 1, 0.0, True),), 1, start_s=float("nan"))


@pytest.mark.parametrize("extra, field", [(', "tool_latency_s": 0.0, "start_s": NaN', "start_s"),
                                          (', "tool_latency_s": Infinity', "tool_latency_s")])
def test_non_finite_numbers_are_refused(tmp_path, extra, field):
    path = tmp_path / "nan.jsonl"
    path.write_text('{"traj": "t", "turn": 0, "appended_tokens": 1, "decode_tokens": 1, "done": true' + extra + '}\n')
    with pytest.raises(TraceError, match=rf"nan.jsonl:1: (field '{field}'|bad JSON)"):
        read_trace(path)


def test_integer_trajectory_ids_read_as_their_decimal_text(tmp_path):
    """Recorded agent logs often number their runs."""
    path = tmp_path / "numbered.jsonl"
    path.write_text("\n".join([_line(traj=0, done=False), _line(traj=0, turn=1), _line(traj=17)]) + "\n")
    assert [s.traj_id for s in read_trace(path)] == ["0", "17"]


def test_unreadable_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "absent.jsonl")


def test_empty_file_reads_as_no_trajectories(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert read_trace(tmp_path / "empty.jsonl") == []


def test_spec_invariants():
    with pytest.raises(ValueError, match="no turns"):
        TrajectorySpec("x", "swe", 0, 0, 0, (), 1)
    with pytest.raises(ValueError, match="last turn must be done"):
        TrajectorySpec("x", "swe", 0, 0, 0, (TurnSpec(1, 1, 0.0, True), TurnSpec(1, 1, 0.0, True)), 1)
    with pytest.raises(ValueError, match="last turn must be done"):
        TrajectorySpec("x", "swe", 0, 0, 0, (TurnSpec(1, 1, 0.5, False),), 1)
