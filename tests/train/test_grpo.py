import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from prorsa.train.grpo import LossSettings, group_advantages, grpo_loss, sft_loss, token_advantages


def test_group_advantages_by_hand():
    # group a: rewards 1, 0 -> mean 0.5, population std 0.5 -> +1, -1
    # group b: 1, 1, 1 -> all equal -> 0; group c: one member -> 0
    adv = group_advantages([1.0, 0.0, 1.0, 1.0, 1.0, 0.3], ["a", "a", "b", "b", "b", "c"], eps=0.0)
    assert adv == pytest.approx([1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    # 0, 0.5, 1: mean 0.5, std sqrt(1/6)
    s = math.sqrt(1 / 6)
    assert group_advantages([0.0, 0.5, 1.0], [7, 7, 7], eps=0.0) == pytest.approx([-0.5 / s, 0.0, 0.5 / s])


def test_group_advantages_need_one_group_per_reward():
    with pytest.raises(ValueError, match="3 rewards but 2"):
        group_advantages([1.0, 0.0, 1.0], ["a", "a"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(-5, 5, allow_nan=False)), min_size=1, max_size=30))
def test_advantages_are_zero_mean_and_unit_scale_per_group(pairs):
    groups, rewards = [g for g, _ in pairs], [r for _, r in pairs]
    adv = group_advantages(rewards, groups, eps=1e-6)
    for g in set(groups):
        a = [x for x, gg in zip(adv, groups) if gg == g]
        r = [x for x, gg in zip(rewards, groups) if gg == g]
        assert abs(sum(a) / len(a)) < 1e-6
        assert all(abs(x) <= math.sqrt(len(a)) + 1e-6 for x in a)  # |z| <= sqrt(n) for population z-scores
        if len(set(r)) == 1:
            assert all(x == 0.0 for x in a)


def _leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def test_clipped_tokens_get_no_gradient_and_the_rest_do():
    old = torch.zeros(1, 4, dtype=torch.float64)
    # ratios e^0.5 (above 1 + 0.2), e^-0.5 (below 1 - 0.2), e^0.1, e^-0.1 (inside)
    new = _leaf([[0.5, -0.5, 0.1, -0.1]])
    mask = torch.ones(1, 4, dtype=torch.float64)
    loss, stats = grpo_loss(new, old, torch.tensor([1.0]), mask, LossSettings(clip_eps=0.2))
    loss.backward()
    g = new.grad[0]
    # A > 0: the ratio above 1 + eps is clipped (no gradient), the one below 1 - eps is not
    assert g[0] == 0.0 and g[1] != 0.0 and g[2] != 0.0 and g[3] != 0.0
    assert g[2] == pytest.approx(-math.exp(0.1) / 4)  # d/dnew of -A * exp(new - old) / tokens
    assert stats.clip_fraction == pytest.approx(0.25)
    new.grad = None
    loss, stats = grpo_loss(new, old, torch.tensor([-1.0]), mask, LossSettings(clip_eps=0.2))
    loss.backward()
    g = new.grad[0]  # A < 0: now the ratio below 1 - eps is the clipped one
    assert g[1] == 0.0 and g[0] != 0.0
    assert stats.clip_fraction == pytest.approx(0.25)


def test_mask_keeps_tokens_out_of_loss_and_gradient():
    new = _leaf([[0.3, -2.0, 0.1, 5.0]])
    old = torch.tensor([[float("nan"), 0.0, 0.0, 0.0]], dtype=torch.float64)  # masked NaN is ignored
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, stats = grpo_loss(new, old, torch.tensor([2.0]), mask, LossSettings(clip_eps=0.2))
    loss.backward()
    assert torch.isfinite(loss) and stats.tokens == 2
    assert new.grad[0, 0] == 0.0 and new.grad[0, 3] == 0.0 and new.grad[0, 2] != 0.0
    # at ratio 1 the loss is -A per token
    loss, _ = grpo_loss(torch.zeros(1, 4, dtype=torch.float64), torch.zeros(1, 4, dtype=torch.float64),
                        torch.tensor([2.0]), mask)
    assert float(loss) == pytest.approx(-2.0)


def test_kl_is_zero_when_policy_is_reference_and_positive_otherwise():
    new = _leaf([[-1.0, -2.0, -0.5]])
    mask = torch.ones(1, 3, dtype=torch.float64)
    kl = LossSettings(kl_coef=0.1)
    _, stats = grpo_loss(new, new.detach(), torch.tensor([1.0]), mask, kl, ref_logprobs=new.detach())
    assert stats.kl == 0.0
    ref = torch.tensor([[-1.5, -2.0, 0.0]], dtype=torch.float64)
    loss_kl, stats = grpo_loss(new, new.detach(), torch.tensor([0.0]), mask, kl, ref_logprobs=ref)
    d = torch.tensor([-0.5, 0.0, 0.5], dtype=torch.float64)
    assert stats.kl == pytest.approx(float((d.exp() - d - 1).mean()))
    assert float(loss_kl.detach()) == pytest.approx(0.1 * stats.kl)


def test_token_count_normaliser_makes_micro_batches_add_up():
    torch.manual_seed(0)
    new = torch.randn(4, 6, dtype=torch.float64) * 0.1
    old = torch.zeros(4, 6, dtype=torch.float64)
    mask = (torch.rand(4, 6) > 0.3).double()
    adv = torch.tensor([1.0, -0.5, 0.2, -1.0])
    whole, _ = grpo_loss(new, old, adv, mask)
    n = int(mask.sum())
    halves = sum(grpo_loss(new[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], num_tokens=n)[0] for i in (0, 2))
    assert float(halves) == pytest.approx(float(whole))
    assert torch.equal(token_advantages(adv, mask)[:, 0], adv * mask[:, 0])


def test_seq_mean_weighs_every_sequence_the_same_whatever_its_length():
    # At ratio 1 the policy loss is -(weighted mean advantage). A one-token success (+1) and a
    # three-token failure (-1): token-mean counts the failure three times, seq-mean once each.
    new = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0])
    token, _ = grpo_loss(new, new.detach(), adv, mask)
    seq, _ = grpo_loss(new, new.detach(), adv, mask, LossSettings(loss_agg="seq-mean-token-mean"))
    assert float(token.detach()) == pytest.approx(0.5) and float(seq.detach()) == pytest.approx(0.0)
    seq.backward()
    # each sequence's tokens share its 1/2 weight: the success's one token, the failure's three
    assert new.grad[0, 0] == pytest.approx(-0.5) and new.grad[1].tolist() == pytest.approx([0.5 / 3] * 3)
    halves = sum(grpo_loss(new[i:i + 1], new[i:i + 1].detach(), adv[i:i + 1], mask[i:i + 1],
                           LossSettings(loss_agg="seq-mean-token-mean"), num_sequences=2)[0] for i in (0, 1))
    assert float(halves.detach()) == pytest.approx(float(seq.detach()))
    with pytest.raises(ValueError, match="loss_agg"):
        grpo_loss(new, new.detach(), adv, mask, LossSettings(loss_agg="sum"))


def test_sft_loss_is_mean_negative_logprob_on_masked_tokens():
    lp = torch.tensor([[-9.0, -1.0, -3.0]])
    assert float(sft_loss(lp, torch.tensor([[0.0, 1.0, 1.0]]))) == pytest.approx(2.0)
