"""Partial rollouts (rollout/partial.py) on the virtual clock: whole groups, each trajectory's fate
reported once, carried trajectories' versions, the in-flight count per step, clean cancels."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict

import pytest

from prorsa.agent.loop import TurnResult
from prorsa.agent.workload import Workload
from prorsa.config.pipeline import PipelineConfig
from prorsa.rollout.drivers import Hooks
from prorsa.rollout.partial import Checkpoint, PartialPlan, run_partial
from prorsa.sim.clock import run_virtual

STEPS, B, G = 5, 4, 3


class DecodeTimed:
    """A turn takes its decode tokens / 100 seconds, so lengths (and finishing order) vary; it
    counts the turns running, which a cancel must bring back to 0."""
    needs_token_ids = False
    vocab_size = 0

    def __init__(self) -> None:
        self.running = 0
        self.started: dict[str, float] = {}  # each trajectory's last turn sent

    async def run_turn(self, req):
        loop = asyncio.get_running_loop()
        self.running += 1
        self.started[req.traj_id] = loop.time()
        try:
            await asyncio.sleep(0.5 + req.decode_tokens / 100)
        finally:
            self.running -= 1
        return TurnResult(req.traj_id, req.turn, "e0", "e1", req.appended_tokens, 0, req.decode_tokens)


def roll(over_sample=0.5, carry=True, max_staleness=None, steps=STEPS, seed=2, overlap=False, updates=None):
    partial = {"over_sample": over_sample, "carry": carry, "overlap": overlap} | (
        {} if max_staleness is None else {"max_staleness": max_staleness})
    cfg = PipelineConfig.model_validate({"name": "t", "partial_rollout": partial, "workload": {
        "family": "coding-agent", "prompts": B, "group_size": G, "steps": steps, "max_turns": 12}})
    plan = PartialPlan.of(cfg)
    runner = DecodeTimed()
    log: list = []  # on_done's results, and "update" at each step boundary

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def update():
            log.append("update")
            if updates is not None:
                updates.append(loop.time() - t0)
            await asyncio.sleep(0.25)

        await run_partial(Workload.from_config(cfg.workload, seed), cfg.workload, runner, lambda: loop.time() - t0,
                          Hooks(log.append, update_weights=update), partial=plan)

    run_virtual(main())
    return plan, runner, log


def results(log):
    return [r for r in log if r != "update"]


def groups_of(rs):
    out = defaultdict(list)
    for r in rs:
        out[(r.spec.step, r.spec.prompt_index)].append(r)
    return out


def test_the_plan_rounds_up_to_whole_groups():
    cfg = PipelineConfig.model_validate({"name": "t", "workload": {"prompts": 10}, "partial_rollout": {"over_sample": 0.1}})
    assert PartialPlan.of(cfg).groups == 11  # not 12: 1.1 x 10 is 11 exactly
    cfg = PipelineConfig.model_validate({"name": "t", "workload": {"prompts": 10}, "partial_rollout": {"over_sample": 0.11}})
    assert PartialPlan.of(cfg).groups == 12
    assert PartialPlan.of(PipelineConfig.model_validate({"name": "t"})) is None


def test_each_step_trains_prompts_whole_groups_the_first_to_be_whole():
    _, _, log = roll()
    rs = results(log)
    trained = [r for r in rs if r.trained_step is not None]
    assert Counter(r.trained_step for r in trained) == {s: B * G for s in range(STEPS)}
    for members in groups_of(rs).values():
        assert len(members) == G
        assert len({m.trained_step for m in members}) == 1  # a group is trained together, or not at all
        assert len({m.status for m in members if m.trained_step is not None} - {"completed", "failed"}) == 0
    for step in range(STEPS):  # the batch is the first to be whole: none left out ended sooner
        batch = [r for r in trained if r.trained_step == step]
        batch_end = max(r.end_s for r in batch)
        left = [g for g in groups_of(rs).values() if g[0].trained_step is None or g[0].trained_step > step]
        assert all(max(m.end_s for m in g) >= batch_end or min(m.start_s for m in g) > batch_end for g in left
                   if all(m.status == "completed" for m in g))


def test_every_trajectory_is_reported_once_trained_or_not():
    _, _, log = roll()
    rs = results(log)
    ids = [r.spec.traj_id for r in rs]
    assert len(ids) == len(set(ids))
    assert {r.status for r in rs} <= {"completed", "cancelled", "stale"}
    assert all((r.trained_step is None) == (r.status in ("cancelled", "stale")) for r in rs)
    # a batch is reported before the update that trains it, after the one before
    boundaries = [i for i, x in enumerate(log) if x == "update"]
    assert len(boundaries) == STEPS - 1
    for step, at in enumerate(boundaries):
        assert all(r.trained_step <= step for r in log[:at] if r != "update" and r.trained_step is not None)
        assert all(r.trained_step > step for r in log[at:] if r != "update" and r.trained_step is not None)


def test_carried_trajectories_take_their_next_turns_under_the_new_version():
    _, _, log = roll()
    rs = results(log)
    carried = [r for r in rs if r.trained_step is not None and r.trained_step > r.spec.step]
    assert carried, "no trajectory was carried: the test shows nothing"
    for r in rs:
        versions = [t.policy_version for t in r.turns]
        assert versions == sorted(versions) and versions[0] == r.policy_version == r.spec.step
    mixed = [r for r in carried if len({t.policy_version for t in r.turns}) > 1]
    assert mixed, "no carried trajectory crossed a boundary mid-trajectory"
    assert all(r.trained_step - r.policy_version <= 1 for r in carried)  # the default bound


def test_each_step_keeps_the_planned_groups_in_flight():
    plan, _, log = roll()
    segment, reported_in = 0, {}  # the step each trajectory was reported in (updates split them)
    for x in log:
        if x == "update":
            segment += 1
        else:
            reported_in[x.spec.traj_id] = segment
    rs = results(log)
    for step in range(STEPS):
        # a stale group reported in this step was dropped as it began: it is not in flight
        carried = {(r.spec.step, r.spec.prompt_index) for r in rs if r.spec.step < step
                   and reported_in[r.spec.traj_id] >= step
                   and not (r.status == "stale" and reported_in[r.spec.traj_id] == step)}
        started = {(r.spec.step, r.spec.prompt_index) for r in rs if r.spec.step == step}
        assert len(started) + len(carried) == plan.groups, step
        assert step == 0 or carried, step
    assert any(r.spec.step < r.trained_step for r in rs if r.trained_step is not None)


def test_without_carry_unfinished_trajectories_are_cancelled_cleanly():
    plan, runner, log = roll(carry=False)
    rs = results(log)
    assert runner.running == 0  # every cancelled turn left its engine
    cancelled = [r for r in rs if r.status == "cancelled"]
    assert cancelled and all(r.trained_step is None for r in cancelled)
    assert "carry false" in cancelled[0].error
    # each step started its own groups (none carried in), and trained only what it started,
    # but for groups whole at the same instant as the batch
    assert Counter(r.spec.step for r in rs) == {s: plan.groups * G for s in range(STEPS)}
    unfinished = [r for r in cancelled if len(r.turns) < len(r.spec.turns)]
    assert unfinished
    for r in unfinished:  # cut as its step ended, having sent no turn after
        step_end = max(x.end_s for x in rs if x.trained_step == r.spec.step)
        assert runner.started[r.spec.traj_id] <= step_end
        assert r.end_s == pytest.approx(step_end)


def test_a_carried_group_past_the_bound_is_dropped_as_stale():
    _, runner, log = roll(max_staleness=0)
    rs = results(log)
    stale = [r for r in rs if r.status == "stale"]
    assert stale and all(r.trained_step is None and "max_staleness" in r.error for r in stale)
    assert all(r.trained_step == r.policy_version for r in rs if r.trained_step is not None)
    assert runner.running == 0


def test_a_resume_without_the_journal_s_state_is_refused():
    cfg = PipelineConfig.model_validate({"name": "t", "partial_rollout": {}})
    with pytest.raises(ValueError, match="resumes from the state its journal kept"):
        run_virtual(run_partial(Workload.from_config(cfg.workload, 0), cfg.workload, DecodeTimed(), lambda: 0.0,
                                Hooks(print, skip={"s0-p0-g0"}), partial=PartialPlan.of(cfg)))


def killed_at(k: int, overlap=False, seed=2):
    """A partial rollout whose journal committed k times (every 5 s, as metrics/journal.py's
    timer does: what was reported since, with the run's state), then died; resumed from its last
    commit. The committed results, the resumed session's, and the state it went on from."""
    partial = {"over_sample": 0.5, "carry": True, "overlap": overlap}
    cfg = PipelineConfig.model_validate({"name": "t", "partial_rollout": partial, "workload": {
        "family": "coding-agent", "prompts": B, "group_size": G, "steps": STEPS, "max_turns": 12}})
    plan, reported, committed, saved = PartialPlan.of(cfg), [], [], []
    point = Checkpoint()

    def session(on_done, checkpoint, skip=frozenset(), commits=0):
        async def main():
            loop = asyncio.get_running_loop()

            async def journal():
                for _ in range(commits):
                    await asyncio.sleep(5.0)
                    state = checkpoint.current()
                    assert state is not None  # between reports: never inside a group's
                    committed.extend(reported)
                    reported.clear()
                    saved[:] = [json.loads(json.dumps(state))]

            async def update():  # a commit may fall between a step's batch and the next step
                await asyncio.sleep(3.0)

            timer = asyncio.create_task(journal())
            await run_partial(Workload.from_config(cfg.workload, seed), cfg.workload, DecodeTimed(),
                              lambda: loop.time(), Hooks(on_done, update_weights=update, skip=skip), partial=plan,
                              checkpoint=checkpoint)
            timer.cancel()
        run_virtual(main())

    session(reported.append, point, commits=k)
    resumed: list = []
    session(resumed.append, Checkpoint(saved=saved[0]), skip=frozenset(r.spec.traj_id for r in committed))
    return committed, resumed, saved[0]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("k", [1, 9, 20, 33, 43, 45])  # of ~50 commits; 43 falls between a batch and an update
def test_a_resumed_partial_rollout_reports_each_trajectory_once_and_trains_each_step_s_batch(k, overlap):
    committed, resumed, state = killed_at(k, overlap)
    rs = committed + resumed
    ids = [r.spec.traj_id for r in rs]
    assert len(ids) == len(set(ids)), "a trajectory reported twice"
    # every group started and unreported when the state was kept is played again, all its members
    pending = {t for _, _, members in state["groups"] for t in members}
    assert pending and pending <= {r.spec.traj_id for r in resumed}
    assert {r.status for r in rs} <= {"completed", "cancelled", "stale"}
    trained = defaultdict(lambda: defaultdict(list))  # step -> group -> members trained in it
    for r in rs:
        if r.trained_step is not None:
            trained[r.trained_step][(r.spec.step, r.spec.prompt_index)].append(r)
    assert sorted(trained) == list(range(STEPS))
    for step, groups in trained.items():
        # each step's batch: B groups, every one whole (all G members trained in it)
        assert len(groups) == B and all(len(m) == G for m in groups.values()), (step, groups.keys())
    assert len(resumed) > 0


def test_a_replayed_trace_plays_no_trajectory_twice_at_once(tmp_path):
    """A step's groups come from its own slots (step x groups of them), however many it carried."""
    trace = tmp_path / "t.jsonl"
    lines = []
    for j in range(64):
        n = 1 + (j * 7) % 9
        lines += [f'{{"traj": "t{j}", "turn": {k}, "appended_tokens": 50, "decode_tokens": {40 + 60 * ((j + k) % 5)}, '
                  f'"tool_latency_s": {0.0 if k == n - 1 else 0.5}, "done": {str(k == n - 1).lower()}}}' for k in range(n)]
    trace.write_text("\n".join(lines) + "\n")
    cfg = PipelineConfig.model_validate({"name": "t", "partial_rollout": {"over_sample": 0.5},
                                         "workload": {"trace": str(trace), "prompts": 4, "group_size": 2, "steps": 4}})
    wl = Workload.from_config(cfg.workload, 0)
    seen: list = []

    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await run_partial(wl, cfg.workload, DecodeTimed(), lambda: loop.time() - t0, Hooks(seen.append),
                          partial=PartialPlan.of(cfg))

    run_virtual(main())
    assert len({r.spec.seed for r in seen}) == len(seen)  # a repeat would share its original's seed


def test_with_overlap_the_next_step_starts_as_this_step_s_groups_become_whole():
    """Each group that becomes whole is replaced at once by one of the next step's, started under
    this step's version: every step still trains B whole groups, each trajectory is reported once
    within the staleness bound, nothing of a step past the last is started, and the run ends
    sooner than with the next step's groups held back to its start."""
    updates: list[float] = []
    plan, runner, log = roll(overlap=True, updates=updates)
    rs = results(log)
    trained = [r for r in rs if r.trained_step is not None]
    assert Counter(r.trained_step for r in trained) == {s: B * G for s in range(STEPS)}
    assert len({r.spec.traj_id for r in rs}) == len(rs) and runner.running == 0
    assert max(r.spec.step for r in rs) == STEPS - 1
    early = [r for r in trained if r.spec.step > 0 and r.start_s < updates[r.spec.step - 1]]
    assert early, "no group of a step started before the update that opens it"
    assert all(r.policy_version == r.spec.step - 1 for r in early)  # under the step before's version
    assert all(r.trained_step - r.policy_version <= 1 for r in trained)
    assert all(r.status in ("cancelled", "stale") for r in rs if r.trained_step is None)
    held = results(roll(updates=[])[2])
    assert max(r.end_s for r in rs) < max(r.end_s for r in held)


def test_overlap_needs_carry():
    with pytest.raises(ValueError, match="overlap .* carry: true"):
        PipelineConfig.model_validate({"name": "t", "partial_rollout": {"carry": False, "overlap": True}})
