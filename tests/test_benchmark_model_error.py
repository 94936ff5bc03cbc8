"""benchmarks/model_error.py's held-out workloads: a mix that shifts (synchronous over steps,
asynchronous over the run's trajectories), a recorded trace replayed with its releases, bad command
lines stopped with one line, and tables.py's rendering of such cells."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prorsa.agent.importers import import_trace
from prorsa.agent.workload import Workload
from tests.benchmark_scripts import load_script

REPO = Path(__file__).resolve().parent.parent
MINISWE = REPO / "benchmarks" / "traces" / "lmcache_miniswe.jsonl"


@pytest.fixture(scope="module")
def me():
    return load_script("model_error.py")


@pytest.fixture(scope="module")
def tables():
    return load_script("tables.py")


def test_a_synchronous_shift_moves_the_mix_over_its_steps(me):
    w = me._config("math-tir:swe", "sync", 7, 4).workload
    assert (w.family, w.mix, w.mix_end, w.steps) == (None, {"math-tir": 1.0}, {"swe": 1.0}, 4)
    drawn = Workload.from_config(w, 7)
    assert {s.family for s in drawn.trajectories_for_step(0)} == {"math-tir"}
    assert {s.family for s in drawn.trajectories_for_step(3)} == {"swe"}


def test_an_asynchronous_shift_moves_the_mix_over_the_run_one_group_at_a_time(me):
    cfg = me._config("swe:math-tir", "async", 7, 1)
    stream = me.shifting_stream(cfg)
    families = [stream.trajectory(i).family for i in range(cfg.workload.trajectories)]
    g = cfg.workload.group_size
    groups = [families[i:i + g] for i in range(0, len(families), g)]
    assert all(len(set(members)) == 1 for members in groups)  # a prompt's samples share its family
    assert groups[0][0] == "swe" and groups[-1][0] == "math-tir"  # probability 0 and 1 at the ends
    half = len(families) // 2
    assert families[:half].count("math-tir") < families[half:].count("math-tir")
    # each trajectory is the one its family draws in that slot, and the same on every call
    alone = Workload.from_config(cfg.workload.model_copy(update={"mix": None, "family": "math-tir"}), 7)
    last = len(families) - 1
    assert stream.trajectory(last).turns == alone.trajectory(last).turns
    assert [s.family for s in map(me.shifting_stream(cfg).trajectory, range(last + 1))] == families


def test_a_trace_cell_replays_each_recording_as_a_group_released_when_it_was(me, tmp_path):
    name, (src, grouped) = me.trace_file(str(MINISWE), tmp_path)
    assert (name, src) == ("lmcache_miniswe", str(MINISWE))
    _, recorded = import_trace(MINISWE)
    starts = sorted({s.start_s for s in recorded})
    assert len(starts) == len(recorded) > 1 and starts[0] == 0.0
    cfg = me._config(name, "async", 7, 1, trace=grouped)
    stream = Workload.from_config(cfg.workload, 7)
    released = [stream.trajectory(i).start_s for i in range(cfg.workload.trajectories)]
    assert released == sorted(released)
    first_pass = len(recorded) * 8  # groups of 8 samples, then the trace again one period later
    assert sorted(set(released[:first_pass])) == pytest.approx(starts)
    assert released[first_pass] == pytest.approx(starts[-1])
    step = Workload.from_config(me._config(name, "sync", 7, 1, trace=grouped).workload, 7).trajectories_for_step(0)
    assert [s.start_s for s in step[:8]] == [starts[0]] * 8 and step[8].start_s == pytest.approx(starts[1])


def test_a_coarser_grid_keeps_colocated_and_both_kinds_of_split_for_each_count(me):
    assert len(me.fixed_splits(32)) == 63
    assert me.fixed_splits(32, [1, 16]) == ["colocated", "static:1:31", "static:16:16", "static:1:0:31",
                                            "static:16:0:16"]


@pytest.mark.parametrize("argv, says", [
    (["--engines", "4", "--prefill", "1,4"], "--prefill: counts from 1 to 3"),
    (["--prefill", "two"], "--prefill: counts from 1 to 7"),
    (["--families", "swe:nope"], "--families: 'swe:nope'"),
    (["--families", "swe:math-tir", "--modes", "sync"], "--steps: a shifting mix"),
    (["--families", "none"], "no cells"),
])
def test_a_bad_command_line_stops_with_one_line(argv, says):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "model_error.py"), *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"error: {says}") and done.stderr.count("\n") == 1


def test_a_bad_trace_stops_with_one_line_naming_it(tmp_path):
    bad = tmp_path / "broken.jsonl"
    bad.write_text(json.dumps({"traj": 0, "turn": 1, "appended_tokens": 5, "decode_tokens": 5,
                               "tool_latency_s": 0, "done": True}) + "\n")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "model_error.py"), "--families", "none",
                           "--trace", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: --trace: ") and "broken.jsonl" in done.stderr
    assert done.stderr.count("\n") == 1


def test_the_held_out_table_gives_prorsa_over_the_best_and_over_colocated(tables):
    def cell(mode: str, best: float, colocated: float, ratio: float, **extra) -> dict:
        return {"family": "swe:math-tir", "mode": mode, "seed": 7, "steps": 4 if mode == "sync" else 1,
                "engines": 8, "best_fixed": "static:1:7", "best_figure": best, "colocated": colocated,
                "prorsa_vs_best": {"exact": ratio}, "switches": {"exact": 3}} | extra
    doc = {"cells": [cell("sync", 700.0, 840.0, 0.95),  # prorsa 736.8 s: 840 / 736.8 over colocated
                     cell("async", 1.0, 0.5, 0.98, family="lmcache_miniswe", trace="t.jsonl")]}
    lines = tables.held_out_table("x.json")({"x.json": doc})
    assert lines[2] == "| swe -> math-tir | sync | 7 | 8 | 4 | 1:7 | 0.950 | 1.140 | 3 |"
    assert lines[3] == "| lmcache_miniswe (trace) | async | 7 | 8 | 1 | 1:7 | 0.980 | 1.960 | 3 |"
    assert "lowest prorsa / best fixed 0.950 (swe -> math-tir sync seed 7), 1 of 2 at 0.97" in lines[-1]
    assert lines[-1].endswith("lowest prorsa / colocated 1.140.")
