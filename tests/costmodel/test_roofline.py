"""The roofline cost model against shared/FACTS.md: sanity outputs, the vLLM anchor, KV sizes,
monotonicity, and clear errors for bad profiles.

Tolerance for the FACTS sanity outputs: +-15%. Those figures were worked out by hand from this
same formula with the same [E] constants and rounded, so today they agree within ~2%; 15% leaves
room to refit the estimates within their stated ranges (step overhead 2-5 ms, eta ~0.8, MFU) while
still catching unit slips (bits vs bytes, GB vs GiB, a missing TP factor), which are off by >= 2x.
"""

from __future__ import annotations

import pytest

from prorsa.costmodel import CostModel, config_dir, load_gpu, load_model
from prorsa.roles import Role

REL = 0.15


@pytest.fixture(scope="module")
def h200_8b() -> CostModel:
    return CostModel.from_names("h200", "qwen3-8b")


@pytest.fixture(scope="module")
def moe() -> CostModel:
    return CostModel.from_names("h200", "qwen3-30b-a3b")


# -- FACTS.md sanity outputs and anchor ---------------------------------------------------------

def test_prefill_8k_fresh_is_about_235ms(h200_8b):
    assert h200_8b.prefill_time([(8192, 0)]) == pytest.approx(0.235, rel=REL)


def test_extend_2k_on_32k_prefix_is_about_134ms(h200_8b):
    assert h200_8b.prefill_time([(2048, 32768)]) == pytest.approx(0.134, rel=REL)


def test_decode_at_full_kv_with_32k_contexts(h200_8b):
    batch = h200_8b.kv_capacity_tokens() // 32768
    assert 20 <= batch <= 24  # FACTS: B ~ 22
    assert h200_8b.decode_time([32768] * batch) == pytest.approx(0.034, rel=REL)


def test_h100_saturated_output_throughput_has_the_anchors_order_of_magnitude():
    """vLLM serves Llama-3.1-8B on one H100 at ~5.3k output tok/s at saturation [S]. Qwen3-8B is
    the same size; model a saturated 1k-in/1k-out batch as large as KV memory allows (vLLM caps
    at 256 sequences): all prompts prefilled in 8k-token steps, then every decode step."""
    cost = CostModel.from_names("h100", "qwen3-8b")
    prompt, output = 1024, 1024
    batch = min(256, cost.kv_capacity_tokens() // (prompt + output))
    per_step = 8192 // prompt
    prefill = batch / per_step * cost.prefill_time([(prompt, 0)] * per_step)
    decode = float(cost.decode_series(batch, batch * prompt, output).sum())
    throughput = batch * output / (prefill + decode)
    assert 5300 / 2 < throughput < 5300 * 2


def test_kv_bytes_per_token_match_facts():
    kib = 1024
    assert CostModel.from_names("h200", "qwen3-8b").kv_bytes_per_token == 144 * kib
    assert CostModel.from_names("h200", "qwen3-32b").kv_bytes_per_token == 256 * kib
    assert CostModel.from_names("h200", "qwen3-30b-a3b").kv_bytes_per_token == 96 * kib


def test_kv_transfer_of_a_2k_delta_of_32b_is_about_12ms():
    cost = CostModel.from_names("h200", "qwen3-32b")  # FACTS: 0.54 GB -> ~12 ms at 45 GB/s
    assert cost.kv_transfer_time(2048) == pytest.approx(0.012, rel=0.25)
    assert cost.kv_transfer_time(2048, "nvlink") < cost.kv_transfer_time(2048) / 5
    assert cost.kv_transfer_time(0) == 0.0
    with pytest.raises(ValueError, match="link"):
        cost.kv_transfer_time(10, "carrier-pigeon")


# -- monotonicity and structure -----------------------------------------------------------------

@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-32b", "qwen3-30b-a3b"])
def test_more_tokens_are_never_faster(model):
    cost = CostModel.from_names("h200", model)
    sizes = [1, 16, 128, 1024, 4096, 16384]
    for cached in (0, 8192):
        times = [cost.prefill_time([(n, cached)]) for n in sizes]
        assert times == sorted(times)
    times = [cost.prefill_time([(2048, c)]) for c in (0, 1024, 8192, 32768)]
    assert times == sorted(times)
    for ctx in (128, 32768):
        times = [cost.decode_time([ctx] * b) for b in (1, 2, 8, 32, 128, 512)]
        assert times == sorted(times)
    times = [cost.decode_time([c] * 8) for c in (1, 1000, 10000, 100000)]
    assert times == sorted(times)
    prefill, decode = [(2048, 4096)], [4096] * 32
    both = cost.mixed_time(prefill, decode)
    assert both >= max(cost.prefill_time(prefill), cost.decode_time(decode))
    assert both <= cost.prefill_time(prefill) + cost.decode_time(decode)  # one step, not two


def test_moe_touched_weights_grow_with_batch_and_saturate_at_all_experts(moe):
    m = moe.model
    expert_bytes = m.layers * m.experts * m.expert_params * m.weight_bytes
    all_streamed = (m.params_total - m.params_embedding) * m.weight_bytes
    one_token = all_streamed - expert_bytes + m.layers * m.experts_per_token * m.expert_params * 2
    touched = [moe.touched_weight_bytes(b) for b in (1, 2, 4, 16, 64, 256, 4096)]
    assert touched == sorted(touched)
    assert touched[0] == pytest.approx(one_token, rel=1e-9)  # exactly k experts per layer
    assert touched[-1] == pytest.approx(all_streamed, rel=1e-9)  # every expert
    assert touched[0] < 0.25 * touched[-1]
    dense = CostModel.from_names("h200", "qwen3-8b")
    assert dense.touched_weight_bytes(1) == dense.touched_weight_bytes(4096)


def test_decode_series_equals_per_step_decode_time(h200_8b, moe):
    for cost in (h200_8b, moe):
        contexts = [100, 5000, 20000]
        series = cost.decode_series(3, sum(contexts), 50)
        expected = [cost.decode_time([c + i for c in contexts]) for i in range(50)]
        assert series.tolist() == pytest.approx(expected, rel=1e-12)


def test_empty_steps_take_no_time(h200_8b):
    assert h200_8b.prefill_time([]) == 0.0
    assert h200_8b.decode_time([]) == 0.0
    assert h200_8b.mixed_time([(0, 100)], []) == 0.0


def test_tensor_parallel_splits_work_and_adds_an_all_reduce():
    tp1 = CostModel.from_names("h200", "qwen3-32b")
    tp4 = CostModel.from_names("h200", "qwen3-32b", tp=4)
    p1, p4 = tp1.prefill_time([(8192, 0)]), tp4.prefill_time([(8192, 0)])
    assert p1 / 4 < p4 < p1 / 2  # faster, but the all-reduce keeps it short of 4x
    assert tp4.kv_capacity_tokens() > 4 * tp1.kv_capacity_tokens()  # weights split 4 ways
    assert tp4.decode_time([4096] * 32) < tp1.decode_time([4096] * 32)


def test_expert_parallel_needs_moe_and_shards_experts(moe):
    with pytest.raises(ValueError, match="dense"):
        CostModel.from_names("h200", "qwen3-8b", ep=2)
    ep8 = CostModel.from_names("h200", "qwen3-30b-a3b", ep=8)
    assert ep8.kv_capacity_tokens() > moe.kv_capacity_tokens()
    assert ep8.touched_weight_bytes(4096) < moe.touched_weight_bytes(4096) / 4


def test_kv_capacity_follows_the_memory_fraction():
    small = CostModel.from_names("h200", "qwen3-8b", mem_fraction=0.5)
    large = CostModel.from_names("h200", "qwen3-8b", mem_fraction=0.95)
    assert 0 < small.kv_capacity_tokens() < large.kv_capacity_tokens()
    assert CostModel.from_names("h100", "qwen3-32b", mem_fraction=0.3).kv_capacity_tokens() == 0


def test_switch_time(h200_8b):
    c = h200_8b
    assert c.switch_time(Role.DECODE, Role.DECODE) == 0.0
    assert c.switch_time(Role.PREFILL, Role.MIXED) == 0.0
    to_decode = c.switch_time(Role.PREFILL, Role.DECODE)
    assert to_decode == pytest.approx(c.prefill_time([(8192, 0)]))  # one prefill step
    assert to_decode <= 0.5  # FACTS: <= 0.5 s
    assert c.switch_time(Role.DECODE, Role.PREFILL) == 0.0  # nothing in flight
    short = c.switch_time(Role.DECODE, Role.PREFILL, 22 * 100, 22, context_tokens=22 * 32768)
    long = c.switch_time(Role.DECODE, Role.PREFILL, 22 * 1000, 22, context_tokens=22 * 32768)
    assert 0 < short < long
    assert 1.0 < long < 120.0  # FACTS: seconds


def test_a_switch_by_restart_empties_the_engine_then_pays_the_restart(h200_8b):
    """Across the KV connector's sides the engine drains both legs, then restarts; between decode
    and mixed (both pull KV) it switches in place as before."""
    c = CostModel.from_names("h200", "qwen3-8b", restart_s=30.0)
    busy = dict(inflight_decode_tokens=22 * 1000, batch=22, context_tokens=22 * 32768)
    drain = h200_8b.switch_time(Role.DECODE, Role.PREFILL, **busy)
    assert c.switch_time(Role.DECODE, Role.PREFILL, **busy) == pytest.approx(drain + 30.0)
    # leaving prefill: the prefill step in flight, then the restart (was the step alone)
    assert c.switch_time(Role.PREFILL, Role.DECODE) == pytest.approx(h200_8b.prefill_time([(8192, 0)]) + 30.0)
    assert c.switch_time(Role.PREFILL, Role.MIXED) > 30.0  # mixed pulls KV: a restart too
    assert c.switch_time(Role.DECODE, Role.MIXED, **busy) == 0.0
    assert c.switch_time(Role.MIXED, Role.DECODE) == h200_8b.switch_time(Role.MIXED, Role.DECODE)


# How long these calls take is measured by benchmarks/sim_speed.py --calls, not asserted here: a
# wall-clock bound in a test fails on a loaded host whatever the code does.

# -- profiles -----------------------------------------------------------------------------------

def test_profiles_load_with_names_and_sources():
    gpu, model = load_gpu("h100"), load_model("qwen3-30b-a3b")
    assert gpu.name == "h100" and gpu.hbm_bw == 3.35e12
    assert model.is_moe and model.experts == 128 and model.experts_per_token == 8
    assert model.params_total == pytest.approx(30.5e9, rel=0.01)


def _write_gpu(directory, **override) -> None:
    fields = dict(peak_flops="989e12", peak_flops_fp8=1.979e15, hbm_bytes=8.0e10, hbm_bw=3.35e12,
                  bw_efficiency=0.8, mfu_attn=0.5, step_overhead_s=0.003, nvlink_bw=4.5e11,
                  nvlink_efficiency=0.8, net_bw=4.0e10, net_latency_s=0.001,
                  collective_latency_s=1e-5, gpus_per_node=8)
    fields.update(override)
    text = "".join(f"{k}: {v}\n" for k, v in fields.items() if v is not None)
    (directory / "hardware").mkdir(exist_ok=True)
    (directory / "hardware" / "fake.yaml").write_text(text)


def test_config_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PRORSA_CONFIG_DIR", str(tmp_path))
    _write_gpu(tmp_path)
    assert load_gpu("fake").peak_flops == 989e12  # "989e12" (YAML 1.1 string) read as a number


@pytest.mark.parametrize("override, field, expected", [
    ({"hbm_bw": "fast"}, "hbm_bw", "expected a number"),
    ({"hbm_bw": None}, "hbm_bw", "missing field"),
    ({"gpus_per_node": 8.5}, "gpus_per_node", "expected an integer"),
    ({"mfu_attn": 1.5}, "mfu_attn", "fraction"),
    ({"hbm_bytes": -1}, "hbm_bytes", "positive"),
    ({"hbm_bandwidth": 1}, "hbm_bandwidth", "unknown field"),
])
def test_malformed_profile_names_file_and_field(tmp_path, monkeypatch, override, field, expected):
    monkeypatch.setenv("PRORSA_CONFIG_DIR", str(tmp_path))
    _write_gpu(tmp_path, **override)
    with pytest.raises(ValueError) as err:
        CostModel.from_names("fake", "qwen3-8b")
    message = str(err.value)
    assert "fake.yaml" in message and field in message and expected in message


def test_missing_or_unparsable_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("PRORSA_CONFIG_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="nope.yaml"):
        load_model("nope")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "broken.yaml").write_text("layers: [1, 2\n")
    with pytest.raises(ValueError, match="broken.yaml.*not valid YAML"):
        load_model("broken")
    (tmp_path / "models" / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="list.yaml.*mapping"):
        load_model("list")


def test_inconsistent_moe_fields_are_rejected(tmp_path, monkeypatch):
    monkeypatch.delenv("PRORSA_CONFIG_DIR", raising=False)
    text = (config_dir() / "models" / "qwen3-30b-a3b.yaml").read_text()  # the repository's
    monkeypatch.setenv("PRORSA_CONFIG_DIR", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "odd.yaml").write_text(
        text.replace("experts_per_token: 8", "experts_per_token: 0"))
    with pytest.raises(ValueError, match="odd.yaml.*experts_per_token"):
        load_model("odd")


# -- weight updates priced by their bytes -----------------------------------------------------------

def test_a_weight_update_costs_a_fixed_part_plus_its_bytes_over_the_link(h200_8b):
    from prorsa.costmodel.roofline import WEIGHT_UPDATE_FIXED_S

    g = h200_8b.gpu
    whole = h200_8b.weight_bytes_resident()
    assert whole == pytest.approx(16.4e9, rel=0.05)  # Qwen3-8B in bf16
    node = h200_8b.weight_update_time()
    assert node == pytest.approx(WEIGHT_UPDATE_FIXED_S + whole / (g.nvlink_bw * g.nvlink_efficiency))
    assert h200_8b.weight_update_time(link="net") == pytest.approx(WEIGHT_UPDATE_FIXED_S + whole / g.net_bw)
    # ~40 GB/s over the NIC against ~400 over NVLink
    assert h200_8b.weight_update_time(link="net") - WEIGHT_UPDATE_FIXED_S > 5 * (node - WEIGHT_UPDATE_FIXED_S)
    # only changed tensors moved: a tenth of the bytes, a tenth of the variable part
    tenth = h200_8b.weight_update_time(whole / 10)
    assert tenth - WEIGHT_UPDATE_FIXED_S == pytest.approx((node - WEIGHT_UPDATE_FIXED_S) / 10)
    assert h200_8b.weight_update_time(0) == WEIGHT_UPDATE_FIXED_S
    with pytest.raises(ValueError, match="link"):
        h200_8b.weight_update_time(link="disk")


def test_tensor_parallel_ranks_load_their_shards_at_once():
    from prorsa.costmodel.roofline import WEIGHT_UPDATE_FIXED_S

    one, four = (CostModel.from_names("h200", "qwen3-32b", tp=tp) for tp in (1, 4))
    assert four.weight_update_time() - WEIGHT_UPDATE_FIXED_S == \
        pytest.approx((one.weight_update_time() - WEIGHT_UPDATE_FIXED_S) / 4)


def test_an_engine_slower_to_take_weights_in_than_its_link_bounds_the_update():
    import dataclasses

    from prorsa.costmodel.roofline import WEIGHT_UPDATE_FIXED_S

    base = CostModel.from_names("h200", "qwen3-8b")
    slow = CostModel(dataclasses.replace(base.gpu, weight_load_bw=10e9), base.model)
    whole = base.weight_bytes_resident()
    assert slow.weight_update_time() == pytest.approx(WEIGHT_UPDATE_FIXED_S + whole / 10e9)
    assert slow.weight_update_time(link="net") == pytest.approx(WEIGHT_UPDATE_FIXED_S + whole / 10e9)
    assert base.weight_update_time() < slow.weight_update_time()


def test_the_cpu_profile_prices_the_measured_memory_updates():
    """CostModel.weight_update_time against benchmarks/weight_sync.py's memory path (whole updates of
    0.5B and 1.4B float32 models on one vLLM CPU engine): within a fifth of each measured median."""
    import json
    import statistics
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "weight-sync-paths.json").read_text())
    cpu = CostModel.from_names("cpu", "tiny")
    for shape in (s for s in doc["shapes"] if s["bytes"] > 1e9):
        measured = statistics.median(r["total_s"] for r in shape["paths"]["memory"]["runs"])
        assert cpu.weight_update_time(shape["bytes"]) == pytest.approx(measured, rel=0.2), shape["name"]
