"""Imported traces replay: import -> write_trace -> read_trace gives the same trajectories, and a
small simulated run plays every turn of them; the small real traces shared beside the repository
(../shared/traces) import too, and a serve run's folder replays what it served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prorsa.agent.importers import ImportOptions, TraceError, import_trace
from prorsa.agent.trace import read_trace, write_trace
from prorsa.config.pipeline import PipelineConfig
from prorsa.metrics.outputs import write_trajectories
from prorsa.sim.run import simulate
from prorsa.rollout.context import resolve

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "importers"
SHARED = ROOT.parent / "shared" / "traces"
ENGINES = {"backend": "emulated", "count": 2, "slots": 16, "gpu": "h200", "model": "qwen3-8b"}


def _cfg(trace: Path, n: int) -> PipelineConfig:
    return PipelineConfig.model_validate({"name": "imported", "policy": "colocated", "engines": ENGINES,
                                          "workload": {"trace": str(trace), "prompts": n, "group_size": 1}})


def _replays(specs, tmp_path) -> None:
    path = tmp_path / "imported.jsonl"
    write_trace(path, specs)
    assert read_trace(path) == specs
    run = simulate(resolve(_cfg(path, len(specs))), "colocated")
    done = sorted(run.recorder.trajectories, key=lambda r: r.spec.prompt_index)
    assert [r.status for r in done] == ["completed"] * len(specs)
    assert [[t.decode_tokens for t in r.turns] for r in done] == [[t.decode_tokens for t in s.turns] for s in specs]


@pytest.mark.parametrize("fixture", ["miniswe.traj.json", "llmservingsim.jsonl", "dynamo.jsonl", "openai.jsonl"])
def test_an_imported_fixture_replays_in_the_simulator(fixture, tmp_path):
    _, specs = import_trace(DATA / fixture)
    _replays(specs, tmp_path)


SHARED_FILES = {"lmcache_miniswe.jsonl": (20, 402), "lmcache_magagent.jsonl": (25, 746),
                "tracelab_examples_claude_codex.jsonl": (2, 19)}


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"the shared real traces are not at {SHARED}")
@pytest.mark.parametrize("name", sorted(SHARED_FILES))
def test_the_shared_real_traces_import_and_keep_every_turn(name, tmp_path):
    src = SHARED / name
    if not src.is_file():
        pytest.skip(f"{src} is absent")
    fmt, specs = import_trace(src)
    assert fmt == "turns"
    lines = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    assert (len(specs), sum(len(s.turns) for s in specs)) == SHARED_FILES[name] == (
        len({line["traj"] for line in lines}), len(lines))
    by_id = {s.traj_id: s for s in specs}
    for line in lines:  # integer ids become strings; token counts and gaps are kept as recorded
        t = by_id[str(line["traj"])].turns[line["turn"]]
        assert (t.appended_tokens, t.decode_tokens, t.tool_latency_s) == (
            line["appended_tokens"], line["decode_tokens"], line["tool_latency_s"])
    if name == "lmcache_miniswe.jsonl":
        _replays(specs[:6], tmp_path)


@pytest.mark.skipif(not (SHARED / "tracelab_examples_claude_codex.jsonl").is_file(), reason="shared traces absent")
def test_releases_on_unrelated_clocks_are_dropped_unless_insisted_on():
    _, specs = import_trace(SHARED / "tracelab_examples_claude_codex.jsonl")
    assert [s.start_s for s in specs] == [None, None]  # 6.2e6 s apart: two recordings, two clocks
    with pytest.raises(TraceError, match="unrelated clocks"):
        import_trace(SHARED / "tracelab_examples_claude_codex.jsonl", options=ImportOptions(releases="recorded"))


def test_a_serve_runs_folder_replays_what_it_served(tmp_path):
    """A run folder's trajectories.parquet (what serve writes, as every run does) back as a trace."""
    _, specs = import_trace(DATA / "llmservingsim.jsonl", options=ImportOptions(releases="none"))
    trace = tmp_path / "source.jsonl"
    write_trace(trace, specs)
    run = simulate(resolve(_cfg(trace, len(specs))), "colocated")
    folder = tmp_path / "served"
    folder.mkdir()
    write_trajectories(folder / "trajectories.parquet", run.recorder.trajectories)
    fmt, back = import_trace(folder)
    assert fmt == "serve"
    ran = {r.spec.traj_id: r for r in run.recorder.trajectories}
    for spec in back:
        r = ran[spec.traj_id]
        assert [(t.appended_tokens, t.decode_tokens) for t in spec.turns] == [
            (t.prefill_tokens, t.decode_tokens) for t in r.turns]
        assert [t.tool_latency_s for t in spec.turns[:-1]] == pytest.approx([t.tool_s for t in r.turns[:-1]])
    _replays(back, tmp_path)
