"""Workloads that move as RL runs do, simulated: a trace's staggered releases (start_s) and a mix
of families that shifts across steps (workload.mix, mix_end); in `prorsa sim` too."""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import replace

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from prorsa.agent.trace import write_trace
from prorsa.agent.workload import Workload
from prorsa.cli import main
from prorsa.config.pipeline import PipelineConfig, WorkloadConfig
from prorsa.sim.run import simulate
from prorsa.rollout.context import resolve

ENGINES = {"backend": "emulated", "count": 2, "slots": 16, "gpu": "h200", "model": "qwen3-8b"}
RELEASES = [0.0, 0.0, 5.0, 5.0, 200.0, 400.0]  # the last two come after the rest have ended


def _trace(tmp_path, releases=RELEASES, name="staggered.jsonl"):
    specs = Workload.from_config(WorkloadConfig(family="search", prompts=len(RELEASES), group_size=1),
                                 5).trajectories_for_step(0)
    path = tmp_path / name
    write_trace(path, [replace(s, start_s=r) for s, r in zip(specs, releases)])
    return path


def _cfg(trace, n: int, **workload) -> PipelineConfig:
    return PipelineConfig.model_validate({"name": "releases", "policy": "colocated", "engines": ENGINES,
                                          "workload": {"trace": str(trace), "prompts": n, "group_size": 1} | workload})


@pytest.mark.parametrize("policy", ["colocated", "prorsa"])
def test_staggered_releases_start_on_time_and_set_the_makespan(tmp_path, policy):
    run = simulate(resolve(_cfg(_trace(tmp_path), len(RELEASES))), policy)
    starts = {r.spec.prompt_index: r.start_s for r in run.recorder.trajectories}
    assert [starts[i] for i in range(len(RELEASES))] == pytest.approx(RELEASES, abs=1e-9)
    # the last one, released at 400 s onto idle engines, runs as it would alone
    alone = tmp_path / "alone.jsonl"
    write_trace(alone, [replace(Workload.from_config(_cfg(_trace(tmp_path), len(RELEASES)).workload, 0)
                                .trajectories_for_step(0)[-1], start_s=None)])
    by_itself = simulate(resolve(_cfg(alone, 1)), policy).makespan_s
    assert run.makespan_s == pytest.approx(400.0 + by_itself, rel=1e-9)
    assert 400.0 + 1.0 < run.makespan_s < 400.0 + 30.0


def test_releases_are_in_the_pipelines_wall_seconds(tmp_path):
    """Emulated engines at time_scale 0.5: a wall second is two of the cost model's, as for tool latencies."""
    cfg = _cfg(_trace(tmp_path), len(RELEASES))
    scaled = cfg.model_copy(update={"engines": cfg.engines.model_copy(update={"time_scale": 0.5})})
    starts = sorted(r.start_s for r in simulate(resolve(scaled), "colocated").recorder.trajectories)
    assert starts == pytest.approx([2 * r for r in RELEASES], abs=1e-9)


def test_a_shifting_mix_simulates_with_each_trajectory_its_family():
    cfg = PipelineConfig.model_validate({
        "name": "mix", "policy": "colocated", "engines": ENGINES,
        "workload": {"mix": {"swe": 1}, "mix_end": {"math-tir": 1}, "steps": 3, "prompts": 6, "group_size": 2,
                     "max_turns": 3}})
    run = simulate(resolve(cfg), "prorsa")
    by_step = Counter((r.spec.step, r.spec.family) for r in run.recorder.trajectories)
    expected = Workload.from_config(cfg.workload, cfg.seed)
    assert by_step == Counter((s.step, s.family) for k in range(3) for s in expected.trajectories_for_step(k))
    assert by_step[0, "swe"] == 12 and by_step[2, "math-tir"] == 12  # all of one family at either end
    assert by_step[1, "swe"] == 2 and by_step[1, "math-tir"] == 10  # halfway: seed 0 draws 1 prompt of 6 as swe


def _sim_cli(pipeline, out) -> subprocess.CompletedProcess:
    """`prorsa sim` in this process (the command's own code from its arguments on; a process of its
    own would add its ~2 s of imports to each of the four calls below): an exception that escaped
    the command would exit 1, not with its one line and 2."""
    args = ["sim", str(pipeline), "--policy", "colocated,prorsa", "--output", str(out)]
    r = CliRunner().invoke(main, args)
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def test_prorsa_sim_replays_releases_and_mixes(tmp_path):
    _trace(tmp_path)
    releases = tmp_path / "releases.yaml"
    releases.write_text("name: releases\npolicy: colocated\nengines: {backend: emulated, count: 2, gpu: h200, model: qwen3-8b}\n"
                        "workload: {trace: staggered.jsonl, prompts: 6, group_size: 1}\n")  # relative to the file
    proc = _sim_cli(releases, tmp_path / "out-r")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sync trace" in proc.stdout
    for policy in ("colocated", "prorsa"):
        t = pq.read_table(tmp_path / "out-r" / "runs" / policy / "trajectories.parquet").to_pylist()
        starts = dict((r["prompt_index"], r["start_s"]) for r in t)
        assert [starts[i] for i in range(len(RELEASES))] == pytest.approx(RELEASES, abs=1e-9)

    mix = tmp_path / "mix.yaml"
    mix.write_text("name: mix\nseed: 2\npolicy: colocated\nengines: {backend: emulated, count: 2, gpu: h200, model: qwen3-8b}\n"
                   "workload: {mix: {swe: 3, search: 1}, mix_end: {search: 1}, steps: 2, prompts: 4, group_size: 2, "
                   "max_turns: 3}\n")
    proc = _sim_cli(mix, tmp_path / "out-m")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sync mix" in proc.stdout
    t = pq.read_table(tmp_path / "out-m" / "runs" / "prorsa" / "trajectories.parquet").to_pylist()
    drawn = Workload.from_config(WorkloadConfig(mix={"swe": 3, "search": 1}, mix_end={"search": 1}, steps=2,
                                                prompts=4, group_size=2, max_turns=3), 2)
    assert sorted((r["traj_id"], r["family"]) for r in t) == sorted(
        (s.traj_id, s.family) for k in range(2) for s in drawn.trajectories_for_step(k))
    assert {r["family"] for r in t if r["step"] == 1} == {"search"}

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nworkload: {mix: {swe: 1, chess: 2}}\n")
    proc = _sim_cli(bad, tmp_path / "out-b")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "workload.mix" in proc.stderr and "'chess'" in proc.stderr
    (tmp_path / "neg.jsonl").write_text('{"traj": "t", "turn": 0, "appended_tokens": 10, "decode_tokens": 5, '
                                        '"tool_latency_s": 0.0, "done": true, "start_s": -1}\n')
    neg = tmp_path / "neg.yaml"
    neg.write_text("name: neg\nworkload: {trace: neg.jsonl}\n")
    proc = _sim_cli(neg, tmp_path / "out-n")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "neg.jsonl:1: field 'start_s'" in proc.stderr
