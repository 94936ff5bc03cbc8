"""Engine groups in the simulator: every engine steps with its own group's layout and slots, the
policies keep to each group's roles, the router prices engines by their own size."""

from __future__ import annotations

import pytest

from prorsa.config.pipeline import PipelineConfig
from prorsa.control.policy import Decision, PolicyContext, Snapshot, make_policy
from prorsa.costmodel import CostModel
from prorsa.loads import EngineLoad
from prorsa.roles import Role
from prorsa.rollout.context import make_router, resolve
from prorsa.rollout.placement import MoveCost
from prorsa.rollout.router import Router
from prorsa.sim.bounds import lower_bound
from prorsa.agent.workload import Workload
from prorsa.sim.rehearse import future_run
from prorsa.sim.run import simulate, simulate_async

MOE = {"model": "qwen3-30b-a3b", "gpu": "h200", "time_scale": 0}
WORK = {"family": "swe", "mode": "sync", "prompts": 4, "group_size": 4, "max_turns": 3, "tool_time_scale": 0.01}


def _groups(prefill_ep: int = 1, decode_ep: int = 8, decode_roles=("decode", "mixed")) -> list[dict]:
    return [{"count": 2, "roles": ["prefill"], "ep": prefill_ep, "slots": 16},
            {"count": 1, "roles": list(decode_roles), "ep": decode_ep, "slots": 128}]


def _cfg(policy: str = "static", **groups) -> PipelineConfig:
    return PipelineConfig(name="groups", seed=1, policy=policy, engines={**MOE, "groups": _groups(**groups)},
                          workload=WORK)


def test_each_engine_steps_with_its_own_groups_layout():
    small = simulate(resolve(_cfg()))
    assert small.recorder.trajectories.__len__() == 16
    # only the prefill group's layout changes: the run must see it (one model for all would not)
    wide_prefill = simulate(resolve(_cfg(prefill_ep=8)))
    assert wide_prefill.makespan_s != pytest.approx(small.makespan_s, rel=1e-3)
    # nor is it the run of three engines of the decode group's layout
    alike = PipelineConfig(name="alike", seed=1, policy="static:2:1",
                           engines={**MOE, "count": 3, "ep": 8, "slots": 128}, workload=WORK)
    assert simulate(resolve(alike)).makespan_s != pytest.approx(small.makespan_s, rel=1e-3)


def test_the_bound_holds_for_engines_of_different_sizes():
    cfg = _cfg()
    run = simulate(resolve(cfg))
    assert lower_bound(resolve(cfg)).makespan_s <= run.makespan_s
    # utilisation counts each engine's own slots
    assert run.recorder.slots == {"engine-0": 16, "engine-1": 16, "engine-2": 128}
    assert all(0 <= u <= 1 for u in run.recorder.utilisation().values())


def test_policies_open_in_the_groups_roles():
    ctx = resolve(_cfg()).policy
    assert make_policy("static", ctx).initial_roles(3) == [Role.PREFILL, Role.PREFILL, Role.DECODE]
    # colocated: mixed wherever a group allows it, the group's opening role elsewhere
    assert make_policy("colocated", ctx).initial_roles(3) == [Role.PREFILL, Role.PREFILL, Role.MIXED]
    only_decode = resolve(_cfg(decode_roles=("decode",))).policy
    assert make_policy("colocated", only_decode).initial_roles(3) == [Role.PREFILL, Role.PREFILL, Role.DECODE]


class _Wants:
    """A policy that asks for every role everywhere, to see what reaches the engines."""

    name = "wants"

    def __init__(self, role: Role) -> None:
        self.role = role

    def initial_roles(self, n: int) -> list[Role]:
        return [self.role] * n

    def decide(self, snapshot: Snapshot) -> Decision:
        return Decision({e.engine_id: self.role for e in snapshot.engines}, "asked")


def test_no_policy_moves_an_engine_outside_its_groups_roles():
    from prorsa.control.policy import WithinGroups

    allowed = resolve(_cfg()).policy.engine_roles
    loads = tuple(EngineLoad(engine_id=f"engine-{i}", role=Role.MIXED) for i in range(3))
    for role in Role:
        policy = WithinGroups(_Wants(role), allowed)
        opening = policy.initial_roles(3)
        targets = policy.decide(Snapshot(time_s=0.0, engines=loads)).targets
        for i, a in enumerate(allowed):
            assert opening[i] in a
            assert f"engine-{i}" not in targets or targets[f"engine-{i}"] in a
        assert (f"engine-2" in targets) == (role in (Role.DECODE, Role.MIXED))


@pytest.mark.parametrize("spec", ["prorsa", "reactive"])
def test_adaptive_policies_never_leave_the_groups_roles(spec):
    cfg = _cfg(policy=spec)
    run = simulate(resolve(cfg))
    allowed = {f"engine-{i}": set(a) for i, a in enumerate(resolve(cfg).policy.engine_roles)}
    assert run.recorder.trajectories.__len__() == 16
    for change in run.recorder.role_changes:
        assert change.to_role in allowed[change.engine], change
    for record in run.recorder.controls:
        assert all(role in allowed[e] for e, role in record.roles.items())


def test_the_router_prices_and_fills_each_engine_by_its_own_size():
    ctx = resolve(_cfg())
    roles = {"engine-0": Role.PREFILL, "engine-1": Role.PREFILL, "engine-2": Role.DECODE}
    router = make_router(ctx, roles, clock=lambda: 0.0)
    assert router._price("engine-0").cost.layout == (1, 1) and router._price("engine-2").cost.layout == (1, 8)
    assert router._price("engine-0").prefill_rate < router._price("engine-2").prefill_rate
    # a prefill engine counts as full at its own slots: 16 each here, not engines.slots
    router.load.update({"engine-0": 16, "engine-1": 15})
    pools = router._pool()
    assert not router._full(pools.prefillers)
    router.load["engine-1"] = 16
    assert router._full(pools.prefillers)


def test_one_slots_value_for_all_engines_still_works():
    cost = CostModel.from_names("h200", "qwen3-8b")
    r = Router({"a": Role.PREFILL, "b": Role.DECODE}, overload="cost", slots=4, clock=lambda: 0.0,
               move_cost=MoveCost(cost, 4, 100))
    r.load["a"] = 4
    assert r._full(r._pool().prefillers) and r._slots("b") == 4


def test_a_live_emulated_engine_is_made_with_its_groups_layout_and_slots(tmp_path):
    from prorsa.engine.registry import make_engine

    e = _cfg().engines
    first, wide = make_engine(0, Role.PREFILL, e, tmp_path), make_engine(2, Role.DECODE, e, tmp_path)
    assert (first.cost.layout, first._batch.slots) == ((1, 1), 16)
    assert (wide.cost.layout, wide._batch.slots) == ((1, 8), 128)


def test_new_trajectories_go_where_the_share_of_slots_is_least():
    r = Router({"small": Role.DECODE, "wide": Role.DECODE}, overload=None, slots={"small": 32, "wide": 256})
    picks = [r.route(f"t{i}", colocated=True).decode for i in range(72)]
    # the 256-slot engine takes eight turns for each one the 32-slot engine takes
    assert picks.count("wide") == 64 and picks.count("small") == 8


def test_a_static_split_asked_for_on_the_command_line_is_refused_with_groups():
    ctx = resolve(_cfg()).policy
    with pytest.raises(ValueError, match="static:1:2 with engine groups"):
        make_policy("static:1:2", ctx)


def test_a_rehearsal_over_groups_opens_each_group_in_its_counts():
    from prorsa.sim.rehearse import rehearser
    from prorsa.sim.run import simulate_async

    groups = _groups()
    groups[0]["roles"] = ["prefill", "mixed"]
    cfg = PipelineConfig(name="groups", seed=1, policy="static", engines={**MOE, "groups": groups}, workload=WORK)
    rehearse = rehearser(resolve(cfg), simulate_async)
    specs = Workload.from_config(cfg.workload, cfg.seed).trajectories_for_step(0)
    # the small engines prefilling for the wide one, or both mixed beside it: two different runs,
    # so each group's counts reached its engines
    a, b = rehearse(specs, ((2, 0, 0), (0, 1, 0))), rehearse(specs, ((0, 0, 2), (0, 1, 0)))
    assert a > 0 and b > 0 and a != pytest.approx(b, rel=1e-3)
    alike = PipelineConfig(name="alike", policy="static:2:1", engines={**MOE, "count": 3, "ep": 8}, workload=WORK)
    assert rehearser(resolve(alike), simulate_async) is not None


def test_between_steps_is_clipped_too_and_a_held_policy_pickles():
    import pickle

    from prorsa.control.policy import WithinGroups

    class _WantsBetween(_Wants):
        def between_steps(self, snapshot: Snapshot) -> Decision:
            return self.decide(snapshot)

    allowed = resolve(_cfg()).policy.engine_roles
    loads = tuple(EngineLoad(engine_id=f"engine-{i}", role=Role.PREFILL) for i in range(3))
    held = WithinGroups(_WantsBetween(Role.MIXED), allowed)
    assert held.between_steps(Snapshot(time_s=0.0, engines=loads)).targets == {"engine-2": Role.MIXED}
    assert not hasattr(WithinGroups(_Wants(Role.MIXED), allowed), "between_steps")
    again = pickle.loads(pickle.dumps(make_policy("colocated", resolve(_cfg()).policy)))
    assert again.initial_roles(3) == [Role.PREFILL, Role.PREFILL, Role.MIXED]



def test_the_oracle_keeps_to_the_groups_and_replays_nothing_there():
    # a replayed split of role counts names no engines where they differ in size: the oracle plans
    # with its true forecast alone, within each group's roles
    run = simulate(resolve(_cfg()), "oracle:4:1:2:1:0.02")
    assert len(run.recorder.trajectories) == 16
    allowed = {"engine-0": {Role.PREFILL}, "engine-1": {Role.PREFILL}, "engine-2": {Role.DECODE, Role.MIXED}}
    assert all(c.to_role in allowed[c.engine] for c in run.recorder.role_changes)
    cfg = _cfg()
    assert future_run(resolve(cfg), Workload.from_config(cfg.workload, cfg.seed), simulate_async) is None


def test_prorsa_plans_counts_per_group_and_no_switch_leaves_a_groups_roles():
    groups = [{"count": 2, "roles": ["prefill", "mixed"], "ep": 1, "slots": 16},
              {"count": 2, "roles": ["mixed", "decode"], "ep": 8, "slots": 128},
              {"count": 1, "roles": ["decode"], "ep": 4, "slots": 64}]
    cfg = PipelineConfig(name="groups", seed=1, policy="prorsa:2:0:2:1:0", engines={**MOE, "groups": groups},
                         workload={**WORK, "steps": 2, "prompts": 8})
    run = simulate(resolve(cfg))
    assert len(run.recorder.trajectories) == 64
    allowed = {f"engine-{i}": set(map(Role, g["roles"])) for i, g in enumerate(g for g in groups for _ in range(g["count"]))}
    first = run.recorder.controls[0].roles
    # no prior: each group opens in its declared role (the first), where without groups prorsa opens mixed
    assert [first[e] for e in allowed] == [Role(g["roles"][0]) for g in groups for _ in range(g["count"])]
    assert run.recorder.role_changes  # it did move, so the check below checks something
    assert all(c.to_role in allowed[c.engine] for c in run.recorder.role_changes)
    # its plans and the step boundary's rehearsal name one split per group
    assert any(c.reason.count("|") >= 2 for c in run.recorder.controls)


def test_an_ungrouped_pool_is_one_group_with_the_pools_slots_and_kv():
    from prorsa.live.run import _engine_capacity

    names = ["engine-0", "engine-1", "engine-2"]
    engines = {**MOE, "count": 3, "slots": 24, "ep": 4}
    pool = resolve(PipelineConfig(name="pool", seed=1, engines=engines, workload=WORK))
    assert [e.name for e in pool.engines] == names and all(e.roles is None for e in pool.engines)
    cap = _engine_capacity(pool)
    assert cap.slots == dict.fromkeys(names, 24)
    assert cap.kv_tokens == dict.fromkeys(names, pool.policy.kv_capacity_tokens)
    grouped = resolve(_cfg())
    cap = _engine_capacity(grouped)
    assert cap.slots == dict(zip(names, (16, 16, 128))) and cap.kv_tokens["engine-2"] > cap.kv_tokens["engine-0"]
    assert [e.roles[0] for e in grouped.engines] == [r[0] for r in grouped.policy.engine_roles]
