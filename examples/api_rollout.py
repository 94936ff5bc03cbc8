"""Prorsa's rollout driven from Python: the loop a trainer would run around it.

    python examples/api_rollout.py [PIPELINE] [--engine emulated|vllm] [--batches N]

The engines start once; each batch is rolled out on them, the trajectories come back typed
(token ids, loss mask, logprobs, reward, per-turn timings, policy version), and new weights go
into every engine in place between batches, as a trainer's step would push them.
"""

from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path

import prorsa

ROOT = Path(__file__).resolve().parents[1]


def trainer_weights(rollout: prorsa.Rollout):
    """Stands for a trainer's state dict after its step: the engines' own weights, read back."""
    if rollout.cfg.engines.backend != "vllm":
        return {}  # emulated engines run no model: an update only drops their cached prefixes
    from safetensors.torch import load_file

    from prorsa.engine.registry import resolve_model_dir

    return load_file(str(resolve_model_dir(rollout.cfg.engines) / "model.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipeline", nargs="?", default=str(ROOT / "pipelines" / "quickstart.yaml"))
    ap.add_argument("--engine", choices=["emulated", "vllm"], help="override engines.backend")
    ap.add_argument("--batches", type=int, default=2)
    args = ap.parse_args()
    # the engines' start-up (minutes for vLLM on CPU) and any restart, as they go
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("prorsa.start").setLevel(logging.INFO)
    overrides = {"engines.backend": args.engine} if args.engine else {}
    with prorsa.Rollout(args.pipeline, **overrides) as rollout:
        for b in range(args.batches):
            if b:
                version = rollout.update_weights(lambda: trainer_weights(rollout))
                print(f"pushed weights: policy version {version}")
            trajectories = []
            for t in rollout.stream(2):  # two prompts, each a group of workload.group_size
                trajectories.append(t)
                turn_s = sum(x.prefill_s + x.decode_s for x in t.turns)
                print(f"  {t.traj_id}: {t.status}, {len(t.turns)} turns, {sum(t.loss_mask)} generated "
                      f"token ids, engine time {turn_s:.3f}s, version {t.policy_version}")
            decode = [x.decode_tokens for t in trajectories for x in t.turns]
            print(f"batch {b}: {len(trajectories)} trajectories, {sum(decode)} tokens decoded, "
                  f"median span {statistics.median(t.end_s - t.start_s for t in trajectories):.3f}s")


if __name__ == "__main__":
    main()
