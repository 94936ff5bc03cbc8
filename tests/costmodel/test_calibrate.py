"""Fitting the cost model's machine constants: synthetic step times from a known CostModel are fitted
back, and the profiles written from a fit load and predict what the fit predicts.

The synthetic machine is CPU-like (tens of ms of step overhead, GFLOP/s, GB/s) on the tiny model,
with a grid like `prorsa calibrate`'s, so both the compute- and the memory-bound regimes appear.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest

from prorsa.costmodel import CostModel, load_gpu, load_model
from prorsa.costmodel.calibrate import StepSample, fit, model_fields_from_hf, predict
from prorsa.costmodel.profile_writer import Provenance, error_summary, model_path_for, write_profiles
from prorsa.costmodel.profiles import GpuProfile, ModelProfile
from prorsa.engine.measure import DEFAULT_PLAN, TAIL, Measured

TINY_CONFIG = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 2048,
               "intermediate_size": 512, "tie_word_embeddings": False}
PROV = Provenance("2026-01-01T00:00", "prorsa calibrate p.yaml", "a test", "no load")


def tiny(mfu_linear: float = 1.0) -> ModelProfile:
    return ModelProfile(name="tiny", mfu_linear=mfu_linear, **model_fields_from_hf(TINY_CONFIG, 4))


def machine(**over) -> GpuProfile:
    values = dict(name="cpu", peak_flops=8e9, peak_flops_fp8=8e9, hbm_bytes=2e8, hbm_bw=2e9,
                  bw_efficiency=1.0, mfu_attn=0.5, step_overhead_s=0.02, nvlink_bw=2e9,
                  nvlink_efficiency=1.0, net_bw=1.5e9, net_latency_s=0.005, collective_latency_s=0.0,
                  gpus_per_node=2)
    return GpuProfile(**(values | over))


def grid(cost: CostModel, noise: float = 0.0, seed: int = 0) -> list[StepSample]:
    """Step times of the default plan's shapes from `cost`, each scaled by 1 +- noise."""
    rng = random.Random(seed)
    shapes = [("prefill", 1, n, c) for n, c in DEFAULT_PLAN.prefill]
    shapes += [("decode", b, 1, c + TAIL + DEFAULT_PLAN.decode_tokens / 2) for b, c in DEFAULT_PLAN.decode]
    out = []
    for kind, batch, new, ctx in shapes:
        s = StepSample(kind, batch, new, ctx, 1.0)
        t = predict(cost, s) * (1 + rng.uniform(-noise, noise))
        out.append(dataclasses.replace(s, seconds=t, repeats=(t,)))
    return out


def test_tiny_architecture_from_config_json():
    m = tiny()
    per_layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 512  # q, k, v, o; gated MLP
    assert m.params_active == 2 * per_layer
    assert m.params_embedding == 2048 * 128
    assert m.params_total == 2 * per_layer + 2 * 2048 * 128 + 5 * 128  # + lm_head + norms
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 32 * 4  # K and V, 2 layers, 2 heads, fp32


def test_tied_embeddings_are_streamed_as_the_lm_head():
    tied = model_fields_from_hf(TINY_CONFIG | {"tie_word_embeddings": True}, 4)
    assert tied["params_embedding"] == 0
    assert tied["params_total"] == tiny().params_total - 2048 * 128


def test_exact_samples_give_back_the_constants():
    truth = CostModel(machine(), tiny(mfu_linear=0.4))
    samples = grid(truth)
    f = fit(samples, tiny())
    assert f.memory_bound > 0 and all(f.identified.values())
    # within 1%: the weak prior tying the two compute rates pulls them a little together
    assert f.step_overhead_s == pytest.approx(0.02, rel=0.01)
    assert f.linear_flops == pytest.approx(0.4 * 8e9, rel=0.01)
    assert f.attn_flops == pytest.approx(0.5 * 8e9, rel=0.01)
    assert f.mem_bw == pytest.approx(2e9, rel=0.01)
    assert np.allclose(f.predict(samples), [s.seconds for s in samples], rtol=0.01)


def test_noisy_samples_predict_within_the_noise():
    truth = CostModel(machine(), tiny(mfu_linear=0.4))
    f = fit(grid(truth, noise=0.10, seed=3), tiny())
    clean = grid(truth)
    med, worst = error_summary(clean, f.predict(clean))
    assert med < 0.05 and worst < 0.12
    assert f.step_overhead_s == pytest.approx(0.02, rel=0.15)


def test_bandwidth_that_never_binds_is_flagged_and_kept_at_its_bound():
    truth = CostModel(machine(hbm_bw=1e12), tiny(mfu_linear=0.4))
    samples = grid(truth)
    f = fit(samples, tiny())
    assert not f.identified["mem_bw"] and f.memory_bound == 0
    assert f.mem_bw < 1e12  # the lowest bandwidth the samples allow, not the truth
    assert np.allclose(f.predict(samples), [s.seconds for s in samples], rtol=1e-3)


def test_a_grid_without_attention_work_keeps_attention_finite():
    """Prefills from an empty cache only: attention is a sliver of every step; the prior keeps its
    rate near the linear one instead of letting it run off to infinity."""
    truth = CostModel(machine(), tiny(mfu_linear=0.4))
    samples = [s for s in grid(truth) if s.kind == "prefill" and s.context == 0 and s.new <= 512]
    samples += [s for s in grid(truth) if s.kind == "decode" and s.batch <= 4]
    f = fit(samples, tiny())
    assert np.isfinite(f.attn_flops) and 0.1 < f.attn_flops / f.linear_flops < 10
    assert np.allclose(f.predict(samples), [s.seconds for s in samples], rtol=0.05)


def test_too_few_samples_are_refused():
    with pytest.raises(ValueError, match="at least 4 samples"):
        fit(grid(CostModel(machine(), tiny()))[:3], tiny())


def test_written_profiles_load_and_predict_what_the_fit_predicts(tmp_path: Path):
    truth = CostModel(machine(), tiny(mfu_linear=0.4))
    samples = grid(truth, noise=0.05)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(TINY_CONFIG))
    hardware = tmp_path / "configs" / "hardware" / "cpu.yaml"
    model_path = model_path_for(hardware, "tiny")
    assert model_path == tmp_path / "configs" / "models" / "tiny.yaml"
    f = write_profiles(Measured(tuple(samples), model_dir, 131072, "float32"), hardware, model_path, PROV)

    cost = CostModel(load_gpu(str(hardware)), load_model(str(model_path)))
    assert [predict(cost, s) for s in samples] == pytest.approx(list(f.predict(samples)), rel=1e-3)
    assert cost.kv_capacity_tokens() == pytest.approx(131072, rel=1e-3)
    text = hardware.read_text()
    assert "Measured 2026-01-01T00:00 by `prorsa calibrate p.yaml`" in text
    assert text.count("#   prefill") == len(DEFAULT_PLAN.prefill)


def test_an_engine_without_an_explicit_dtype_is_refused(tmp_path: Path):
    samples = grid(CostModel(machine(), tiny()))
    with pytest.raises(ValueError, match="explicit dtype"):
        write_profiles(Measured(tuple(samples), tmp_path, 1, "auto"), tmp_path / "cpu.yaml",
                       tmp_path / "tiny.yaml", PROV)
