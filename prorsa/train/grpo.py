"""GRPO's arithmetic, as plain functions of tensors (no model, no optimizer).

    group_advantages(rewards, groups, eps) -> [float]   (r - mean of its group) / (std of its group + eps)
    token_advantages(advantages, mask) -> Tensor        each sequence's advantage on its masked tokens
    grpo_loss(new, old, advantages, mask, settings, ref=None, num_tokens=None, num_sequences=None)
                                        -> (loss, LossStats); settings: LossSettings(clip_eps, kl_coef, loss_agg)

The loss per generated token t of a sequence with advantage A, ratio rho = exp(new_t - old_t):

    -min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)  +  kl_coef * (exp(ref_t - new_t) - (ref_t - new_t) - 1)

summed over masked tokens and divided by `num_tokens` (default: the masked tokens given). The
trainer passes the whole update's token count, so micro-batches accumulate to the same gradient
as one big batch, and every token weighs the same whatever its sequence's length. verl's
`seq-mean-token-mean` is the other choice (LOSS_AGG): each sequence's mean over its own tokens,
summed and divided by `num_sequences`, so every sequence weighs the same. A small model needs it:
under token-mean its long, rambling failures outweigh its short successes in every group, and
pushing them down moves the policy more than pulling the successes up. The KL term is the k3
estimator of KL(new || ref): non-negative, zero where the policies agree.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

LOSS_AGG = ("token-mean", "seq-mean-token-mean")


@dataclass(frozen=True)
class LossStats:
    tokens: int  # masked tokens in this call
    clip_fraction: float  # of them, those whose clipped term was the smaller (no gradient flows)
    ratio_mean: float  # mean exp(new - old) over them
    kl: float  # mean k3 KL to the reference; 0.0 without one
    policy_loss: float  # the clipped term alone, mean per masked token


def group_advantages(rewards: Sequence[float], groups: Sequence[Hashable], eps: float = 1e-6) -> list[float]:
    """A group whose rewards are all equal teaches nothing and gets 0 (its std is 0, its
    deviations are 0); so does a group of one. std is the population std of the group."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group ids")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        r = torch.tensor([float(rewards[i]) for i in idx], dtype=torch.float64)
        mean, std = r.mean(), r.std(unbiased=False)
        if r.max() == r.min():  # said outright: the float mean of equal values may miss them by an ulp
            continue
        for i, a in zip(idx, ((r - mean) / (std + eps)).tolist()):
            out[i] = a
    return out


def token_advantages(advantages: Sequence[float] | torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    adv = torch.as_tensor(advantages, dtype=mask.dtype if mask.is_floating_point() else torch.float32)
    return adv.to(mask.device)[:, None] * mask


@dataclass(frozen=True)
class LossSettings:
    """The loss's own settings (a trainer's TrainerConfig carries them)."""

    clip_eps: float = 0.2
    kl_coef: float = 0.0
    loss_agg: str = "token-mean"  # or LOSS_AGG's other


def grpo_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, settings: LossSettings = LossSettings(),
              ref_logprobs: torch.Tensor | None = None, num_tokens: int | None = None,
              num_sequences: int | None = None) -> tuple[torch.Tensor, LossStats]:
    """All tensors are (batch, tokens); `advantages` per token (token_advantages) or per sequence
    (batch,). Gradients flow through `new_logprobs` only."""
    clip_eps, kl_coef, loss_agg = settings.clip_eps, settings.kl_coef, settings.loss_agg
    mask = mask.to(new_logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(new_logprobs)
    advantages = advantages.to(new_logprobs.dtype).detach()
    old = old_logprobs.to(new_logprobs.dtype).detach()
    # Masked positions may hold anything (0.0, NaN from an engine that sent none): keep them out of exp.
    log_ratio = torch.where(mask.bool(), new_logprobs - old, torch.zeros_like(new_logprobs))
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.maximum(unclipped, clipped)
    kl = torch.zeros_like(new_logprobs)
    if ref_logprobs is not None and kl_coef:
        diff = torch.where(mask.bool(), ref_logprobs.to(new_logprobs.dtype).detach() - new_logprobs,
                           torch.zeros_like(new_logprobs))
        kl = torch.exp(diff) - diff - 1.0
        per_token = per_token + kl_coef * kl
    tokens = int(mask.sum().item())
    if loss_agg == "token-mean":
        loss = (per_token * mask).sum() / float(num_tokens if num_tokens is not None else max(tokens, 1))
    elif loss_agg == "seq-mean-token-mean":
        per_sequence = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        loss = per_sequence.sum() / float(num_sequences if num_sequences is not None else mask.shape[0])
    else:
        raise ValueError(f"loss_agg must be one of {', '.join(LOSS_AGG)}, got {loss_agg!r}")
    with torch.no_grad():
        n = max(tokens, 1)
        stats = LossStats(
            tokens=tokens,
            clip_fraction=float(((clipped > unclipped).to(mask.dtype) * mask).sum() / n),
            ratio_mean=float((ratio * mask).sum() / n),
            kl=float((kl * mask).sum() / n),
            policy_loss=float((torch.maximum(unclipped, clipped) * mask).sum() / n),
        )
    return loss, stats


def sft_loss(new_logprobs: torch.Tensor, mask: torch.Tensor, num_tokens: int | None = None) -> torch.Tensor:
    """Cross-entropy on the masked tokens: what the supervised warm-up minimises."""
    mask = mask.to(new_logprobs.dtype)
    denom = float(num_tokens if num_tokens is not None else max(int(mask.sum().item()), 1))
    return -(new_logprobs * mask).sum() / denom
