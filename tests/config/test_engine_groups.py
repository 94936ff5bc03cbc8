"""engines.groups: engines of different sizes and layouts, each group with the roles it may take."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prorsa.config.load import ConfigError, describe
from prorsa.config.pipeline import EnginesConfig, PipelineConfig
from prorsa.rollout.context import each_engine_costs, engine_roles, engine_slots, resolve
from prorsa.roles import Role

MOE = {"model": "qwen3-30b-a3b", "gpu": "h200"}
SMALL_PREFILL = [{"count": 2, "roles": ["prefill"], "tp": 1, "ep": 1, "slots": 8},
                 {"count": 3, "roles": ["decode", "mixed"], "ep": 8}]


def _error(engines: dict, policy: str = "static") -> str:
    with pytest.raises(ValidationError) as err:
        PipelineConfig(name="g", policy=policy, engines=engines)
    return describe(err.value.errors()[0])


def test_groups_resolve_in_engine_order_and_count_is_their_sum():
    e = EnginesConfig(**MOE, groups=SMALL_PREFILL)
    assert e.count == 5
    assert e.group_of_engine() == (0, 0, 1, 1, 1)
    first, wide = e.engine_groups
    assert (first.tp, first.ep, first.slots, first.gpus, first.roles) == (1, 1, 8, 1, ("prefill",))
    assert (wide.tp, wide.ep, wide.slots, wide.gpus) == (1, 8, 32, 8)  # slots: engines.slots


def test_without_groups_one_implicit_group_of_every_role():
    (only,) = EnginesConfig(count=3, ep=2, **MOE).engine_groups
    assert (only.count, only.ep, only.declared, only.roles) == (3, 2, False, ("prefill", "decode", "mixed"))


@pytest.mark.parametrize(("engines", "where"), [
    ({"groups": [{"count": 1, "roles": ["prefill"]}, {"count": 1, "roles": []}]}, "engines.groups[1].roles:"),
    ({"groups": [{"count": 1, "roles": ["decode", "decode"]}]}, "engines.groups[0].roles: got"),
    ({"groups": [{"count": 1, "roles": ["prefil"]}]}, "engines.groups[0].roles.0: got 'prefil'"),
    ({"groups": [{"count": 0, "roles": ["mixed"]}]}, "engines.groups[0].count"),
    ({"groups": [{"count": 1, "roles": ["mixed"], "ep": 0}]}, "engines.groups[0].ep"),
    ({"groups": [{"count": 1, "roles": ["mixed"], "slots": True}]}, "engines.groups[0].slots"),
    ({"groups": []}, "engines: groups: list at least one group"),
    ({"count": 4, "groups": SMALL_PREFILL}, "engines.count: 4, but the groups declare 5 engines"),
    ({"groups": [{"count": 1, "roles": ["mixed"], "tensor_parallel_size": 2, "tp": 2}]},
     "engines.groups[0].tp: a vLLM engine's cost layout follows"),
    ({"backend": "vllm", "groups": [{"count": 1, "roles": ["mixed"], "ep": 2}]}, "engines.groups[0].ep: a vLLM"),
    ({"backend": "vllm", "vllm": {"device": "cuda"},
      "groups": [{"count": 1, "roles": ["mixed"], "enable_expert_parallel": True}]},
     "engines.groups[0]: enable_expert_parallel spreads"),
    ({"ep": 2, "parallelism": {"prefill": {"tp": 2}}, "groups": SMALL_PREFILL}, "engines: parallelism:"),
])
def test_bad_groups_name_the_field(engines, where):
    assert _error({**MOE, **engines}).startswith(where)


def test_an_explicit_count_that_agrees_is_accepted():
    assert EnginesConfig(count=5, **MOE, groups=SMALL_PREFILL).count == 5


def test_vllm_groups_take_their_own_server_layout_and_derive_the_cost_layout():
    e = EnginesConfig(backend="vllm", model="qwen3-30b-a3b", vllm={"device": "cuda", "tensor_parallel_size": 1},
                      groups=[{"count": 2, "roles": ["prefill"]},
                              {"count": 1, "roles": ["decode"], "data_parallel_size": 8, "enable_expert_parallel": True}])
    small, wide = e.engine_groups
    assert (small.vllm.gpus, small.tp, small.ep) == (1, 1, 1)
    assert (wide.vllm.gpus, wide.tp, wide.ep, wide.vllm.expert_parallel) == (8, 1, 8, True)
    assert e.group_vllm(1).data_parallel_size == 8 and e.group_vllm(0).data_parallel_size == 1


def test_resolve_gives_every_engine_its_groups_costs_slots_and_roles():
    cfg = PipelineConfig(name="g", policy="static", engines={**MOE, "groups": SMALL_PREFILL})
    costs = each_engine_costs(cfg)
    assert [c.mixed.layout for c in costs] == [(1, 1), (1, 1), (1, 8), (1, 8), (1, 8)]
    assert costs[0] is costs[1] and costs[2] is costs[4]  # a group shares one model
    assert engine_slots(cfg) == (8, 8, 32, 32, 32)
    assert engine_roles(cfg)[0] == (Role.PREFILL,) and engine_roles(cfg)[4] == (Role.DECODE, Role.MIXED)
    run = resolve(cfg)
    assert [c.mixed.layout for c in run.engine_costs] == [c.mixed.layout for c in costs]
    assert run.costs is run.engine_costs[0] and run.engine_slots == (8, 8, 32, 32, 32)


def test_a_static_split_with_groups_is_refused_and_static_without_groups_too():
    with pytest.raises(ConfigError, match=r"policy: static:1:4 with engines.groups.*write policy: static"):
        resolve(PipelineConfig(name="g", policy="static:1:4", engines={**MOE, "groups": SMALL_PREFILL}))
    with pytest.raises(ConfigError, match="static with no split takes its roles from engines.groups"):
        resolve(PipelineConfig(name="g", policy="static", engines={**MOE, "count": 3}))


def test_a_group_layout_without_a_profile_is_refused_at_resolve():
    groups = [{"count": 1, "roles": ["mixed"]}, {"count": 1, "roles": ["decode"], "ep": 8}]
    with pytest.raises(ConfigError, match=r"engines.groups\[1\]: ep=8 needs an MoE model"):
        resolve(PipelineConfig(name="g", policy="colocated", engines={"model": "qwen3-8b", "groups": groups}))


def test_with_groups_and_no_policy_given_engines_open_in_their_groups_roles():
    assert PipelineConfig(name="g", engines={**MOE, "groups": SMALL_PREFILL}).policy == "static"
    assert PipelineConfig(name="g", engines={**MOE, "count": 3}).policy == "static:2:1"
    assert PipelineConfig(name="g", policy="colocated", engines={**MOE, "groups": SMALL_PREFILL}).policy == "colocated"


def test_a_vllm_pipelines_groups_run_emulated_in_the_layouts_they_would_run():
    from prorsa.config.load import load_pipeline
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    cfg = load_pipeline(repo / "pipelines" / "gpu-moe-groups.yaml", {"engines.backend": "emulated"})
    assert [(g.tp, g.ep, g.vllm.gpus) for g in cfg.engines.engine_groups] == [(1, 1, 1), (1, 8, 8)]
