"""A trainer of your own in Prorsa's RL loop: REINFORCE with a moving-average baseline, in plain
torch, in place of the built-in GRPO trainer.

    train:
      trainer: examples.custom_trainer:ReinforceTrainer   # run from the repository root
      lr: 0.0005

Prorsa rolls out each step on its engines, hands the batch to `step`, writes `save`'s model
directory under RUN_DIR/weights/v<N> and loads it into every engine in place; after every step
`save_state` keeps what `prorsa run --resume` needs. The protocol is
prorsa.train.protocol.PolicyTrainer; the class is called as ReinforceTrainer(model_dir, train),
`train` being the pipeline's train: section.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from prorsa.train.samples import Sample
from prorsa.train.weights import written_whole

BASELINE_MOMENTUM = 0.9


class ReinforceTrainer:
    def __init__(self, model_dir: Path, train) -> None:
        torch.set_num_threads(1)  # the engines hold the cores; a small model gains nothing from more
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=train.lr)
        self.baseline: float | None = None  # the first batch's mean reward, then a moving average
        self.version = 0  # the engines start from version 0

    def step(self, samples: Sequence[Sample], advantages: Sequence[float]) -> dict:
        """GRPO's `advantages` are ignored: REINFORCE weighs each sequence by reward - baseline."""
        rewards = [s.reward for s in samples]
        mean = sum(rewards) / len(rewards)
        baseline = mean if self.baseline is None else self.baseline
        tokens = max(sum(s.generated_tokens for s in samples), 1)
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for s, reward in zip(samples, rewards):  # one sequence a pass: no padding to get right
            ids = torch.tensor([s.token_ids])
            logprobs = -F.cross_entropy(self.model(input_ids=ids).logits[0, :-1], ids[0, 1:], reduction="none")
            mask = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
            loss = -(reward - baseline) * (logprobs * mask).sum() / tokens  # every token weighs the same
            loss.backward()
            total += float(loss.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.optimizer.step()
        self.baseline = BASELINE_MOMENTUM * baseline + (1 - BASELINE_MOMENTUM) * mean
        self.version += 1
        return {"loss": total, "tokens": tokens, "grad_norm": grad_norm, "reward_mean": mean}

    def save(self, out_dir: Path) -> Path:
        """Swapped in whole: an engine restarting meanwhile never reads a half-written directory."""
        with written_whole(Path(out_dir)) as tmp:
            self.model.save_pretrained(tmp, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            (tmp / "policy.json").write_text(json.dumps({"policy_version": self.version}) + "\n")
        return Path(out_dir)

    def save_state(self, out_dir: Path) -> None:
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "baseline": self.baseline, "version": self.version}, Path(out_dir) / "reinforce.pt")

    def load_state(self, in_dir: Path) -> None:
        state = torch.load(Path(in_dir) / "reinforce.pt", map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.baseline, self.version = state["baseline"], state["version"]
