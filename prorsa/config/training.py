"""The train and partial_rollout sections: the RL loop, and sync steps that end once enough is done."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from prorsa.config.section import MANY, Section


class TrainConfig(Section):
    """The RL loop (prorsa/train/learner.py): GRPO on the rollouts, new weights into every
    engine after each step. Sync: one update between steps; async: one every prompts x
    group_size finished trajectories while rollout goes on, no trajectory trained more than
    max_staleness versions behind the policy being trained."""

    algorithm: Literal["grpo"] = "grpo"
    # "package.module:Class" (train/protocol.py PolicyTrainer) trains instead of the built-in GRPO
    # Trainer; it gets the same batches and GRPO advantages, and the fields below it reads itself
    trainer: str | None = Field(None, max_length=500)
    lr: float = Field(1e-4, gt=0, le=1)
    clip_eps: float = Field(0.2, gt=0, le=10)
    kl_coef: float = Field(0.0, ge=0)  # > 0 keeps a frozen reference model for a k3 KL term
    # verl's loss_agg_mode: every generated token weighs the same, or every sequence (train/grpo.py)
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    micro_batch: int = Field(8, ge=1)  # sequences per forward/backward
    # micro-batches whose gradients accumulate into one optimizer update; None: one update per step
    grad_accum: int | None = Field(None, ge=1)
    max_staleness: int = Field(1, ge=0)  # async: versions a trained trajectory may lag the trainer
    sft_steps: int = Field(0, ge=0)  # supervised warm-up on the task's demonstrations before RL
    sft_lr: float = Field(1e-3, gt=0, le=1)
    # the warm-up stops once this share of sampled first turns calls the tool: RL learns from the
    # differences within a group, and a model that always (or never) calls has none to learn from
    sft_target_call_rate: float = Field(0.4, gt=0, le=1)
    keep_checkpoints: int = Field(2, ge=1)  # weight versions kept under RUN_DIR/weights
    seed: int | None = None  # None: the pipeline's seed
    # where the Trainer lives: in the driver, or on a worker of its own (resource trainer: 1) that
    # writes the weights into the run directory, so that directory must be on a shared filesystem
    placement: Literal["driver", "worker"] = "driver"
    # how new weights reach the engines: "disk", a model directory per version under RUN_DIR/weights
    # that each engine reloads; "memory", a shared-memory region on the trainer's node that each
    # engine loads from (shared_weights.py), so the engines must share the driver's node
    weight_sync: Literal["disk", "memory"] = "disk"
    # memory: move only the tensors whose content changed since the last update (with their vLLM
    # layers); False: every tensor, every update (skips comparing, for a model trained whole)
    sync_changed_only: bool = True

    @model_validator(mode="after")
    def _memory_beside_the_engines(self) -> TrainConfig:
        if self.weight_sync == "memory" and self.placement != "driver":
            raise ValueError("weight_sync: memory hands weights over on the driver's node: it needs placement: driver")
        return self

    @field_validator("trainer")
    @classmethod
    def _trainer_named(cls, v: str | None) -> str | None:
        # the form here; that it imports and has the protocol's methods: rollout/context.py check
        if v is not None and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            raise ValueError(f'{v!r}: expected "package.module:ClassName"')
        return v


class PartialRolloutConfig(Section):
    """Synchronous steps that end when enough is done (rollout/partial.py): a step starts
    (1 + over_sample) x prompts GRPO groups and ends once `prompts` of them are whole; the rest
    go on into the next step (carry) or are cancelled. A trajectory whose first turn was sent
    more than max_staleness policy versions before the version a step trains is dropped. With
    overlap, the next step's groups start as this step's become whole."""

    # extra groups started per step, as a share of prompts (rounded up to whole groups): 0.25 of
    # 8 prompts starts 10 groups; the first 8 to be whole are trained
    over_sample: float = Field(0.25, ge=0, le=8)
    # True: unfinished trajectories keep running into the next step (under the new weights from
    # their next turn); False: they are cancelled when the step ends
    carry: bool = True
    # None: train.max_staleness with train:, else 1 (a pipeline gives one bound, not two)
    max_staleness: int | None = Field(None, ge=0, le=MANY)
    # True: as a group becomes whole, the next step's next group starts at once, under this step's
    # version, so the step's tail keeps its engines busy with the next step's first prefills (at
    # most one step ahead; needs carry)
    overlap: bool = False
