"""What the RL loop asks of a trainer: the built-in GRPO Trainer (trainer.py) is one; a pipeline's
`train.trainer: "package.module:Class"` names another.

    PolicyTrainer                 the protocol (below); the class is called as
                                  Class(model_dir, train_config) with the model directory the
                                  engines start from and the pipeline's train: section
    load_trainer_class(spec) -> type     "package.module:Class", imported and checked; ValueError
                                  (one line) when it does not import or lacks a method (the
                                  resolve step's check, rollout/context.py, calls it first)
    make_trainer(spec, model_dir, train_config, builtin) -> PolicyTrainer   spec None: builtin()
    step_stats(result, version, samples) -> StepStats   what `step` returned, as the loop's record

The loop (learner.py) calls, after each training step's rollout:

    trainer.step(samples, advantages)   one update on the batch: each Sample has the token ids,
                                        loss mask, rollout logprobs, reward, GRPO group and policy
                                        version (samples.py); `advantages` are GRPO's
                                        group-normalised ones, one per sample, to use or ignore.
                                        `version` must go up by one. Returns a StepStats or a
                                        mapping of metrics (loss, kl, clip_fraction, tokens, ...)
    trainer.save(out_dir) -> Path       the new weights as a model directory (config, safetensors,
                                        tokenizer) the engines reload in place
    trainer.save_state(out_dir)         after every step: what a resumed run needs to continue
                                        (weights, optimizer, RNG); out_dir is empty, and swapped
                                        into place whole afterwards
    trainer.load_state(in_dir)          once, before the first step of a resumed run

and reads `trainer.version` (the policy version of its weights; a step with nothing trainable
moves it by one without a step). The module is imported with the working directory on sys.path,
as uvicorn and gunicorn do, so a trainer beside the pipeline is found without installing it.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from prorsa.train.samples import Sample
from prorsa.train.trainer import StepStats

METHODS = ("step", "save", "save_state", "load_state")


@runtime_checkable
class PolicyTrainer(Protocol):
    version: int

    def step(self, samples: Sequence[Sample], advantages: Sequence[float]) -> StepStats | Mapping[str, Any]: ...

    def save(self, out_dir: Path) -> Path: ...

    def save_state(self, out_dir: Path) -> None: ...

    def load_state(self, in_dir: Path) -> None: ...


def load_trainer_class(spec: str) -> type:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r}: expected \"package.module:ClassName\"")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))  # after everything installed: a local module never shadows one
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # a module that fails while importing fails the same way for the user
        raise ValueError(f"{spec!r}: cannot import {module_name} ({type(e).__name__}: {e})") from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ValueError(f"{spec!r}: {module_name} has no class {attr}")
    missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"{spec!r}: {attr} lacks the trainer protocol's {', '.join(missing)} "
                         f"(prorsa.train.protocol.PolicyTrainer)")
    return cls


def make_trainer(spec: str | None, model_dir: Path, train_config: Any,
                 builtin: Callable[[], PolicyTrainer]) -> PolicyTrainer:
    if spec is None:
        return builtin()
    trainer = load_trainer_class(spec)(Path(model_dir), train_config)
    if not isinstance(getattr(trainer, "version", None), int):
        raise TypeError(f"train.trainer {spec!r}: the instance has no integer `version`")
    return trainer


def step_stats(result: StepStats | Mapping[str, Any], version: int, samples: Sequence[Sample],
               seconds: float) -> StepStats:
    if isinstance(result, StepStats):
        return result
    got = dict(result or {})
    nan = math.nan
    rewards = [s.reward for s in samples]
    return StepStats(
        version=version, samples=int(got.get("samples", len(samples))),
        tokens=int(got.get("tokens", sum(s.generated_tokens for s in samples))),
        loss=float(got.get("loss", nan)), policy_loss=float(got.get("policy_loss", got.get("loss", nan))),
        clip_fraction=float(got.get("clip_fraction", nan)), ratio_mean=float(got.get("ratio_mean", nan)),
        kl=float(got.get("kl", nan)), grad_norm=float(got.get("grad_norm", nan)),
        reward_mean=float(got.get("reward_mean", sum(rewards) / len(rewards) if rewards else nan)),
        updates=int(got.get("updates", 1)), seconds=float(got.get("seconds", seconds)))
