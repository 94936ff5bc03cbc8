"""Stage-specific parallelism (engines.parallelism): config, cost model, emulated engine, simulator."""

from __future__ import annotations

import asyncio

import pytest

from prorsa.config.load import ConfigError
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.allocator import Capacity
from prorsa.costmodel import CostModel, RoleCosts
from prorsa.engine.base import DecodeRequest, PrefillRequest
from prorsa.engine.emulated import EmulatedEngine
from prorsa.roles import Role
from prorsa.rollout.context import engine_costs, load_run, policy_context, resolve
from prorsa.sim.bounds import lower_bound
from prorsa.sim.clock import run_virtual
from prorsa.sim.run import simulate

TP8 = CostModel.from_names("h200", "qwen3-30b-a3b", tp=8)
EP8 = CostModel.from_names("h200", "qwen3-30b-a3b", ep=8)
SPLIT = RoleCosts(prefill=TP8, decode=EP8, mixed=EP8)  # prefill on TP8, decode and mixed on EP8

MOE = {
    "name": "partest", "seed": 3, "policy": "static:1:3",
    "engines": {"backend": "emulated", "count": 4, "slots": 128, "model": "qwen3-30b-a3b", "ep": 8},
    "workload": {"family": "swe", "mode": "sync", "prompts": 8, "group_size": 4, "max_turns": 4,
                 "tool_time_scale": 0.25},
}
PER_ROLE = {"prefill": {"tp": 8, "ep": 1}, "decode": {"tp": 1, "ep": 8}}


def cfg_of(parallelism=None, **workload) -> PipelineConfig:
    engines = MOE["engines"] | ({} if parallelism is None else {"parallelism": parallelism})
    return PipelineConfig.model_validate(MOE | {"engines": engines, "workload": MOE["workload"] | workload})


@pytest.mark.parametrize("engines, expected", [
    ("{model: qwen3-30b-a3b, ep: 8, parallelism: {decode: {tp: 1, ep: 16}}}",
     ["engines", "parallelism.decode", "16 GPUs", "8 GPUs"]),
    ("{model: qwen3-30b-a3b, ep: 8, parallelism: {prefill: {tp: 0, ep: 8}}}",
     ["engines.parallelism.prefill.tp", "got 0", "greater than or equal to 1"]),
    ("{model: qwen3-30b-a3b, ep: 8, parallelism: {prefill: {tp: 8, dp: 1}}}",
     ["engines.parallelism.prefill.dp", "unknown field"]),
    ("{model: qwen3-30b-a3b, ep: 8, parallelism: {encode: {tp: 8}}}",
     ["engines.parallelism.encode", "unknown field"]),
    ("{model: qwen3-8b, tp: 4, parallelism: {decode: {tp: 1, ep: 4}}}",
     ["parallelism.decode", "ep=4 needs an MoE model"]),
    ("{backend: vllm, model: qwen3-30b-a3b, ep: 8, parallelism: {prefill: {tp: 8}}}",
     ["engines", "parallelism", "emulated engines only"]),
])
def test_a_bad_per_role_layout_names_the_field(tmp_path, engines, expected):
    path = tmp_path / "p.yaml"
    path.write_text(f"name: t\npolicy: static:1:2\nengines: {engines}\n")
    with pytest.raises(ConfigError) as err:
        load_run(path)
    for part in expected:
        assert part in str(err.value), (part, str(err.value))


def test_a_role_not_named_keeps_the_engines_layout():
    e = cfg_of(PER_ROLE).engines
    assert (e.layout("prefill"), e.layout("decode"), e.layout("mixed")) == ((8, 1), (1, 8), (1, 8))
    costs = engine_costs(cfg_of(PER_ROLE))
    assert costs.decode is costs.mixed and not costs.is_uniform  # one model per layout
    assert engine_costs(cfg_of()).is_uniform


def test_an_engine_prices_each_role_in_its_layout():
    """A prefill on the TP8 layout is one rank with 8x the compute; decodes run on EP8's ranks."""
    async def main(cost, role):
        engine = EmulatedEngine("e0", role, cost, slots=64)
        await engine.start()
        if role is Role.PREFILL:
            result = await engine.prefill(PrefillRequest("a", 0, 16000, 16000))
            out = result.compute_s
        else:
            req = DecodeRequest("a", 0, context_tokens=1000, max_tokens=200, new_tokens=0)
            result = await engine.generate(req)
            out = result.decode_s
        await engine.stop()
        return out

    chunks = TP8.prefill_time([(8192, 0)]) + TP8.prefill_time([(7808, 8192)])  # max_batched_tokens 8192
    assert run_virtual(main(SPLIT, Role.PREFILL)) == pytest.approx(chunks)
    assert run_virtual(main(SPLIT, Role.PREFILL)) < 0.5 * run_virtual(main(EP8, Role.PREFILL))
    assert run_virtual(main(SPLIT, Role.DECODE)) == run_virtual(main(EP8, Role.DECODE))
    assert run_virtual(main(SPLIT, Role.DECODE)) != run_virtual(main(TP8, Role.DECODE))


def test_a_switch_across_layouts_costs_more_than_one_within():
    """From the same engine state: the drain in the old layout, then the weights move; and into
    MIXED (nothing drains within a layout) the engine must empty first."""
    uniform = RoleCosts.uniform(EP8)
    for old, new in ((Role.PREFILL, Role.DECODE), (Role.DECODE, Role.PREFILL), (Role.PREFILL, Role.MIXED)):
        within = SPLIT.of(old).switch_time(old, new, 40_000, 64, context_tokens=400_000)
        across = SPLIT.switch_time(old, new, 40_000, 64, context_tokens=400_000)
        assert SPLIT.reshards(old, new) and not uniform.reshards(old, new)
        assert across > within + 0.5 * TP8.reshard_time(EP8), (old, new)
    assert not SPLIT.reshards(Role.DECODE, Role.MIXED)  # the same layout: no reshard
    assert SPLIT.switch_time(Role.DECODE, Role.MIXED) == 0.0
    assert 0 < EP8.reshard_time(TP8) < 1.0  # a whole-weight NVLink gather: tens of ms, not a reload
    with pytest.raises(ValueError, match="tp x ep differs"):
        RoleCosts(prefill=CostModel.from_names("h200", "qwen3-30b-a3b", tp=4), decode=EP8, mixed=EP8)


def test_relayout_empties_the_prefix_cache_and_holds_the_engine():
    async def main():
        engine = EmulatedEngine("e0", Role.PREFILL, SPLIT, slots=64)
        await engine.start()
        await engine.prefill(PrefillRequest("a", 0, 4000, 4000))
        await engine.prefill(PrefillRequest("b", 0, 4000, 4000))
        kept = await engine.generate(DecodeRequest("a", 1, context_tokens=4100, max_tokens=10, new_tokens=100))
        assert engine.ranks == 1 and kept.cached_tokens == 4000
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await engine.relayout(Role.DECODE)
        held = loop.time() - t0
        lost = await engine.generate(DecodeRequest("b", 1, context_tokens=4100, max_tokens=10, new_tokens=100))
        assert engine.ranks == 8 and lost.cached_tokens == 0  # the old layout's KV is gone
        assert engine.kv_capacity == EP8.kv_capacity_tokens() * 8
        busy = asyncio.ensure_future(engine.generate(DecodeRequest("c", 0, context_tokens=100, max_tokens=50,
                                                                   new_tokens=100)))
        await asyncio.sleep(0.001)
        with pytest.raises(RuntimeError, match="drain it first"):
            await engine.relayout(Role.PREFILL)
        await busy
        await engine.stop()
        return held

    assert run_virtual(main()) == pytest.approx(TP8.reshard_time(EP8))


def test_the_allocator_prices_each_role_in_its_layout():
    uniform = Capacity.from_cost(EP8, slots=128)
    split = Capacity.from_cost(EP8, slots=128, layouts=SPLIT)
    assert all(uniform.for_role(r) is uniform for r in Role)
    assert split.for_role(Role.DECODE) is split and split.for_role(Role.MIXED) is split
    pre = split.for_role(Role.PREFILL)
    assert pre.cost is TP8 and pre.ranks == 1
    assert pre.prefill_latency(8000, 4000) < 0.5 * uniform.prefill_latency(8000, 4000)
    assert policy_context(cfg_of(PER_ROLE)).layouts is not None and policy_context(cfg_of()).layouts is None


def test_uniform_override_is_the_default_path_and_per_role_changes_the_run():
    """Naming every role with the engines' own layout is the default path, bit for bit."""
    base = simulate(resolve(cfg_of()), "prorsa")
    same = {r: {"tp": 1, "ep": 8} for r in ("prefill", "decode", "mixed")}
    again = simulate(resolve(cfg_of(same)), "prorsa")
    assert again.makespan_s == base.makespan_s
    assert again.summary["role_switches"] == base.summary["role_switches"]
    assert lower_bound(resolve(cfg_of(same))) == lower_bound(resolve(cfg_of()))
    split = simulate(resolve(cfg_of(PER_ROLE)), "static:1:3")
    assert split.summary["trajectories_completed"] == 32 and split.summary["trajectories_failed"] == 0
    assert split.makespan_s != simulate(resolve(cfg_of()), "static:1:3").makespan_s
    assert split.makespan_s >= lower_bound(resolve(cfg_of(PER_ROLE))).makespan_s


def test_switches_across_layouts_in_a_run_lose_no_trajectory():
    run = simulate(resolve(cfg_of(PER_ROLE, mode="async", concurrency=32, trajectories=64)), "prorsa")
    assert run.summary["trajectories_completed"] == 64 and run.summary["trajectories_failed"] == 0
    for policy in ("colocated", "oracle"):
        assert simulate(resolve(cfg_of(PER_ROLE)), policy).summary["trajectories_completed"] == 32
