"""ModelScale: a cost model wrong by known factors, and the run a policy with such a model sees."""

import pytest

from prorsa.config.pipeline import PipelineConfig
from prorsa.costmodel import CostModel
from prorsa.costmodel.misfit import ModelScale
from prorsa.rollout.context import resolve
from prorsa.sim.rehearse import misfit


def _dense() -> CostModel:
    return CostModel.from_names("h200", "qwen3-8b")  # TP1: no collectives, so a step is overhead + roofline


def test_prefill_factor_scales_a_compute_bound_step_and_leaves_decode_alone():
    base, slow = _dense(), ModelScale(prefill=0.8).of(_dense())
    oh = base.gpu.step_overhead_s
    assert slow.prefill_time([(8192, 0)]) - oh == pytest.approx((base.prefill_time([(8192, 0)]) - oh) / 0.8)
    assert slow.decode_time([4096] * 8) == pytest.approx(base.decode_time([4096] * 8))


def test_decode_factor_scales_a_bandwidth_bound_step_and_leaves_prefill_alone():
    base, fast = _dense(), ModelScale(decode=1.25).of(_dense())
    oh = base.gpu.step_overhead_s
    assert fast.decode_time([4096] * 8) - oh == pytest.approx((base.decode_time([4096] * 8) - oh) / 1.25)
    assert fast.prefill_time([(8192, 0)]) == pytest.approx(base.prefill_time([(8192, 0)]))


def test_transfer_factor_scales_kv_transfer_beyond_its_fixed_cost():
    base, slow = _dense(), ModelScale(transfer=0.5).of(_dense())
    fixed = base.gpu.net_latency_s
    assert slow.kv_transfer_time(4096) - fixed == pytest.approx(2 * (base.kv_transfer_time(4096) - fixed))
    assert slow.kv_capacity_tokens() == base.kv_capacity_tokens()  # memory size is not a throughput


def test_exact_scale_returns_the_same_model_and_factors_compose():
    cost = _dense()
    assert ModelScale().of(cost) is cost
    assert ModelScale(prefill=0.8, decode=1.25) * ModelScale(prefill=1.25, decode=0.8) == ModelScale()
    assert str(ModelScale(decode=1.25)) == "decode=1.25" and str(ModelScale()) == "exact"


@pytest.mark.parametrize("text, field", [("prefill", "prefill"), ("flops=2", "flops"), ("decode=-1", "decode"),
                                         ("decode=x", "decode"), ("transfer=0", "transfer")])
def test_parse_names_the_bad_part(text, field):
    with pytest.raises(ValueError, match=field):
        ModelScale.parse(text)


def test_parse_reads_every_factor():
    assert ModelScale.parse("prefill=0.8, decode=1.25,transfer=2") == ModelScale(0.8, 1.25, 2.0)


def test_misfit_scales_what_the_policy_plans_with_and_not_the_engines():
    run = resolve(PipelineConfig.model_validate({"name": "misfit", "policy": "colocated", "engines": {"count": 4, "model": "qwen3-30b-a3b", "ep": 4}}))
    seen = misfit(run, ModelScale(decode=2.0))
    ctx = [4096] * 16
    assert seen.policy.cost.decode_time(ctx) < run.policy.cost.decode_time(ctx)
    assert seen.costs.mixed.decode_time(ctx) == pytest.approx(seen.policy.cost.decode_time(ctx))
    assert all(c.mixed.decode_time(ctx) < r.mixed.decode_time(ctx) for c, r in zip(seen.engine_costs, run.engine_costs))
    assert run.costs.mixed.decode_time(ctx) == pytest.approx(CostModel.from_names("h200", "qwen3-30b-a3b", ep=4).decode_time(ctx))
    assert misfit(run, ModelScale()) is run
