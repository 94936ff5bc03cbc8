"""Every reader on a small fixture of its format (tests/data/importers), with the numbers worked
out by hand: appended = this prompt - (previous prompt + completion), a reset starts afresh,
gaps as each format measures them."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from prorsa.agent.importers import ImportOptions, detect, import_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "importers"


def turns(spec) -> list[tuple[int, int, float]]:
    return [(t.appended_tokens, t.decode_tokens, t.tool_latency_s) for t in spec.turns]


def test_mini_swe_agent_counts_appended_tokens_and_starts_afresh_after_a_reset():
    name, (spec,) = import_trace(DATA / "miniswe.traj.json")
    assert name == "swe-agent" and spec.traj_id == "miniswe"
    # 1700 - (1500 + 90) = 110; 900 < 1760: the context was trimmed, all 900 are new; 0 completion -> 1
    assert turns(spec) == [(1500, 90, 4.0), (110, 60, 6.0), (900, 120, 3.5), (80, 1, 0.0)]
    assert spec.turns[-1].done and not any(t.done for t in spec.turns[:-1])
    assert spec.start_s == 0.0


def test_decode_tps_takes_the_models_time_out_of_end_to_end_gaps():
    """extra.timestamp marks a reply's arrival: a gap holds the *next* call's decode."""
    _, (spec,) = import_trace(DATA / "miniswe.traj.json", options=ImportOptions(decode_tps=30.0))
    assert [t.tool_latency_s for t in spec.turns] == pytest.approx([4 - 60 / 30, 6 - 120 / 30, 3.5, 0.0])


def test_swe_agent_history_with_step_execution_times():
    name, (spec,) = import_trace(DATA / "sweagent.traj")
    assert name == "swe-agent" and spec.traj_id == "sweagent"
    assert turns(spec) == [(3000, 40, 0.25), (60, 25, 0.0)]
    # execution_time is the tool's own time: --decode-tps leaves it alone
    _, (same,) = import_trace(DATA / "sweagent.traj", options=ImportOptions(decode_tps=1.0))
    assert turns(same) == turns(spec)


def test_a_folder_of_trajectory_files(tmp_path):
    for f in ("miniswe.traj.json", "sweagent.traj"):
        (tmp_path / f.split(".")[0]).mkdir()
        shutil.copy(DATA / f, tmp_path / f.split(".")[0] / f)
    name, specs = import_trace(tmp_path)
    assert name == "swe-agent" and [s.traj_id for s in specs] == ["miniswe", "sweagent"]
    assert [s.prompt_index for s in specs] == [0, 1]


def test_llmservingsim_sessions_flat_requests_and_integer_ids():
    name, specs = import_trace(DATA / "llmservingsim.jsonl")
    assert name == "llmservingsim"
    assert [s.traj_id for s in specs] == ["s0", "7", "3"]  # the flat request: its line number
    assert turns(specs[0]) == [(1200, 80, 2.5), (120, 50, 0.5), (50, 30, 0.0)]
    assert turns(specs[1]) == [(300, 20, 1.0), (20, 10, 0.0)]
    assert turns(specs[2]) == [(64, 8, 0.0)]
    assert [s.start_s for s in specs] == pytest.approx([0.0, 1.0, 4.0])
    # tool_duration_ns is already the tool's time
    _, again = import_trace(DATA / "llmservingsim.jsonl", options=ImportOptions(decode_tps=1.0))
    assert [turns(s) for s in again] == [turns(s) for s in specs]


def test_dynamo_groups_by_trajectory_skips_tool_events_and_reads_gzip(tmp_path):
    gz = tmp_path / "request-trace.000001.jsonl.gz"
    gz.write_bytes(gzip.compress((DATA / "dynamo.jsonl").read_bytes()))
    for path in (DATA / "dynamo.jsonl", gz):
        name, specs = import_trace(path)
        assert name == "dynamo"
        assert [s.traj_id for s in specs] == ["run-1:coder", "run-1:tester"]
        # end of r1 (1100 ms) to receipt of r2 (3600 ms); 2400 - (2048 + 96) = 256
        assert turns(specs[0]) == [(2048, 96, 2.5), (256, 64, 0.0)]
        assert turns(specs[1]) == [(500, 40, 0.0)]
        assert [s.start_s for s in specs] == pytest.approx([0.0, 1.0])


def test_openai_logs_group_by_session_and_gaps_run_start_to_start():
    name, specs = import_trace(DATA / "openai.jsonl")
    assert name == "openai" and [s.traj_id for s in specs] == ["task-3", "task-9"]
    assert turns(specs[0]) == [(1820, 95, 7.0), (185, 70, 0.0)]
    assert turns(specs[1]) == [(400, 50, 0.0)]
    _, timed = import_trace(DATA / "openai.jsonl", options=ImportOptions(decode_tps=95.0))
    assert timed[0].turns[0].tool_latency_s == pytest.approx(6.0)  # created stamps: this call's decode


def test_releases_none_and_family_label():
    _, specs = import_trace(DATA / "llmservingsim.jsonl", options=ImportOptions(releases="none", family="swe"))
    assert all(s.start_s is None and s.family == "swe" for s in specs)


@pytest.mark.parametrize("fixture, fmt", [("miniswe.traj.json", "swe-agent"), ("sweagent.traj", "swe-agent"),
                                          ("llmservingsim.jsonl", "llmservingsim"), ("dynamo.jsonl", "dynamo"),
                                          ("openai.jsonl", "openai"), ("../small_trace.jsonl", "turns")])
def test_auto_detection_by_content(fixture, fmt, tmp_path):
    renamed = tmp_path / "recording.data"  # the name says nothing: only the content can
    shutil.copy(DATA / fixture, renamed)
    assert detect(renamed) == fmt
