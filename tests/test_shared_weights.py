"""shared_weights.py without an engine: which tensors an update moves (changed ones only, widened
to the vLLM layers they feed), the region's contents as the engine reads them, and the manifest's
round trip through JSON."""

from __future__ import annotations

import pytest
import torch

from prorsa.shared_weights import (
    SharedRegion,
    WeightManifest,
    expand_to_groups,
    read_tensors,
    sync_group,
)


def llama(layers: int = 2, h: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {"model.embed_tokens.weight": torch.randn(32, h, generator=g)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            out[p + m + ".weight"] = torch.randn(h, h, generator=g)
        out[p + "input_layernorm.weight"] = torch.ones(h)
        out[p + "post_attention_layernorm.weight"] = torch.ones(h)
    out["model.norm.weight"] = torch.ones(h)
    out["lm_head.weight"] = torch.randn(32, h, generator=g)
    return out


@pytest.fixture
def region(tmp_path):
    r = SharedRegion(tmp_path / "region")
    yield r
    r.unlink()


def test_packed_parts_and_experts_share_their_vllm_layer():
    assert sync_group("model.layers.3.self_attn.k_proj.weight") == "model.layers.3.self_attn.qkv_proj"
    assert sync_group("model.layers.3.self_attn.q_proj.bias") == "model.layers.3.self_attn.qkv_proj"
    assert sync_group("model.layers.3.self_attn.o_proj.weight") == "model.layers.3.self_attn.o_proj"
    assert sync_group("model.layers.3.mlp.up_proj.weight") == "model.layers.3.mlp.gate_up_proj"
    assert sync_group("model.layers.1.mlp.experts.7.w1.weight") == "model.layers.1.mlp.experts"
    assert sync_group("lm_head.weight") == "lm_head"
    names = list(llama())
    got = expand_to_groups(["model.layers.1.self_attn.v_proj.weight", "model.norm.weight"], names)
    assert got == ["model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                   "model.layers.1.self_attn.v_proj.weight", "model.norm.weight"]
    # an engine's own mapping wins: without packing, a part travels alone
    assert expand_to_groups(["model.layers.1.self_attn.v_proj.weight"], names, {}) == \
        ["model.layers.1.self_attn.v_proj.weight"]


def test_the_first_publish_moves_everything_and_the_engine_reads_it_back(region):
    sd = llama()
    m = region.publish(sd.items())
    assert m.load is None and m.written_bytes == m.total_bytes == sum(t.numel() * 4 for t in sd.values())
    back = dict(read_tensors(WeightManifest.from_json(m.to_json())))
    assert list(back) == list(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_a_frozen_part_is_not_moved(region):
    """Train only the last layer: the next update writes only its tensors, and the engine loads
    only their layers; everything else stays as the region and the engine hold it."""
    sd = llama(layers=4)
    region.publish(sd.items())
    trained = [k for k in sd if k.startswith("model.layers.3.")]
    for k in trained[:3]:  # q, k, v change; the rest of the layer is frozen too
        sd[k] = sd[k] + 0.5
    m = region.publish(sd.items())
    assert m.load == tuple(trained[:3])
    assert m.written_bytes == 3 * 8 * 8 * 4 < m.total_bytes / 10
    back = dict(read_tensors(m, m.load))
    assert set(back) == set(trained[:3]) and all(torch.equal(back[k], sd[k]) for k in back)
    # nothing changed: nothing moves
    again = region.publish(sd.items())
    assert again.load == () and again.written_bytes == 0


def test_changed_only_off_moves_everything_each_time(region):
    sd = llama()
    region.publish(sd.items())
    m = region.publish(sd.items(), changed_only=False)
    assert m.load is None and m.written_bytes == m.total_bytes


def test_a_new_shape_lays_the_region_out_again(region):
    region.publish(llama(h=8).items())
    sd = llama(h=16, seed=1)
    m = region.publish(sd.items())
    assert m.load is None and m.total_bytes == sum(t.numel() * 4 for t in sd.values())
    assert all(torch.equal(t, sd[k]) for k, t in read_tensors(m))


def test_whole_asks_for_every_tensor(region):
    sd = llama()
    region.publish(sd.items())
    sd["model.norm.weight"] = -sd["model.norm.weight"]
    m = region.publish(sd.items())
    assert m.load == ("model.norm.weight",)
    assert m.whole().load is None and m.whole().slots == m.slots


def test_tensors_are_aligned_and_bfloat16_travels(region):
    sd = {"a.weight": torch.randn(3, dtype=torch.bfloat16), "b.weight": torch.randn(5, 7)}
    m = region.publish(sd.items())
    assert all(s.offset % 64 == 0 for s in m.slots)
    back = dict(read_tensors(m))
    assert back["a.weight"].dtype == torch.bfloat16 and torch.equal(back["a.weight"], sd["a.weight"])
