"""The simulator: the live run's brain on a virtual clock, and `prorsa sim`."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import xarray as xr
from click.testing import CliRunner
from rich.console import Console

from prorsa.cli import main
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.lifecycle import Phase
from prorsa.control.policy import Decision, Snapshot, make_policy
from prorsa.live.run import run_live
from prorsa.rollout.context import policy_context, resolve
from prorsa.sim.run import lend, simulate, write_run

MOE = {
    "name": "simtest", "seed": 3, "policy": "colocated",
    "engines": {"backend": "emulated", "count": 4, "slots": 64, "model": "qwen3-30b-a3b", "ep": 4},
    "workload": {"family": "swe", "mode": "sync", "prompts": 16, "group_size": 8, "max_turns": 6,
                 "tool_time_scale": 0.25},
}


def cfg_of(d: dict, **engines) -> PipelineConfig:
    return PipelineConfig.model_validate(d | {"engines": d["engines"] | engines})


def test_every_trajectory_once_and_the_same_run_twice():
    cfg = cfg_of(MOE)
    a, b = simulate(resolve(cfg), "static:1:3"), simulate(resolve(cfg), "static:1:3")
    assert a.summary["trajectories_completed"] == 128 and a.summary["trajectories_failed"] == 0
    ids = [r.spec.traj_id for r in a.recorder.trajectories]
    assert len(ids) == len(set(ids)) == 128
    assert a.makespan_s == b.makespan_s > 0  # virtual time: deterministic to the bit
    turns = a.recorder.trajectories[0].turns
    assert all(t.prefill_engine == "engine-0" and t.decode_engine != "engine-0" for t in turns)
    assert all(t.transfer_s > 0 for t in turns)  # the KV moved between engines


def test_dp_attention_barrier_makes_disaggregation_pay_for_moe_only():
    """An MoE group's step waits for its slowest rank, so colocated prefills stall every rank's
    decodes; a dense model has no barrier and gains nothing from splitting here."""
    moe = cfg_of(MOE)
    coloc, split = simulate(resolve(moe), "colocated").makespan_s, simulate(resolve(moe), "static:1:3").makespan_s
    assert split < 0.95 * coloc
    dense = cfg_of(MOE, model="qwen3-8b", ep=1, slots=16)
    assert simulate(resolve(dense), "colocated").makespan_s < simulate(resolve(dense), "static:1:3").makespan_s


class Recording:
    """Wraps a policy; keeps what it was shown, so two bodies' snapshots can be compared."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.phases: dict[str, list[tuple[int, Phase]]] = defaultdict(list)
        self.decisions = 0

    def initial_roles(self, n):
        return self.inner.initial_roles(n)

    def decide(self, snap: Snapshot) -> Decision:
        for ev in snap.events:
            self.phases[ev.traj_id].append((ev.turn, ev.phase))
        self.decisions += 1
        return self.inner.decide(snap)


def test_one_policy_object_runs_unchanged_in_both_bodies(tmp_path):
    """The same prorsa policy object steers a simulated and a live (LocalCluster) run, and is shown
    the same lifecycle: each trajectory's events in the same order. (Whether a turn has a PREFILL
    leg depends on the roles at that moment, and the events after the last decision are never
    shown, so PREFILL is left out and one stream may stop short of the other.)

    Live, how many decisions fall within the run, and how close the last one comes to its end,
    is the control cadence against the run's wall time, and a loaded host stretches the steps
    (the scheduler call, the policy's thread) more than the engines' timed waits. So the live
    controller steps at its interval here, not after a pause set by the steps' CPU: at the
    default control_cpu_share (0.05) prorsa's ~7 ms a step made that pause ~0.15 s, some ten
    decisions in a ~2 s run, against ~45 at a share of 1. (Under load the driver's DONE could
    also come before its trajectory's last TOOL; control_loop.py holds an end seen during the
    body's look for the next step.)"""
    d = MOE | {"engines": MOE["engines"] | {"time_scale": 0.02},
               "workload": MOE["workload"] | {"tool_time_scale": 0.02 * 0.25, "prompts": 4},
               "runtime": {"control_interval_s": 0.02, "control_cpu_share": 1.0, "metrics_interval_s": 0.2,
                           "dashboard_address": None}}
    cfg = PipelineConfig.model_validate(d)
    policy = Recording(make_policy("prorsa", policy_context(cfg)))
    sim = simulate(resolve(cfg), policy)
    sim_phases, policy.phases = dict(policy.phases), defaultdict(list)
    sim_decisions, policy.decisions = policy.decisions, 0
    live = asyncio.run(run_live(resolve(cfg), tmp_path, Console(quiet=True), policy=policy, lend=lend))
    assert sim.summary["trajectories_completed"] == live["trajectories_completed"] == 32
    assert sim_decisions > 5 and policy.decisions > 5
    assert set(policy.phases) == set(sim_phases)
    ended = 0
    for traj, seq in sim_phases.items():
        a, b = ([e for e in s if e[1] is not Phase.PREFILL] for s in (seq, policy.phases[traj]))
        n = min(len(a), len(b))
        assert n >= 3 and a[:n] == b[:n], traj
        ended += a[-1][1] is Phase.DONE and b[-1][1] is Phase.DONE
    assert ended >= len(sim_phases) // 2


def test_written_run_and_the_cli(tmp_path):
    # 4 prompts (32 trajectories): the files and the CLI's table are the point here, not the cell's
    # scale, and 128 trajectories under prorsa's rehearsals and four CLI policies cost four times as much
    small = MOE | {"workload": MOE["workload"] | {"prompts": 4}}
    run = simulate(resolve(cfg_of(small)), "prorsa")
    write_run(run, tmp_path / "run")
    assert {p.name for p in (tmp_path / "run").iterdir()} >= {"metrics.nc", "summary.json", "trajectories.parquet"}
    f = tmp_path / "p.yaml"
    f.write_text(PipelineConfig.model_validate(small).model_dump_json())
    out = tmp_path / "out"
    # the command in this process, from its arguments on (three processes of their own paid ~2 s of
    # imports each); an exception escaping it would exit 1, not with its one line and 2
    proc = CliRunner().invoke(main, ["sim", str(f), "--policy", "colocated,static:*", "--gpus", "16", "--output", str(out)])
    assert proc.exit_code == 0, proc.stderr[-2000:]
    ds = xr.open_dataset(out / "results.nc")
    assert list(ds.policy.values) == ["colocated", "static:1:3", "static:2:2", "static:3:1"]
    assert (ds.trajectories_completed == 32).all() and ds.attrs["engines"] == 4
    assert "colocated" in proc.stdout and "*" in proc.stdout  # the table, best static marked
    bad = CliRunner().invoke(main, ["sim", str(f), "--policy", "nonsense"])
    assert bad.exit_code == 2 and "--policy" in bad.stderr and "Traceback" not in bad.stderr
    odd = CliRunner().invoke(main, ["sim", str(f), "--gpus", "6"])
    assert odd.exit_code == 2 and "--gpus" in odd.stderr
