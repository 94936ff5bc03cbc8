"""The adaptive policies (`reactive`, `prorsa`) driven by synthetic snapshots.

`stream` plays an agentic workload as lifecycle events (seeded, so every run sees the same
trace); `drive` hands them to a policy one control interval at a time and carries out its
decisions at once, the way a body would.
"""

from __future__ import annotations

import heapq
import subprocess
import sys

import numpy as np
import pytest

from prorsa.control.adaptive import Prorsa, Reactive, Requests
from prorsa.control.lifecycle import LifecycleEvent as E
from prorsa.control.lifecycle import Phase
from prorsa.control.policy import Decision, Snapshot, WorkloadHint, make_policy
from prorsa.loads import EngineLoad
from prorsa.roles import Role

P, D, M = Role.PREFILL, Role.DECODE, Role.MIXED


def stream(n_traj: int, t_end: float, seed: int = 0, rate: float = 60.0, prompt: int = 1000,
           obs: int = 300, dec: int = 300, tool_s: float = 1.0, turns: float = 6.0) -> list[E]:
    """`n_traj` trajectories in flight at all times (a finished one is replaced: asynchronous
    RL); lognormal decode, observation, tool latency and turn count around the given medians."""
    rng = np.random.default_rng(seed)
    heap: list = []
    out: list[E] = []
    count = 0

    def start(t: float) -> None:
        nonlocal count
        n = max(1, int(rng.lognormal(np.log(turns), 0.5)))
        heapq.heappush(heap, (t, count, f"t{count}", 0, n, 0, prompt))
        count += 1

    for _ in range(n_traj):
        start(float(rng.random() * 2.0))
    while heap:
        t, _, tid, k, n, ctx, app = heapq.heappop(heap)
        if t > t_end:
            break
        d = max(1, int(rng.lognormal(np.log(dec), 0.6)))
        end = t + 0.05 + d / rate
        out += [E(t, tid, "swe", k, Phase.QUEUED, app, ctx),
                E(t + 0.02, tid, "swe", k, Phase.PREFILL, app, ctx),
                E(t + 0.05, tid, "swe", k, Phase.DECODE, 0, ctx)]
        if k + 1 >= n:
            out.append(E(end, tid, "swe", k, Phase.DONE, d, ctx))
            start(end)
            continue
        out.append(E(end, tid, "swe", k, Phase.TOOL, d, ctx))
        back = end + float(rng.lognormal(np.log(tool_s), 0.5))
        heapq.heappush(heap, (back, count, tid, k + 1, n, ctx + app + d,
                              max(1, int(rng.lognormal(np.log(obs), 0.5)))))
        count += 1
    return sorted((e for e in out if e.time_s <= t_end), key=lambda e: e.time_s)


def drive(policy, events: list[E], n_engines: int = 8, t_end: float = 60.0,
          carry_out: bool = True, finished: tuple = ()) -> list[tuple[float, Decision]]:
    roles = {f"e{i}": r for i, r in enumerate(policy.initial_roles(n_engines))}
    out, j, t = [], 0, 1.0
    while t <= t_end + 1e-9:
        batch = []
        while j < len(events) and events[j].time_s <= t:
            batch.append(events[j])
            j += 1
        engines = tuple(EngineLoad(e, r, 0, 2, 20000, 700000) for e, r in roles.items())
        d = policy.decide(Snapshot(time_s=t, engines=engines, events=tuple(batch), finished=finished))
        if carry_out:
            roles.update(d.targets)
        out.append((t, d))
        t += 1.0
    return out


STEADY = dict(n_traj=128, t_end=60.0, obs=1500)  # fits the engines: settles with no switch
HEAVY = dict(n_traj=512, t_end=60.0, prompt=8000, turns=2.0, obs=4000)  # long appends, overload


def test_policies_load_without_importing_adaptive_first():
    code = ("from prorsa.control.policy import make_policy\n"
            "p = make_policy('prorsa'); r = make_policy('reactive:2000')\n"
            "print(p.name, r.name, len(p.initial_roles(4)), r.initial_roles(4)[0].value)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["prorsa", "reactive:2000", "4", "prefill"]


@pytest.mark.parametrize("spec", ["prorsa:0", "prorsa:4:2:1:0", "prorsa:x", "prorsa:1:2:3:4:0.1:6",
                                  "reactive:-1", "reactive:100:1.5", "reactive:1:0.5:1:0.5:9"])
def test_bad_adaptive_specs(spec):
    with pytest.raises(ValueError, match="bad policy"):
        make_policy(spec)


def test_prorsa_starts_mixed_and_reports_its_forecast():
    p = make_policy("prorsa:2")
    assert p.initial_roles(3) == [M] * 3 and p.name == "prorsa:2"
    engines = tuple(EngineLoad(f"e{i}", M, 0, 0, 0, 1) for i in range(3))
    d = p.decide(Snapshot(time_s=0.0, engines=engines))
    assert d.targets == {} and d.forecast.live == 0 and d.forecast.goal_mixed == 3
    assert d.forecast_error == {}


@pytest.mark.parametrize("load", [STEADY, HEAVY], ids=["steady", "heavy"])
def test_no_flapping_once_settled(load):
    res = drive(make_policy("prorsa"), stream(**load))
    late = [t for t, d in res if d.targets and t > 20]
    assert len(late) <= 1, [(t, d.reason) for t, d in res if d.targets]
    switches = sum(len(d.targets) for _, d in res)
    if load is HEAVY:  # it did have something to do: long appends under overload
        assert switches >= 2
    else:  # all-mixed fits this load; one early move at most
        assert switches <= 1


def test_forecast_error_is_reported():
    res = drive(make_policy("prorsa"), stream(**STEADY))
    err = res[-1][1].forecast_error
    assert "prefill_tps@0-0.5s" in err and "decode_seqs@3.5-4s" in err
    assert all(np.isfinite(v) and v >= 0 for v in err.values())
    assert err["decode_seqs@0-0.5s"] < 0.3  # the next half second is well known


def test_decisions_are_deterministic():
    events = stream(**HEAVY)
    a = drive(make_policy("prorsa"), events, t_end=20)
    b = drive(make_policy("prorsa"), events, t_end=20)
    assert [(t, d.targets, d.reason, d.forecast) for t, d in a] == \
           [(t, d.targets, d.reason, d.forecast) for t, d in b]


def goal(d: Decision) -> tuple[float, float, float]:
    return d.forecast.goal_prefill, d.forecast.goal_decode, d.forecast.goal_mixed


def test_a_new_goal_needs_votes_and_is_not_requested_twice():
    events = stream(**HEAVY)
    two = drive(make_policy("prorsa:4:2:1:2"), events, t_end=15, carry_out=False)
    one = drive(make_policy("prorsa:4:2:1:1"), events, t_end=15, carry_out=False)
    first_one = next(i for i, (_, d) in enumerate(one) if d.targets)
    first_two = next(i for i, (_, d) in enumerate(two) if d.targets)
    assert first_two > first_one
    for i, (_, d) in enumerate(two):
        if d.targets:  # the previous plan voted for this goal, or this goal was already moving
            prev = two[i - 1][1]
            assert goal(prev) == goal(d) and (prev.reason.startswith("vote 1/2") or prev.targets)
    # The body never carried the switches out: each engine is asked once (the request stands).
    asked = [e for _, d in two for e in d.targets]
    assert len(asked) == len(set(asked)) >= 2


def test_a_request_the_body_is_still_carrying_out_does_not_time_out():
    """A mixed engine turning prefill drains its decodes first and reports mixed meanwhile, for
    longer than a lost request is waited for: planned as mixed, the split on the way to the goal
    priced as a bad one and the move was undone."""
    req = Requests(timeout_s=30.0)
    req.ask({"e0": P}, 0.0)
    loads = (EngineLoad("e0", M), EngineLoad("e1", D))

    def planned(t: float, heading: dict) -> list[Role]:
        return [e.role for e in req.engines(Snapshot(time_s=t, engines=loads, heading=heading))]

    assert planned(100.0, {"e0": P}) == [P, D]  # still draining, 100 s on
    assert planned(101.0, {}) == [M, D]  # the body gave it up: past the timeout, as observed
    assert planned(102.0, {"e1": M}) == [M, M]  # a switch under way that no request stands for
    req.ask({"e1": P}, 103.0)
    assert planned(104.0, {"e1": M}) == [M, P]  # the latest request wins over the switch under way


# -- reactive ---------------------------------------------------------------------------------

def snap(t: float, roles, queue: int = 0, kv: float = 0.0, active=None) -> Snapshot:
    active = active or [1] * len(roles)
    return Snapshot(time_s=t, engines=tuple(
        EngineLoad(f"e{i}", r, 0, active[i], int(kv * 1000), 1000,
                       queued_prefill_tokens=queue if r.serves_prefill else 0)
        for i, r in enumerate(roles)))


def test_reactive_moves_one_engine_and_respects_the_cooldown():
    r = make_policy("reactive:4096:0.8:5")
    roles = r.initial_roles(6)
    assert roles == [P] * 3 + [D] * 3
    d = r.decide(snap(1.0, roles, queue=10000, kv=0.3, active=[1, 1, 1, 4, 0, 2]))
    assert d.targets == {"e4": P}  # the idlest decode engine
    roles[4] = P
    assert r.decide(snap(3.0, roles, queue=10000, kv=0.3)).targets == {}  # cooldown
    assert r.decide(snap(6.5, roles, queue=100, kv=0.5)).targets == {}  # nothing pressing
    d = r.decide(snap(7.0, roles, queue=100, kv=0.95))
    assert list(d.targets.values()) == [D] and list(d.targets)[0] in {"e0", "e1", "e2", "e4"}


def test_reactive_keeps_a_role_alive_and_holds_when_both_press():
    r = make_policy("reactive:1000:0.8:0")
    roles = [P, D]
    assert r.decide(snap(1.0, roles, queue=5000, kv=0.1)).targets == {}  # the last decode engine
    assert r.decide(snap(2.0, [P, D, D], queue=5000, kv=0.9)).targets == {}  # both pressed
    assert r.decide(snap(3.0, [P, D, D], queue=5000, kv=0.1)).targets == {"e1": P}
    # The request stands until seen: the same engine is not asked for twice.
    assert r.decide(snap(4.0, [P, D, D], queue=5000, kv=0.1)).targets == {}


def test_the_opening_split_follows_the_prior_not_a_told_split():
    """Without a prior, and no simulator lent to rehearse the plausible workloads, prorsa opens all
    mixed, on a dense model and on an MoE under DP attention alike. With a prior (an earlier run's means) it opens with the
    split the cost model scores best for that workload's steady state: mixed for a dense model
    with small appends, dedicated roles for long SWE contexts on an MoE under DP attention."""
    from dataclasses import replace

    from prorsa.control.policy import PolicyContext, WorkloadHint
    from prorsa.costmodel import CostModel

    swe = WorkloadHint(concurrency=256, prompt_tokens=1750, observation_tokens=1560, decode_tokens=465,
                       tool_s=0.9, turns=10.7)
    small = WorkloadHint(concurrency=64, prompt_tokens=300, observation_tokens=100, decode_tokens=200,
                         tool_s=0.5, turns=4)
    dense = PolicyContext.default()
    moe_cost = CostModel.from_names("h200", "qwen3-30b-a3b", ep=4)
    moe = PolicyContext(cost=moe_cost, slots=128, kv_capacity_tokens=moe_cost.kv_capacity_tokens() * 4, interval_s=1.0)
    assert make_policy("prorsa", dense).initial_roles(8) == [M] * 8  # no prior
    assert make_policy("prorsa", moe).initial_roles(8) == [M] * 8  # no prior, no simulator
    assert make_policy("prorsa", replace(dense, prior=small)).initial_roles(8) == [M] * 8
    opening = make_policy("prorsa", replace(moe, prior=swe)).initial_roles(8)
    assert Role.PREFILL in opening and len(opening) == 8


def test_of_splits_the_steady_state_scores_alike_prorsa_opens_with_the_most_mixed():
    """On SWE under DP attention one prefill engine absorbs the steady appends, so every P1 split
    scores alike whatever the rest are: the opening keeps the rest mixed, free to take the
    prompts' burst."""
    from prorsa.control.opening import steady_forecast
    from prorsa.control.allocator import score, splits
    from prorsa.control.policy import PolicyContext, WorkloadHint
    from prorsa.costmodel import CostModel

    # the means of benchmarks/paper.py's SWE MoE sync cell, where argmin's rounding chose D2 M5
    swe = WorkloadHint(concurrency=256, prompt_tokens=1753.0, observation_tokens=1558.9048387096775,
                       decode_tokens=465.390350877193, tool_s=0.909562328648394, turns=10.6875)
    moe_cost = CostModel.from_names("h200", "qwen3-30b-a3b", ep=4)
    moe = PolicyContext(cost=moe_cost, slots=128, kv_capacity_tokens=moe_cost.kv_capacity_tokens() * 4,
                        interval_s=1.0, prior=swe)
    p = make_policy("prorsa", moe)
    steady = steady_forecast(swe, p.capacity, 8, p.forecaster.n_bins, p.forecaster.bin_s)
    cands = splits(8)
    costs = score(p.capacity, steady, *cands.T)
    tied = cands[costs <= costs.min() * (1 + 1e-3)]
    assert len(tied) == 8 and (tied[:, 0] == 1).all()  # the tie this rule is for: P1 Dk M(7-k)
    assert p.initial_roles(8) == [P] + [M] * 7


def _swe_moe_context(**kw):
    from prorsa.control.policy import PolicyContext
    from prorsa.costmodel import CostModel

    moe_cost = CostModel.from_names("h200", "qwen3-30b-a3b", ep=4)
    return PolicyContext(cost=moe_cost, slots=128, kv_capacity_tokens=moe_cost.kv_capacity_tokens() * 4,
                         interval_s=1.0, concurrency=256, **kw)


def _trajectory_events(n: int, turns: int, prompt: int, obs: int, dec: int, tool_s: float):
    """n trajectories of `turns` turns each, as a body reports them, one after another."""
    from prorsa.control.lifecycle import LifecycleEvent as Ev
    from prorsa.control.lifecycle import Phase

    t, out = 0.0, []
    for i in range(n):
        tid = f"s0-p{i}-g0"
        for k in range(turns):
            out.append(Ev(t, tid, "swe", k, Phase.QUEUED, prompt if k == 0 else obs))
            out.append(Ev(t + 0.1, tid, "swe", k, Phase.DECODE, 0))
            last = k == turns - 1
            out.append(Ev(t + 1.0, tid, "swe", k, Phase.DONE if last else Phase.TOOL, dec))
            t += 1.0 + (0 if last else tool_s)
    return out


def test_prorsa_learns_the_workload_from_what_it_observes_and_opens_the_next_step_on_it():
    """No prior: the first step opens on no workload's means; between steps the policy's means are the ones
    the trajectories showed (not a sample of the run's future), and the next step opens on the
    split they score best, moving the fewest engines."""
    from prorsa.control.policy import Snapshot

    p = make_policy("prorsa", _swe_moe_context())
    assert p.initial_roles(8) == [M] * 8 and "no prior" in p.opening_reason
    assert p.learned() is None  # nothing ended yet: no means, and no prior to fall back on
    events = _trajectory_events(16, turns=11, prompt=1750, obs=1560, dec=465, tool_s=0.9)
    snap = Snapshot(200.0, tuple(eng(f"e{i}", M) for i in range(8)), events=tuple(events))
    d = p.between_steps(snap)
    hint = p.learned()
    assert (hint.prompt_tokens, hint.observation_tokens, hint.decode_tokens, hint.turns) == (1750, 1560, 465, 11)
    assert hint.tool_s == pytest.approx(0.9) and hint.concurrency == 256
    assert sorted(d.targets.values()) == [P]  # SWE on an MoE under DP attention: P1 beside mixed
    assert "next step: P1 D0 M7 (steady state)" in d.reason


def test_between_steps_keeps_roles_when_nothing_was_observed():
    from prorsa.control.policy import Snapshot

    p = make_policy("prorsa", _swe_moe_context())
    d = p.between_steps(Snapshot(1.0, tuple(eng(f"e{i}", M) for i in range(8))))
    assert d.targets == {} and "no workload observed" in d.reason


def test_reassign_moves_the_fewest_engines():
    from prorsa.control.adaptive import reassign

    engines = [eng("a", P), eng("b", D), eng("c", D), eng("d", M)]
    assert reassign(engines, (1, 2, 1)) == {}
    assert reassign(engines, (0, 0, 4)) == {"a": M, "b": M, "c": M}
    assert reassign(engines, (2, 1, 1)) == {"c": P}


def eng(engine_id: str, role: Role) -> EngineLoad:
    return EngineLoad(engine_id, role, 0, 0, 0, 700000)


def _spec(i: int):
    from prorsa.agent.trace import TrajectorySpec, TurnSpec

    return TrajectorySpec(f"t{i}", "swe", i, 0, 0, (TurnSpec(100, 10, 0.5, False), TurnSpec(50, 10, 0.0, True)), seed=i)


def test_prorsa_rehearses_the_prior_run_and_holds_the_split_that_ends_it_soonest():
    """With a simulator lent (PolicyContext.rehearse) and an earlier run's trajectories, the
    opening is the candidate whose replay ends soonest, and no interval's fluid plan undoes it."""
    from dataclasses import replace

    asked = []

    def rehearse(specs, split):
        asked.append((len(specs), split))
        return {(2, 6, 0): 90.0, (0, 0, 8): 100.0}.get(split, 120.0)

    ctx = replace(_swe_moe_context(), concurrency=6, rehearse=rehearse,
                  prior_trajectories=tuple(_spec(i) for i in range(4)))
    p = make_policy("prorsa", ctx)
    assert p.initial_roles(8) == [P, P] + [D] * 6
    assert {n for n, _ in asked} == {6}  # the 4 earlier trajectories filled to the 6 in flight
    splits = [s for _, s in asked]
    assert (0, 0, 8) in splits and (1, 7, 0) in splits and (7, 0, 1) in splits and len(splits) == len(set(splits))
    held = p.decide(Snapshot(1.0, tuple(eng(f"e{i}", r) for i, r in enumerate([P, P] + [D] * 6))))
    assert held.targets == {} and "hold P2 D6 M0" in held.reason


def test_a_rehearsed_lead_within_one_percent_keeps_all_mixed():
    from dataclasses import replace

    ctx = replace(_swe_moe_context(), rehearse=lambda specs, split: 99.5 if split == (1, 7, 0) else 100.0,
                  prior_trajectories=(_spec(0),))
    assert make_policy("prorsa", ctx).initial_roles(8) == [M] * 8


def test_between_steps_rehearses_the_step_that_just_ran():
    from dataclasses import replace

    seen = []

    def rehearse(specs, split):
        seen.append(tuple(s.traj_id for s in specs))
        return 80.0 if split == (1, 0, 7) else 100.0

    p = make_policy("prorsa", replace(_swe_moe_context(), rehearse=rehearse))
    assert p.initial_roles(8) == [P] + [M] * 7  # no prior: the plausible families rehearsed
    seen.clear()
    finished = tuple(_spec(i) for i in range(3))
    d = p.between_steps(Snapshot(50.0, tuple(eng(f"e{i}", M) for i in range(8)), finished=finished))
    assert ("t0", "t1", "t2") in seen  # the step as it ran; the rest are its resamples
    assert all(t.startswith(("t0~", "t1~", "t2~")) for ids in seen if ids != ("t0", "t1", "t2") for t in ids)
    assert list(d.targets.values()) == [P] and "rehearsed on 3 trajectories" in d.reason


def test_between_steps_the_finalists_are_ranked_over_resamples_of_the_step():
    """The step as it ran favours 2:6 by 2% (inside FINALIST_BAND, beyond REHEARSAL_GAIN); its
    three resamples favour all mixed by 10%: the mean over the four keeps all mixed. Splits
    outside the band are not rehearsed again."""
    from dataclasses import replace

    asked = []

    def rehearse(specs, split):
        resample = "~" in specs[0].traj_id
        asked.append((resample, split))
        if split == (2, 6, 0):
            return 110.0 if resample else 98.0
        return 100.0 if split == (0, 0, 8) else 200.0

    p = make_policy("prorsa", replace(_swe_moe_context(), rehearse=rehearse))
    p.initial_roles(8)
    finished = tuple(_spec(i) for i in range(6))
    d = p.between_steps(Snapshot(50.0, tuple(eng(f"e{i}", M) for i in range(8)), finished=finished))
    assert "next step: P0 D0 M8" in d.reason
    assert sorted({s for again, s in asked if again}) == [(0, 0, 8), (2, 6, 0)]
    assert sum(again for again, _ in asked) == 2 * 3
    # one draw only (the step itself wins everywhere): 2:6 is taken as before
    rehearse_one = lambda specs, split: 98.0 if split == (2, 6, 0) else (100.0 if split == (0, 0, 8) else 200.0)  # noqa: E731
    p = make_policy("prorsa", replace(_swe_moe_context(), rehearse=rehearse_one))
    p.initial_roles(8)
    d = p.between_steps(Snapshot(50.0, tuple(eng(f"e{i}", M) for i in range(8)), finished=finished))
    assert "next step: P2 D6 M0" in d.reason


def test_a_resample_draws_whole_groups_with_replacement_as_prompts_of_their_own():
    from dataclasses import replace

    from prorsa.control.replayed import resampled

    step = [replace(_spec(4 * g + k), prompt_index=g) for g in range(5) for k in range(4)]
    for r in range(3):
        out = resampled(step, r)
        assert len(out) == len(step)
        by_prompt: dict = {}
        for s in out:
            by_prompt.setdefault(s.prompt_index, []).append(s)
        assert sorted(by_prompt) == list(range(5))
        sources = [tuple(s.traj_id.split("~")[0] for s in g) for g in by_prompt.values()]
        assert all(src in {tuple(f"t{4 * g + k}" for k in range(4)) for g in range(5)} for src in sources)
        assert len({s.seed for s in out}) == len(out) and len({s.traj_id for s in out}) == len(out)
    draws = [tuple(s.traj_id.split("~")[0] for s in resampled(step, r)) for r in range(3)]
    assert len(set(draws)) == 3 and resampled(step, 0) == resampled(step, 0)
    assert resampled([], 0) == []


# HEAVY's means, declared: a run told them opens on their steady state, not held, and the fluid
# model moves from there (told nothing, a run lent the simulator holds its rehearsed opening)
HEAVY_MEANS = WorkloadHint(32, prompt_tokens=8000, observation_tokens=4000, decode_tokens=300, tool_s=1.0, turns=2.0)


def _declared(rehearse=None):
    """prorsa told HEAVY's means, with one vote: a goal the fluid model keeps wanting is asked for
    every interval."""
    from dataclasses import replace

    from prorsa.control.policy import PolicyContext

    ctx = replace(PolicyContext.default(), rehearse=rehearse, concurrency=32, prior=HEAVY_MEANS)
    return make_policy("prorsa:4:2:1:1", ctx)


def _replaying(goal_faster: bool, asked: list):
    """prorsa with a simulator lent whose replay favours any split other than all mixed, or all mixed."""
    def rehearse(specs, split):
        asked.append((tuple(s.traj_id for s in specs), split))
        return 90.0 if (split != (0, 0, 8)) == goal_faster else 100.0

    return _declared(rehearse)


def test_a_fluid_move_is_made_only_when_its_replay_ends_sooner():
    """Under overload the fluid model wants prefill engines (test_no_flapping_once_settled); with
    a simulator lent, each new goal is first replayed on the last `concurrency` trajectories to
    complete, against the current split, and made only if the replay ends sooner under it."""
    events, done = stream(**HEAVY), tuple(_spec(i) for i in range(40))
    free = drive(_declared(), events, t_end=20)
    asked: list = []
    agreed = drive(_replaying(True, asked), events, t_end=20, finished=done)
    assert [d.targets for _, d in agreed] == [d.targets for _, d in free]  # the replay agreed each time
    assert asked and {ids for ids, _ in asked} == {tuple(f"t{i}" for i in range(8, 40))}  # the last 32

    asked.clear()
    refused = drive(_replaying(False, asked), events, t_end=20, finished=done)
    assert all(not d.targets for _, d in refused)
    why = next(d.reason for _, d in refused if "refused" in d.reason)
    assert "refused: the last 32 trajectories replayed end in 100.0 s under it, 90.0 s as now" in why
    # a refused goal is not replayed again until another quarter of `concurrency` has completed
    named = [d.reason[:d.reason.index(" refused: the last")] for _, d in refused if " refused: the last" in d.reason]
    assert len(named) >= 2 and len(named) == len(set(named)), named
    assert any("refused by its replay, too few completed since" in d.reason for _, d in refused)


def test_a_fluid_move_is_refused_where_the_best_split_replays_sooner_still():
    """The goal is the split cheapest to reach, the fluid model's best may be another: a goal
    that beats the current split in the replay is still refused where the best beats it by more
    than REHEARSAL_GAIN (1%), and the refusal names the best and both times."""
    from dataclasses import replace

    from prorsa.control.policy import PolicyContext

    now, goal, best = (0, 0, 8), (0, 7, 1), (2, 0, 6)
    done = tuple(_spec(i) for i in range(40))

    def replayed(prices: dict, fluid_best: tuple = best) -> str:
        ctx = replace(PolicyContext.default(), rehearse=lambda specs, split: prices[split], concurrency=32)
        return make_policy("prorsa:4:2:1:1", ctx).veto(now, goal, fluid_best, done)

    why = replayed({now: 57.0, goal: 53.7, best: 51.6})
    assert why == "P0 D7 M1 refused: the last 32 trajectories replayed end in 53.7 s under it, 51.6 s under P2 D0 M6: "
    assert replayed({now: 57.0, goal: 53.7, best: 53.2}) == ""  # the best ahead by under 1%: move
    assert replayed({now: 57.0, goal: 56.8, best: 51.6}).endswith("56.8 s under it, 57.0 s as now: ")
    assert replayed({now: 57.0, goal: 53.7}, fluid_best=goal) == ""  # the goal is the best


def test_with_too_little_to_replay_the_fluid_model_decides_alone():
    """At a run's opening nothing has completed, and the moves made then (engines still empty,
    nothing to drain) are most of an MoE run's gain: they are not held back for a replay."""
    asked: list = []
    events = stream(**HEAVY)
    res = drive(_replaying(False, asked), events, t_end=20, finished=tuple(_spec(i) for i in range(15)))
    assert not asked
    assert [d.targets for _, d in res] == [d.targets for _, d in drive(_declared(), events, t_end=20)]
    assert any(d.targets for _, d in res)


def _held_on(prior):
    """prorsa holding P2 D6, rehearsed on an earlier run whose means were `prior`."""
    from dataclasses import replace

    # the earlier run's replay favours P2 D6; the plausible families' draws (ids a0, a1, ...) no split
    ctx = replace(_swe_moe_context(), concurrency=16, prior=prior, prior_trajectories=(_spec(0),),
                  rehearse=lambda specs, split, told=True: 90.0 if split == (2, 6, 0) and specs[0].traj_id[0] != "a"
                  else 100.0)
    p = make_policy("prorsa", ctx)
    assert p.initial_roles(8) == [P, P] + [D] * 6
    return p


def _decide_on(p, events):
    return p.decide(Snapshot(30.0, tuple(eng(f"e{i}", r) for i, r in enumerate([P, P] + [D] * 6)),
                             events=tuple(events)))


def test_a_prior_the_run_contradicts_is_dropped():
    """An earlier run of another family: its rehearsed split is held only until 16 prompts show
    appends more than twice as long (or short) as the prior's; then the fluid model plans."""
    from prorsa.control.policy import WorkloadHint

    prior = WorkloadHint(16, prompt_tokens=434, observation_tokens=306, decode_tokens=2045, tool_s=0.5, turns=5.6)
    p = _held_on(prior)
    few = _trajectory_events(15, turns=1, prompt=2170, obs=0, dec=2000, tool_s=0.0)
    assert _decide_on(p, few).reason.startswith("hold P2 D6 M0")  # 15 prompts: not yet
    more = [e for e in _trajectory_events(16, turns=1, prompt=2170, obs=0, dec=2000, tool_s=0.0)
            if e.traj_id == "s0-p15-g0"]
    d = _decide_on(p, more)
    assert d.reason.startswith("prior dropped: prompt_tokens 2170 observed against its 434; ")
    assert p.prior is None and not p._held_on_prior  # and it stays dropped


def test_a_prior_dropped_on_tool_time_reopens_the_run_as_with_no_prior():
    """A terminal run's prior on a SWE-like run: prompts, appends and decodes alike, tool calls of
    22 s against 0.3 s. Once most calls started have ended it is dropped, and the engines go where
    a run told nothing opens (the plausible families rehearsed: all mixed here), at once."""
    from prorsa.control.policy import WorkloadHint

    prior = WorkloadHint(16, prompt_tokens=2000, observation_tokens=1000, decode_tokens=480, tool_s=22.0, turns=3)
    p = _held_on(prior)
    d = _decide_on(p, _trajectory_events(20, turns=3, prompt=2000, obs=1000, dec=480, tool_s=0.3))
    assert d.reason.startswith("prior dropped: tool_s 0.3 observed against its 22; reopen as with no prior: P0 D0 M8")
    assert sorted(r.value for r in d.targets.values()) == ["mixed"] * 8
    assert p.prior is None


def test_decodes_shorter_than_the_prior_do_not_drop_it():
    """The first decodes to end are the short ones: a decode mean below the prior's is no evidence
    against it; one more than twice as long is."""
    from prorsa.control.policy import WorkloadHint

    prior = WorkloadHint(16, prompt_tokens=2000, observation_tokens=1500, decode_tokens=500, tool_s=1.0, turns=11)
    short = _trajectory_events(20, turns=1, prompt=2000, obs=0, dec=100, tool_s=0.0)
    assert _decide_on(_held_on(prior), short).reason.startswith("hold P2 D6 M0")
    long = _trajectory_events(20, turns=1, prompt=2000, obs=0, dec=1100, tool_s=0.0)
    assert _decide_on(_held_on(prior), long).reason.startswith("prior dropped: decode_tokens 1100 observed against its 500")


def test_prompts_in_hand_at_the_opening_drop_a_prior_they_contradict():
    """The batch a run opens with is counted before any prefill: 16 prompts or more whose mean is
    more than twice the prior's, or under half of it, say the prior is not this run's."""
    from prorsa.control.prior_check import opening_contradiction
    from prorsa.control.policy import WorkloadHint

    prior = WorkloadHint(16, prompt_tokens=477, observation_tokens=306, decode_tokens=2045, tool_s=0.5, turns=5.6)
    assert opening_contradiction(prior, [2208] * 16) == "prior dropped: prompt_tokens 2208 observed against its 477; "
    assert opening_contradiction(prior, [2208] * 15) == ""  # too few to hold against it
    assert opening_contradiction(prior, [954] * 16) == ""  # twice: still the prior's
    assert opening_contradiction(prior, [955] * 16).startswith("prior dropped: prompt_tokens 955 ")
    assert opening_contradiction(prior, [238] * 16).startswith("prior dropped: prompt_tokens 238 ")
    assert opening_contradiction(prior, [239] * 16) == ""
    # the mean of the batch, not its largest prompts
    assert opening_contradiction(prior, [100] * 8 + [1800] * 8) == ""  # mean 950


@pytest.mark.parametrize("ep,updates,lent,rehearsed", [(1, False, True, True), (4, False, True, True),
                                                       (1, True, True, True), (4, False, False, False)])
def test_with_nothing_known_the_opening_is_rehearsed_wherever_the_simulator_is_lent(ep, updates, lent, rehearsed):
    """No prior: the plausible families are rehearsed (and the least worst-case regret held) on
    any engines, of one DP-attention rank or several, with weight updates declared or not, where
    the simulator is lent; else all mixed, nothing rehearsed."""
    from dataclasses import replace

    from prorsa.control.policy import PolicyContext, WeightUpdates
    from prorsa.costmodel import CostModel

    asked = []

    def rehearse(specs, split):  # P1 beside mixed 10% ahead on every family but math-tir, 5% behind there
        asked.append(split)
        if specs[0].family == "math-tir":
            return {(0, 0, 8): 100.0, (1, 0, 7): 105.0}.get(split, 120.0)
        return 90.0 if split == (1, 0, 7) else 100.0

    cost = CostModel.from_names("h200", "qwen3-30b-a3b", ep=ep)
    ctx = PolicyContext(cost=cost, slots=128, kv_capacity_tokens=cost.kv_capacity_tokens() * ep, interval_s=1.0,
                        concurrency=16, asynchronous=updates, rehearse=rehearse if lent else None,
                        updates=WeightUpdates(every_s=30.0) if updates else None)
    p = make_policy("prorsa", ctx)
    roles = p.initial_roles(8)
    if not rehearsed:
        assert roles == [M] * 8 and not asked
        return
    assert roles == [P] + [M] * 7 and len(asked) == 5 * 15  # every plausible family, every split
    assert "least worst-case regret (5.0%)" in p.opening_reason
    assert p.decide(Snapshot(1.0, tuple(eng(f"e{i}", r) for i, r in enumerate(roles)))).reason.startswith("hold P1 D0 M7")
    assert make_policy("prorsa", replace(ctx, max_turns=3)).initial_roles(8) == roles


def test_past_the_most_engines_an_opening_rehearses_a_run_opens_all_mixed():
    """Every split of n engines rehearsed costs ~n^2: past OPENING_MAX_ENGINES nothing is rehearsed."""
    from dataclasses import replace

    from prorsa.control.opener import OPENING_MAX_ENGINES
    from prorsa.control.policy import PolicyContext

    asked = []
    ctx = replace(PolicyContext.default(), concurrency=16, rehearse=lambda specs, split: asked.append(split) or 100.0)
    n = OPENING_MAX_ENGINES + 1
    p = make_policy("prorsa", ctx)
    assert p.initial_roles(n) == [M] * n and not asked
    assert not p.decide(Snapshot(1.0, tuple(eng(f"e{i}", M) for i in range(n)))).reason.startswith("hold")
    make_policy("prorsa", ctx).initial_roles(OPENING_MAX_ENGINES)
    assert asked  # at the bound it rehearses


def test_prefill_engines_beside_mixed_are_undone_without_a_drain():
    """Giving prefill engines back to mixed costs no drain (they hold no decodes), where
    taking mixed engines into prefill later does: the allocator prices the first at nothing."""
    from prorsa.control.allocator import Allocator, Capacity, _Movers
    from prorsa.costmodel import CostModel

    cost = CostModel.from_names("h200", "qwen3-30b-a3b", ep=4)
    cap = Capacity.from_cost(cost, 128)
    roles = [P, P] + [M] * 6
    busy = [EngineLoad(f"e{i}", r, active=0 if r is P else 100, kv_tokens=0 if r is P else 400_000,
                       kv_capacity=700_000) for i, r in enumerate(roles)]
    movers = _Movers(cap, busy, (), 400.0)
    assert movers.slowest((2, 0, 6), (0, 0, 8)) == 0.0  # prefill -> mixed
    assert movers.slowest((2, 0, 6), (0, 2, 6)) < 0.5  # prefill -> decode: the prefill step in flight
    assert movers.slowest((2, 0, 6), (4, 0, 4)) > 10 * movers.slowest((2, 0, 6), (0, 2, 6))  # mixed -> prefill


@pytest.mark.parametrize("prompt,families", [(400, {"search", "math-tir"}), (2000, {"swe", "terminal", "coding-agent"}),
                                             (None, {"swe", "search", "math-tir", "terminal", "coding-agent"})])
def test_with_no_prior_the_prompts_in_hand_narrow_the_families_rehearsed(prompt, families):
    """math-tir's and search's prompts (0.3-0.4k) fit only those two families; SWE's (2k) fit
    terminal and coding agents too; no prompts counted: every family. Each is rehearsed on a draw
    of its own, capped at the pipeline's turns."""
    from dataclasses import replace

    drawn: dict = {}

    def rehearse(specs, split):
        drawn[specs[0].family] = (len(specs), max(len(s.turns) for s in specs))
        return 100.0

    prompts = () if prompt is None else (prompt,) * 32
    p = make_policy("prorsa", replace(_swe_moe_context(), concurrency=32, opening_prompts=prompts, rehearse=rehearse,
                                      max_turns=5))
    assert p.initial_roles(8) == [M] * 8  # every split alike: the most mixed
    assert set(drawn) == families and set(p.opening.considered) == families
    assert all(n == 32 and turns <= 5 for n, turns in drawn.values())
    assert ("prompts in hand fit" if prompt else "no prompts counted") in p.opening_reason


def test_a_dropped_prior_reopens_on_the_opening_rehearsed_as_a_run_told_none():
    """The router of a run told a prior prices moves by it; the opening a dropped prior reopens on
    is rehearsed as a run told none would (told=False), not in the wrong prior's world."""
    from dataclasses import replace

    from prorsa.control.policy import WorkloadHint

    asked = []

    def rehearse(specs, split, told=True):
        asked.append((specs[0].traj_id[0], told))
        return 90.0 if split == (2, 6, 0) and specs[0].traj_id[0] != "a" else 100.0

    prior = WorkloadHint(16, prompt_tokens=2000, observation_tokens=1000, decode_tokens=480, tool_s=22.0, turns=3)
    p = make_policy("prorsa", replace(_swe_moe_context(), concurrency=16, prior=prior, prior_trajectories=(_spec(0),),
                                      rehearse=rehearse))
    assert p.initial_roles(8) == [P, P] + [D] * 6
    # the families' draws (the split the prior must beat), told none; the prior's own, as told
    assert {(kind, told) for kind, told in asked} == {("a", False), ("t", True)}
    d = _decide_on(p, _trajectory_events(20, turns=3, prompt=2000, obs=1000, dec=480, tool_s=0.3))
    assert "reopen as with no prior" in d.reason
    assert set(d.targets.values()) == {M}  # the families rehearse alike: the no-prior opening is all mixed


def test_a_prior_that_ranks_splits_alike_holds_where_a_run_told_none_opens():
    """The split a prior's rehearsal must beat is the no-prior opening, not all mixed: a prior
    that ranks every split within REHEARSAL_GAIN opens there, and when it is dropped nothing
    drains."""
    from dataclasses import replace

    from prorsa.control.policy import WorkloadHint

    def rehearse(specs, split, told=True):
        if specs[0].traj_id[0] != "a":  # the prior's trajectories: all mixed a hair ahead
            return 100.0 if split == (0, 0, 8) else 100.5
        return 80.0 if split == (3, 0, 5) else 100.0

    prior = WorkloadHint(16, prompt_tokens=2000, observation_tokens=1000, decode_tokens=480, tool_s=22.0, turns=3)
    p = make_policy("prorsa", replace(_swe_moe_context(), concurrency=16, prior=prior, prior_trajectories=(_spec(0),),
                                      rehearse=rehearse))
    roles = p.initial_roles(8)
    assert roles == [P] * 3 + [M] * 5 and "none beat it by 1%" in p.opening_reason
    events = _trajectory_events(20, turns=3, prompt=2000, obs=1000, dec=480, tool_s=0.3)
    d = p.decide(Snapshot(30.0, tuple(eng(f"e{i}", r) for i, r in enumerate(roles)), events=tuple(events)))
    assert "prior dropped" in d.reason and not d.targets and "hold P3 D0 M5" in d.reason
