"""What a run may assume: nothing of its own future. A prior is an earlier run's means (or the
pipeline's declared ones); without one prorsa opens all mixed, or on engines of several
DP-attention ranks on the split of least worst-case regret over the plausible families rehearsed
(where the body lends the simulator), and learns from its turns."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from prorsa.config.load import ConfigError
from prorsa.config.pipeline import ExpectConfig, PipelineConfig
from prorsa.metrics.prior import PriorError, read_prior
from prorsa.roles import Role
from prorsa.rollout.context import resolve
from prorsa.sim.run import simulate, write_run

MOE = {
    "name": "priors", "seed": 3, "policy": "prorsa",
    "engines": {"backend": "emulated", "count": 8, "slots": 128, "model": "qwen3-30b-a3b", "ep": 4},
    "workload": {"family": "swe", "mode": "sync", "prompts": 16, "group_size": 8, "max_turns": 8},
}


N4 = 4  # engines in the smaller cell of the runs below
# 4 engines of 8 prompts x 8 (64 trajectories a step, 15 candidate splits) and 4 turns: where 8 engines
# of 128 (45 splits) and 8 turns cost six times as much to rehearse and exercise nothing more here
SMALL = {"engines": MOE["engines"] | {"count": N4}, "workload": MOE["workload"] | {"max_turns": 4, "prompts": 8}}


def cfg(**top) -> PipelineConfig:
    return PipelineConfig.model_validate(MOE | top)


@pytest.fixture(scope="module")
def earlier(tmp_path_factory):
    """An earlier run of the same workload, another seed: what `--prior RUN_DIR` reads."""
    sim = simulate(resolve(cfg(seed=4)), "colocated")
    run_dir = tmp_path_factory.mktemp("earlier") / "run"
    write_run(sim, run_dir)
    return run_dir, sim


def test_a_prior_is_the_means_of_what_the_earlier_run_did(earlier):
    run_dir, sim = earlier
    done = [r for r in sim.recorder.trajectories if r.status == "completed"]
    turns = [t for r in done for t in r.turns]
    got = read_prior(run_dir)
    assert got.turns == pytest.approx(len(turns) / len(done))
    assert got.prompt_tokens == pytest.approx(sum(r.turns[0].prefill_tokens for r in done) / len(done))
    later = [t.prefill_tokens for r in done for t in r.turns[1:]]
    assert got.observation_tokens == pytest.approx(sum(later) / len(later))
    assert got.decode_tokens == pytest.approx(sum(t.decode_tokens for t in turns) / len(turns))
    tools = [t.tool_s for r in done for t in r.turns[:-1]]
    assert got.tool_s == pytest.approx(sum(tools) / len(tools)) and got.tool_s > 0
    # a sim --output folder (runs/<policy>/) and the parquet file itself read alike
    assert read_prior(run_dir / "trajectories.parquet") == got
    assert read_prior(run_dir.parent) == got


def test_without_a_prior_or_a_simulator_prorsa_opens_all_mixed_and_with_a_prior_on_its_split(earlier):
    run_dir, _ = earlier
    bare, told = resolve(cfg()), resolve(cfg(prior=str(run_dir)))
    assert bare.policy.prior is None and told.policy.prior.concurrency == 128
    from prorsa.control.policy import make_policy

    assert make_policy("prorsa", bare.policy).initial_roles(8) == [Role.MIXED] * 8
    assert Role.PREFILL in make_policy("prorsa", told.policy).initial_roles(8)
    declared = cfg(prior=read_prior(run_dir).model_dump())
    assert resolve(declared).policy.prior == told.policy.prior


def test_a_prior_the_opening_batch_contradicts_is_set_aside_and_the_run_opens_as_with_none(earlier):
    """A wrong family's prior (declared math-tir-like prompts on a SWE run): the batch in hand
    already shows prompts five times as long, so the policy, the router and the scheduler start as
    they would with no prior at all, and the run is the no-prior run to the event."""
    from prorsa.agent.workload import Workload
    from prorsa.rollout.context import prior_checked

    run_dir, _ = earlier
    wrong = read_prior(run_dir).model_dump() | {"prompt_tokens": 400.0}
    told = resolve(cfg(prior=wrong))
    workload = Workload.from_config(told.cfg.workload, told.cfg.seed)
    prompts = workload.opening_prompts()
    assert len(prompts) == 128 and sum(prompts) / 128 > 2 * 400
    dropped = prior_checked(told, workload)
    assert dropped.policy.prior is None and dropped.policy.prior_trajectories == ()
    assert dropped.policy.prior_dropped.startswith("prior dropped: prompt_tokens ")
    assert dropped.policy.prior_dropped.endswith("against its 400 in the 128 prompts the run opens with")
    same_family = resolve(cfg(prior=str(run_dir)))
    kept = prior_checked(same_family, workload)  # told the prompts in hand, its prior kept
    assert kept.policy.prior == same_family.policy.prior and kept.policy.opening_prompts == tuple(prompts)
    from prorsa.control.policy import make_policy

    policy = make_policy("prorsa", dropped.policy)
    assert policy.initial_roles(8) == [Role.MIXED] * 8  # no prior, and here no simulator to rehearse with
    assert policy.opening_reason.startswith(dropped.policy.prior_dropped + "; no prior")

    # the smaller cell: the prior is as wrong for its 64 prompts as for the 128 above
    none, wrong_run = simulate(resolve(cfg(**SMALL)), "prorsa"), simulate(resolve(cfg(prior=wrong, **SMALL)), "prorsa")
    assert wrong_run.summary["makespan_s"] == none.summary["makespan_s"]
    assert wrong_run.summary["role_switches"] == none.summary["role_switches"]
    assert [c.reason for c in wrong_run.recorder.controls] == [c.reason for c in none.recorder.controls]
    # kept as told when its prompts fit: it opens on its steady state's split, not the no-prior
    # opening the plausible families' rehearsal holds
    kept = simulate(resolve(cfg(prior=read_prior(run_dir).model_dump(), **SMALL)), "prorsa")
    assert none.recorder.controls[0].reason.startswith("hold ")
    assert not kept.recorder.controls[0].reason.startswith("hold ")


def test_later_steps_open_on_the_split_that_would_have_ended_the_last_one_soonest():
    """Three steps, no prior: the first opens on the plausible families' rehearsals; between steps (no drain: nothing is in
    flight) prorsa replays the step that ran (and from the third step on the one before it too)
    under every candidate split in the simulator and opens the next step on the fastest, which it
    holds through the step."""
    from prorsa.control.policy import make_policy
    from prorsa.sim.rehearse import rehearser
    from prorsa.sim.run import simulate_async

    # the opening rehearses 3 families under every split, each capped at the pipeline's turns
    three = cfg(engines=SMALL["engines"], workload=SMALL["workload"] | {"steps": 3})
    sim = simulate(resolve(three), "prorsa")
    between = [c for c in sim.recorder.controls if c.reason.startswith("next step")]
    assert len(between) == 2 and all("rehearsed on 64 trajectories" in c.reason for c in between)
    first_step_end = max(r.end_s for r in sim.recorder.trajectories if r.spec.step == 0)
    assert between[0].t == pytest.approx(first_step_end)
    assert sim.recorder.controls[0].reason.startswith("hold ")  # the opening's rehearsed split
    opened = [ch for ch in sim.recorder.role_changes if ch.reason.startswith("next step")]
    assert opened and all(ch.drain_s == 0 for ch in opened)
    assert len(opened) == sim.summary["role_switches"]  # held: no switch inside a step
    # the split step 2 opened on is the one a rehearsal of step 1 ranks first
    from dataclasses import replace

    from prorsa.control.replayed import decodes_as as _decodes_as
    from prorsa.rollout.control_loop import as_ran

    run = resolve(three)
    step1 = [as_ran(r) for r in sim.recorder.trajectories if r.spec.step == 1]
    p = make_policy("prorsa", replace(run.policy, rehearse=rehearser(run, simulate_async)))
    step0 = [as_ran(r) for r in sim.recorder.trajectories if r.spec.step == 0]
    p._carried_forward(step0)  # the policy carries the step-over-step drift of decodes forward
    ahead, trend = p._carried_forward(step1)
    assert f"decodes x{trend:.2f}" in between[1].reason or trend == 1.0
    older = _decodes_as(ahead, step0)  # the step before, rehearsed beside it
    assert f"and the {len(older)} of the step before" in between[1].reason
    p._rehearsed(ahead, N4, (0, 0, N4), older)
    times = {c: t + p.rehearsals[-1][c] for c, t in p.rehearsals[-2].items()}
    count = tuple(int(x) for x in re.match(r"next step: P(\d+) D(\d+) M(\d+)", between[1].reason).groups())
    # the fastest, or all mixed where no split leads it by REHEARSAL_GAIN (and the model's error)
    assert count == (0, 0, N4) or times[count] == min(times.values()) < times[0, 0, N4] / 1.01
    # and the step ran on it: its engines, once the switches asked for then were seen through
    step2 = [c.roles for c in sim.recorder.controls if c.t > between[1].t + 5]
    assert tuple(sum(1 for r in step2[0].values() if r is want) for want in (Role.PREFILL, Role.DECODE, Role.MIXED)) == count


def test_an_earlier_run_is_read_back_as_it_ran(earlier):
    from prorsa.metrics.prior import prior_trajectories

    run_dir, sim = earlier
    specs = prior_trajectories(run_dir)
    ran = {r.spec.traj_id: r for r in sim.recorder.trajectories if r.status == "completed"}
    assert len(specs) == len(ran) and len({s.seed for s in specs}) == len(specs)
    for s in specs[:5]:
        r = ran[s.traj_id]
        assert [t.appended_tokens for t in s.turns] == [t.prefill_tokens for t in r.turns]
        assert [t.decode_tokens for t in s.turns] == [t.decode_tokens for t in r.turns]
        assert [t.tool_latency_s for t in s.turns][:-1] == pytest.approx([t.tool_s for t in r.turns][:-1])
        assert s.turns[-1].done and s.turns[-1].tool_latency_s == 0
    assert len(prior_trajectories(run_dir, limit=7)) == 7


def test_bad_priors_get_one_line_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^prior: .*nowhere: no such run directory"):
        resolve(cfg(prior=str(tmp_path / "nowhere")))
    with pytest.raises(ConfigError, match=r"^prior: .*not a run directory"):
        resolve(cfg(prior=str(tmp_path)))
    (tmp_path / "trajectories.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match=r"^prior: .*unreadable trajectories.parquet"):
        resolve(cfg(prior=str(tmp_path)))
    with pytest.raises(ValueError, match="decode_tokens"):
        ExpectConfig(prompt_tokens=1, observation_tokens=1, decode_tokens=0, turns=2)
    with pytest.raises(PriorError):
        read_prior(tmp_path / "nowhere")


def test_prior_on_the_command_line(earlier, tmp_path):
    run_dir, _ = earlier
    pipeline = tmp_path / "p.json"
    pipeline.write_text(json.dumps(MOE | SMALL))  # the earlier run's trajectories rehearsed on 4 engines
    cli = [sys.executable, "-m", "prorsa.cli", "sim", str(pipeline), "--policy", "prorsa"]
    ok = subprocess.run([*cli, "--prior", str(run_dir)], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*cli, "--prior", str(tmp_path / "missing")], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error:") and "prior:" in bad.stderr
    assert "Traceback" not in bad.stderr


ASYNC = {"family": "swe", "mode": "async", "concurrency": 8, "trajectories": 48, "max_turns": 4}


def test_an_asynchronous_opening_rehearses_the_earlier_runs_first_windows_as_the_run_keeps_them(tmp_path):
    """An asynchronous run holds its rehearsed opening to its end, so prorsa rehearses the earlier
    run's first OPENING_WINDOWS x `concurrency` trajectories, not its opening burst alone, and the
    rehearsal keeps `concurrency` of them in flight, one started as one ends, as the run will."""
    from dataclasses import replace

    from prorsa.control.opener import OPENING_WINDOWS
    from prorsa.control.policy import make_policy
    from prorsa.metrics.prior import prior_trajectories
    from prorsa.sim.rehearse import rehearser
    from prorsa.sim.run import simulate_async

    write_run(simulate(resolve(cfg(seed=4, workload=ASYNC)), "colocated"), tmp_path / "run")
    run = resolve(cfg(workload=ASYNC, prior=str(tmp_path / "run")))
    assert run.policy.asynchronous and run.policy.concurrency == 8
    real, asked = rehearser(run, simulate_async), []

    def rehearse(specs, split, **model):
        if "told" not in model:  # the earlier run's, not the plausible families' (the split to beat)
            asked.append(tuple(s.traj_id for s in specs))
        return real(specs, split, **model)

    make_policy("prorsa", replace(run.policy, rehearse=rehearse)).initial_roles(8)
    earlier = prior_trajectories(tmp_path / "run")
    assert len(earlier) > OPENING_WINDOWS * 8 and set(asked) == {tuple(s.traj_id for s in earlier[:OPENING_WINDOWS * 8])}

    # one in flight: each trajectory runs alone, after the one before it ended
    serial = rehearser(resolve(cfg(workload=ASYNC | {"concurrency": 1})), simulate_async)
    three, alone = list(earlier[:3]), [serial([s], (0, 0, 8)) for s in earlier[:3]]
    assert serial(three, (0, 0, 8)) == pytest.approx(sum(alone), rel=0.01)
    # no more than the run keeps in flight: replayed at once, as a step
    assert real(three, (0, 0, 8)) < 0.8 * sum(alone)
