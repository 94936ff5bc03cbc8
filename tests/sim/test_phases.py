"""The alternating-demand search (benchmarks/phases.py) at small scale: its trace alternates the two
kinds in blocks, and a run scores every fixed split of the engines against prorsa and the oracle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prorsa.agent.trace import read_trace

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "phases.py"
sys.path.insert(0, str(SCRIPT.parent))
import phases  # noqa: E402


def test_the_trace_alternates_prefill_heavy_and_decode_heavy_blocks(tmp_path):
    path = tmp_path / "t.jsonl"
    phases.write_phase_trace(path, blocks=3, block=4, long=1000, decode=500, tool_s=0.5)
    specs = read_trace(path)
    assert [s.family for s in specs] == ["prefill-heavy"] * 4 + ["decode-heavy"] * 4 + ["prefill-heavy"] * 4
    heavy, light = specs[0].turns, specs[4].turns
    assert [(t.appended_tokens, t.decode_tokens) for t in heavy] == [(1000, 64)] * 4
    assert [(t.appended_tokens, t.decode_tokens) for t in light] == [(256, 500)] * 4
    assert [t.done for t in heavy] == [False, False, False, True] and heavy[-1].tool_latency_s == 0.0


def test_jitter_spreads_each_turns_decode_within_its_share_the_same_way_every_time(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (a, b):
        phases.write_phase_trace(path, blocks=2, block=16, long=1000, decode=500, tool_s=0.5, jitter=0.2)
    specs = read_trace(a)
    assert [(s.traj_id, s.turns) for s in specs] == [(s.traj_id, s.turns) for s in read_trace(b)]
    light = [t.decode_tokens for s in specs if s.family == "decode-heavy" for t in s.turns]
    heavy = [t.decode_tokens for s in specs if s.family == "prefill-heavy" for t in s.turns]
    assert all(400 <= d <= 600 for d in light) and all(51 <= d <= 77 for d in heavy)
    assert len(set(light)) > 30 and min(light) < 430 and max(light) > 570  # spread over the share, not a few values
    assert {t.appended_tokens for s in specs for t in s.turns} == {1000, 256}  # appends are left as they are


def test_every_fixed_split_of_eight_engines_once():
    assert len(phases.FIXED) == len(set(phases.FIXED)) == 43  # colocated and 42 splits P:D:M
    assert "static:4:4" in phases.FIXED and "static:0:2:6" in phases.FIXED and "static:0:8" not in phases.FIXED


def test_a_small_run_scores_every_split_and_marks_the_best(tmp_path):
    out = tmp_path / "phases.json"
    # engines of one rank (--ep 1): prorsa's no-prior opening, rehearsed under every split, is ~80%
    # of the run at the default EP4 (22 s against 4 s here); the scoring is the same at any rank count
    proc = subprocess.run([sys.executable, str(SCRIPT), "--blocks", "2", "--block", "8", "--concurrency", "8",
                           "--long", "2048", "--decode", "256", "--ep", "1", "--workers", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    rows = {r["policy"]: r for r in res["rows"]}
    assert set(rows) == {*phases.FIXED, "prorsa", "oracle"}
    best = max(phases.FIXED, key=lambda p: rows[p]["trajectories_per_s"])
    assert res["best_fixed"] == best and rows[best]["vs_best_fixed"] == 1.0
    assert all(r["switches"] == 0 for p, r in rows.items() if p in phases.FIXED)
    assert rows["colocated"]["vs_colocated"] == 1.0 and all(r["trajectories_per_s"] > 0 for r in rows.values())

    # --reuse: the fixed splits kept as the file holds them (one doctored to show it), prorsa run
    # again; a file whose colocated row the simulator no longer reproduces is refused
    args = [sys.executable, str(SCRIPT), "--blocks", "2", "--block", "8", "--concurrency", "8", "--long", "2048",
            "--decode", "256", "--ep", "1", "--workers", "2", "--rerun", "prorsa"]
    first = {p: r["trajectories_per_s"] for p, r in rows.items()}
    for r in res["rows"]:
        r["trajectories_per_s"] *= 0.5 if r["policy"] == "static:4:4" else 1
    out.write_text(json.dumps(res))
    again = tmp_path / "again.json"
    proc = subprocess.run([*args, "--reuse", str(out), "--out", str(again)], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kept = {r["policy"]: r for r in json.loads(again.read_text())["rows"]}
    assert kept["static:4:4"]["trajectories_per_s"] == first["static:4:4"] * 0.5
    assert kept["prorsa"]["trajectories_per_s"] == first["prorsa"]  # simulated again, alike
    for r in res["rows"]:
        r["trajectories_per_s"] *= 1.01 if r["policy"] == "colocated" else 1
    out.write_text(json.dumps(res))
    proc = subprocess.run([*args, "--reuse", str(out), "--out", str(tmp_path / "refused.json")], capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "its point colocated simulates to" in proc.stderr and not (tmp_path / "refused.json").exists()


def test_a_bad_count_is_refused_by_name():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--block", "0"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode != 0 and "--block must be at least 1" in proc.stderr and "Traceback" not in proc.stderr


def test_turns_kept_on_their_engines_keep_their_prefix(tmp_path):
    """runtime.sticky_overload reaches the simulator's router: with none, no turn leaves its
    engine for load, so none recomputes its context; with the default some do. Priced by the
    cost model, no move of an 8k-token context pays for itself with every turn admitted."""
    from prorsa.sim.run import simulate
    from prorsa.rollout.context import resolve

    trace = tmp_path / "t.jsonl"
    phases.write_phase_trace(trace, blocks=1, block=32, long=8192, decode=64, tool_s=1.0)
    runs = {o: simulate(resolve(phases.config(trace, 4, 32, 32, o)), "colocated").summary for o in (2.0, None, "cost")}
    hits = {o: s["prefix_hit_rate"] for o, s in runs.items()}
    assert hits[None] > hits[2.0] and hits["cost"] == hits[None]
    assert runs["cost"]["trajectories_per_s"] > runs[2.0]["trajectories_per_s"]


def test_a_bad_sticky_overload_is_refused_by_name():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sticky-overload", "0.5"], capture_output=True, text=True,
                          cwd=REPO)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--sticky-overload: a number of at least 1, cost, or none; got '0.5'" in proc.stderr


def test_a_bad_jitter_is_refused_by_name():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--jitter", "1.5"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--jitter must be at least 0 and under 1, got 1.5" in proc.stderr
    priors = subprocess.run([sys.executable, str(SCRIPT.parent / "priors.py"), "--table", "paper", "--jitter", "0.1"],
                            capture_output=True, text=True, cwd=REPO)
    assert priors.returncode != 0 and "Traceback" not in priors.stderr
    assert "--jitter: at least 0 and under 1, and for --table phases only; got 0.1" in priors.stderr
