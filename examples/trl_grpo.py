"""GRPO with TRL on Prorsa's rollout: TRL's GRPOTrainer takes the steps, Prorsa's engines roll out.

    python examples/trl_grpo.py [PIPELINE] [--steps N] [--model DIR] [--output DIR]

    pip install -e .[trl]   # trl==1.16.0 (and accelerate); setup.sh installs it

TRL calls `rollout_func(prompts, trainer)` for every generation batch. Here it pushes the
trainer's weights into every engine first (`Rollout.update_weights`: one policy version per step),
rolls the prompts' tasks out on the pipeline's engines, tools and reward (multi-turn, PD-split
when the pipeline says so), and hands TRL each trajectory as

    prompt_ids       the tokens before the model's first turn (chat template, tool schemas, task)
    completion_ids   everything after: the model's turns and the tool observations between them
    env_mask         Prorsa's loss mask over completion_ids: 1 on the model's tokens, 0 on the
                     tool's, so TRL's loss and its completion lengths count the model's alone
    logprobs         the engines' logprob of each generated token (0.0 on tool tokens)

plus `prorsa_reward` and `generated_tokens`, which TRL forwards to the reward functions. TRL's
prompts arrive `num_generations` times each, consecutively; each such run is one Prorsa task, a
group of `workload.group_size` trajectories, so the two sizes must agree.

GRPO learns from differences within a group, and the tiny model as made never calls the
calculator (every sample scores the same, every advantage is 0). Warm it up first, then train:

    prorsa sft --output warm                       # the calculator's call format, about 4 in 10 times
    python examples/trl_grpo.py --model warm       # engines and trainer start from it
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import prorsa
from prorsa.agent.datasets.base import Task
from prorsa.agent.environment import dataset_tasks
from prorsa.api import Trajectory
from prorsa.config.load import ConfigError
from prorsa.engine.registry import resolve_model_dir

ROOT = Path(__file__).resolve().parents[1]
BREVITY_WEIGHT = 0.1  # small beside the task's reward: it only breaks ties within a group


class RolloutError(RuntimeError):
    """A batch TRL cannot train on: a trajectory that failed, or prompts not in whole groups."""


def trl_batch(trajectories: Sequence[Trajectory]) -> dict[str, list]:
    """Prorsa's trajectories as rollout_func's answer, one entry per trajectory, in their order."""
    out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                            "prorsa_reward", "generated_tokens", "policy_version")}
    for t in trajectories:
        if t.status != "completed":  # dropping it would shift every later group: TRL pairs by position
            raise RolloutError(f"{t.traj_id}: {t.status} ({t.error})")
        if 1 not in t.loss_mask:
            raise RolloutError(f"{t.traj_id}: no generated tokens (engines without token ids cannot feed a trainer)")
        start = t.loss_mask.index(1)
        out["prompt_ids"].append(list(t.token_ids[:start]))
        out["completion_ids"].append(list(t.token_ids[start:]))
        out["env_mask"].append(list(t.loss_mask[start:]))
        out["logprobs"].append(list(t.rollout_logprobs[start:]))
        out["prorsa_reward"].append(t.reward)
        out["generated_tokens"].append(sum(t.loss_mask))
        out["policy_version"].append(t.policy_version)
    return out


def groups_of(prompts: Sequence[Any], group_size: int) -> list[Any]:
    """TRL's prompt list, `group_size` copies of each in a row -> one prompt per group."""
    heads = list(prompts[::group_size])
    if len(prompts) % group_size or list(prompts) != [p for p in heads for _ in range(group_size)]:
        raise RolloutError(f"prompts: expected runs of {group_size} equal prompts (TRL's num_generations "
                           f"must equal the pipeline's workload.group_size)")
    return heads


@dataclass
class StepRecord:
    version: int  # what update_weights returned before the step's rollout
    versions_seen: list[int] = field(default_factory=list)  # each trajectory's policy_version
    env_masked: int = 0  # completion tokens the model did not generate (tool observations)
    multi_turn: int = 0  # trajectories with more than one turn


def make_rollout_func(rollout: prorsa.Rollout, tasks: Sequence[Task],
                      steps: list[StepRecord]) -> Callable[[list, Any], dict[str, list]]:
    by_prompt = {t.prompt: t for t in tasks}
    group_size = rollout.cfg.workload.group_size

    def rollout_func(prompts: list, trainer) -> dict[str, list]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        version = rollout.update_weights(model.state_dict())  # the engines sample from what is trained
        batch = [by_prompt[p] for p in groups_of(prompts, group_size)]
        trajectories = rollout.generate(batch)
        out = trl_batch(trajectories)
        steps.append(StepRecord(version, list(out["policy_version"]),
                                sum(m.count(0) for m in out["env_mask"]),
                                sum(len(t.turns) > 1 for t in trajectories)))
        del out["policy_version"]  # kept out of TRL's reward kwargs: a rollout detail, not a score
        return out

    return rollout_func


def environment_reward(completions, prorsa_reward, **_) -> list[float]:
    """The pipeline's reward (environment.reward), computed by Prorsa as the trajectory ended."""
    return [float(r) for r in prorsa_reward]


def brevity(completions, generated_tokens, **_) -> list[float]:
    """Fewer generated tokens score higher; weighed BREVITY_WEIGHT, it only breaks ties."""
    return [-n / 100 for n in generated_tokens]


@dataclass(frozen=True)
class RunResult:
    trainer: Any  # trl.GRPOTrainer, trained
    steps: list[StepRecord]
    log: list[dict]  # TRL's log history, one row per step and a summary


def train(pipeline: str | Path, *, steps: int = 2, output: str | Path = "trl-grpo-out", model: str | None = None,
          lr: float = 1e-3, **overrides: Any) -> RunResult:
    """`steps` TRL steps, each on one batch of the pipeline's workload.prompts tasks x group_size
    trajectories; `overrides`: pipeline fields, as prorsa.Rollout takes them."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    # TRL checks the installed vLLM for its own generation mode (use_vllm), which this example leaves off:
    # Prorsa's engines generate. Its version warning, repeated at every check, is not about this set-up.
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16
    if model is not None:
        overrides["engines.vllm.model"] = model
    records: list[StepRecord] = []
    rollout = prorsa.Rollout(pipeline, **overrides)
    cfg = rollout.cfg
    if cfg.engines.backend != "vllm" or cfg.environment is None or cfg.environment.mode != "live":
        raise RolloutError("the pipeline needs engines.backend: vllm and environment.mode: live "
                           "(TRL trains on the model's token ids and the environment's reward)")
    model_dir = resolve_model_dir(cfg.engines)
    tasks = dataset_tasks(cfg.environment, cfg.seed)
    group = cfg.workload.group_size
    args = GRPOConfig(output_dir=str(output), max_steps=steps, learning_rate=lr, num_generations=group,
                      per_device_train_batch_size=cfg.workload.prompts * group, reward_weights=[1.0, BREVITY_WEIGHT],
                      max_completion_length=cfg.environment.max_turns * cfg.environment.max_response_tokens,
                      logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
                      disable_tqdm=True, seed=cfg.seed)
    # built before the engines start, so a bad setting fails in seconds, not after their start-up
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        reward_funcs=[environment_reward, brevity], args=args,
        train_dataset=Dataset.from_list([{"prompt": t.prompt} for t in tasks]),
        rollout_func=make_rollout_func(rollout, tasks, records))
    with rollout:
        trainer.train()
    return RunResult(trainer, records, list(trainer.state.log_history))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipeline", nargs="?", default=str(ROOT / "pipelines" / "trl-grpo.yaml"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--model", help="a model directory to start from (default: the pipeline's)")
    ap.add_argument("--output", default="trl-grpo-out", help="TRL's output_dir")
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    # the engines' start-up (minutes for vLLM on CPU) and any restart, as they go
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("prorsa.start").setLevel(logging.INFO)
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"error: --model: {args.model}: not a model directory (no config.json)")
    try:
        result = train(args.pipeline, steps=args.steps, output=args.output, model=args.model, lr=args.lr)
    except (ConfigError, RolloutError) as e:
        raise SystemExit(f"error: {e}") from None
    rows = [r for r in result.log if "loss" in r]
    for rec, row in zip(result.steps, rows):
        print(f"step {row['step']}: policy version {rec.version}, loss {row['loss']:.4f}, grad norm "
              f"{row['grad_norm']:.3f}, reward {row['reward']:.3f}, {rec.multi_turn} multi-turn trajectories, "
              f"{rec.env_masked} tool tokens masked")
    if not all(math.isfinite(r["loss"]) for r in rows):
        raise SystemExit("error: a loss was not finite")


if __name__ == "__main__":
    main()
