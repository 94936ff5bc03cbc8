"""The policy being trained: a transformers causal LM in float32 on the CPU, and its updates.

    Trainer(model_dir, config)         load the model and tokenizer; a frozen reference copy only
                                       when config.kl_coef > 0; `version` from the directory (0 if none)
    Trainer.step(samples, advantages=None) -> StepStats   one GRPO step; the version goes up by one
    Trainer.sft_step(samples) -> StepStats                one supervised step (cross-entropy on
                                                          mask-1 tokens); the version goes up by one
    Trainer.logprobs(samples) -> [Tensor]                 each token's logprob under the current
                                                          weights (0 at the first token)
    Trainer.save(out_dir) -> Path      a complete model directory (config, safetensors weights,
                                       tokenizer, generation config, policy.json), swapped into
                                       place whole
    Trainer.named_weights()            (name, tensor) pairs, for an in-place update of an engine
    Trainer.save_state(out_dir) / load_state(in_dir)   weights, AdamW moments, version and RNG
                                       state (STATE_FILE): what a resumed run continues from

A step cuts its samples into mini-batches of micro_batch x grad_accum samples (grad_accum None:
the whole step is one mini-batch) and makes one optimizer update per mini-batch, each
accumulated over micro-batches of micro_batch samples. The loss is normalised by the mini-batch's
generated tokens (grpo.py), so the accumulated gradient is the one big batch would give. With
more than one update per step the later ones see ratios away from 1: that is what the clip is for.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from prorsa.train.grpo import LOSS_AGG, LossSettings, LossStats, group_advantages, grpo_loss, sft_loss
from prorsa.train.samples import Sample
from prorsa.train.weights import written_whole

POLICY_FILE = "policy.json"  # {"policy_version": N} in every saved model directory
STATE_FILE = "trainer.pt"  # save_state's one file


@dataclass(frozen=True)
class TrainerConfig:
    lr: float = 1e-5
    clip_eps: float = 0.2
    kl_coef: float = 0.0  # > 0 keeps a frozen copy of the starting weights as the KL reference
    micro_batch: int = 8  # samples per forward/backward pass
    grad_accum: int | None = None  # micro-batches per optimizer update; None: one update per step
    seed: int = 0  # orders the samples into mini-batches
    loss_agg: str = "token-mean"  # or "seq-mean-token-mean" (grpo.py): how tokens are averaged
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adv_eps: float = 1e-6
    recompute_old_logprobs: bool = False  # True: ratios against the trainer's own logprobs before
    # the step, not the engine's (a sample without engine logprobs is always recomputed)
    threads: int | None = None  # torch's intra-op threads, process-wide; None: torch's default.
    # A small model on a busy machine is many times faster on one thread than on every core.

    def __post_init__(self) -> None:
        for name in ("lr", "micro_batch"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.grad_accum is not None and self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1 or None, got {self.grad_accum}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")


@dataclass(frozen=True)
class StepStats:
    version: int  # the policy version after the step
    samples: int
    tokens: int  # generated (trained) tokens
    loss: float  # mean over the step's updates
    policy_loss: float  # GRPO: the clipped term; SFT: the cross-entropy
    clip_fraction: float
    ratio_mean: float
    kl: float
    grad_norm: float  # before clipping, mean over the updates
    reward_mean: float
    updates: int  # optimizer updates made
    seconds: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def sequence_logprobs(model: torch.nn.Module, seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """(batch, longest) logprob of each token given the tokens before it; 0 at the first token and
    on padding. Right padding: a token's position is its index, as in an unpadded forward."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        attention[i, :len(s)] = 1
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    lp = -F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return F.pad(lp * attention[:, 1:], (1, 0))


def _padded(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


class Trainer:
    def __init__(self, model_dir: str | Path, config: TrainerConfig | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config or TrainerConfig()
        if self.config.threads is not None:
            torch.set_num_threads(self.config.threads)
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32)
        self.model.train()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self.reference = None
        if self.config.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr,
                                           weight_decay=self.config.weight_decay)
        policy = self.model_dir / POLICY_FILE
        self.version = json.loads(policy.read_text())["policy_version"] if policy.exists() else 0

    # -- updates ---------------------------------------------------------------------------------

    def step(self, samples: Sequence[Sample], advantages: Sequence[float] | None = None) -> StepStats:
        """`advantages` per sample; None: group-normalised from the samples' rewards and groups."""
        if advantages is None:
            advantages = group_advantages([s.reward for s in samples], [s.group for s in samples],
                                          self.config.adv_eps)
        if len(advantages) != len(samples):
            raise ValueError(f"{len(samples)} samples but {len(advantages)} advantages")
        old = self._old_logprobs(samples)
        rows = [(s, a, o) for s, a, o in zip(samples, advantages, old)]
        cfg = self.config

        def loss_fn(micro, new_lp, mask, num_tokens, num_sequences):
            width = new_lp.shape[1]
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = sequence_logprobs(self.reference, [s.token_ids for s, _, _ in micro], self.pad_id)
            return grpo_loss(new_lp, _padded([o for _, _, o in micro], width),
                             torch.tensor([a for _, a, _ in micro], dtype=torch.float32), mask,
                             LossSettings(cfg.clip_eps, cfg.kl_coef, cfg.loss_agg), ref, num_tokens, num_sequences)

        return self._update(rows, loss_fn)

    def sft_step(self, samples: Sequence[Sample]) -> StepStats:
        def loss_fn(micro, new_lp, mask, num_tokens, num_sequences):
            loss = sft_loss(new_lp, mask, num_tokens)
            tokens = int(mask.sum().item())
            ce = float(-(new_lp.detach() * mask).sum() / max(tokens, 1))
            return loss, LossStats(tokens, 0.0, 1.0, 0.0, ce)

        return self._update([(s, 0.0, None) for s in samples], loss_fn)

    def _update(self, rows: list[tuple], loss_fn: Callable) -> StepStats:
        if not rows:
            raise ValueError("a training step needs at least one sample")
        start = time.perf_counter()
        cfg = self.config
        order = list(range(len(rows)))
        random.Random(f"{cfg.seed}:{self.version}").shuffle(order)
        rows = [rows[i] for i in order]
        per_update = cfg.micro_batch * cfg.grad_accum if cfg.grad_accum else len(rows)
        totals: dict[str, float] = {"loss": 0.0, "policy_loss": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0,
                                    "kl": 0.0, "grad_norm": 0.0}
        tokens_all, updates = 0, 0
        self.model.train()
        for lo in range(0, len(rows), per_update):
            mini = rows[lo:lo + per_update]
            num_tokens = max(sum(s.generated_tokens for s, _, _ in mini), 1)
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum, weighted = 0.0, {"policy_loss": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0, "kl": 0.0}
            for mlo in range(0, len(mini), cfg.micro_batch):
                micro = mini[mlo:mlo + cfg.micro_batch]
                new_lp = sequence_logprobs(self.model, [s.token_ids for s, _, _ in micro], self.pad_id)
                mask = _padded([s.loss_mask for s, _, _ in micro], new_lp.shape[1])
                loss, st = loss_fn(micro, new_lp, mask, num_tokens, len(mini))
                loss.backward()
                loss_sum += float(loss.detach())
                for k in weighted:
                    weighted[k] += getattr(st, k) * st.tokens / num_tokens
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            updates += 1
            tokens_all += num_tokens
            totals["loss"] += loss_sum
            totals["grad_norm"] += float(norm)
            for k, v in weighted.items():
                totals[k] += v
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        means = {k: v / updates for k, v in totals.items()}
        rewards = [s.reward for s, _, _ in rows]
        return StepStats(self.version, len(rows), tokens_all, reward_mean=sum(rewards) / len(rows),
                         updates=updates, seconds=time.perf_counter() - start, **means)

    def _old_logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """The behaviour policy's logprobs: the engine's, unless they are missing or the config
        asks for the trainer's own (computed before any update of this step)."""
        need = [i for i, s in enumerate(samples) if self.config.recompute_old_logprobs
                or any(m and math.isnan(x) for m, x in zip(s.loss_mask, s.rollout_logprobs))]
        out = [list(s.rollout_logprobs) for s in samples]
        for lo in range(0, len(need), self.config.micro_batch):
            idx = need[lo:lo + self.config.micro_batch]
            mine = self.logprobs([samples[i] for i in idx])
            for i, lp in zip(idx, mine):
                out[i] = [v if m else 0.0 for v, m in zip(lp.tolist(), samples[i].loss_mask)]
        return out

    @torch.no_grad()
    def logprobs(self, samples: Sequence[Sample]) -> list[torch.Tensor]:
        was_training = self.model.training
        self.model.eval()  # no dropout in the tiny model, but a user's model may have some
        try:
            lp = sequence_logprobs(self.model, [s.token_ids for s in samples], self.pad_id)
        finally:
            self.model.train(was_training)
        return [lp[i, :len(s.token_ids)] for i, s in enumerate(samples)]

    # -- weights out -----------------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in self.model.state_dict().items():
            yield name, p.detach()

    def save(self, out_dir: str | Path) -> Path:
        """Swapped in whole (train/weights.py written_whole): never seen half-written."""
        out_dir = Path(out_dir)
        with written_whole(out_dir) as tmp:
            self.model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            (tmp / POLICY_FILE).write_text(json.dumps({"policy_version": self.version}) + "\n")
        return out_dir

    # -- resume ----------------------------------------------------------------------------------

    def save_state(self, out_dir: str | Path) -> None:
        """The weights travel here again beside weights/v<N>: loading them from the state alone
        keeps the KL reference the starting model's (the trainer is built from that one)."""
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "version": self.version, "torch_rng": torch.get_rng_state(),
                    "python_rng": random.getstate()}, Path(out_dir) / STATE_FILE)

    def load_state(self, in_dir: str | Path) -> None:
        # weights_only=False: the file is this run's own, and Python's RNG state is not a tensor
        state = torch.load(Path(in_dir) / STATE_FILE, map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
