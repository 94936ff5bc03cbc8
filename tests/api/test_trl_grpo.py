"""examples/trl_grpo.py: TRL's GRPOTrainer trains on Prorsa's rollouts.

Fast: a multi-turn trajectory becomes TRL's prompt_ids / completion_ids / env_mask / logprobs with
the tool's tokens masked out, and what TRL cannot pair by position is refused. Slow: two TRL steps
on the tiny model, with real vLLM CPU engines (PD split) rolling out between weight pushes.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

from prorsa.api import Trajectory

pytest.importorskip("trl")  # the [trl] extra

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("trl_grpo", ROOT / "examples" / "trl_grpo.py")
trl_grpo = importlib.util.module_from_spec(_spec)
sys.modules["trl_grpo"] = trl_grpo  # dataclasses look their module up there
_spec.loader.exec_module(trl_grpo)


def _trajectory(traj_id="s0-p0-g0", status="completed", mask=(0, 0, 0, 1, 1, 0, 0, 1, 1, 1), reward=1.0):
    ids = tuple(range(100, 100 + len(mask)))
    logprobs = tuple(-0.5 if m else 0.0 for m in mask)
    return Trajectory(traj_id=traj_id, task_id="t", status=status, error="" if status == "completed" else "engine died",
                      reward=reward, policy_version=3, token_ids=ids, loss_mask=tuple(mask),
                      rollout_logprobs=logprobs, turns=(), start_s=0.0, end_s=1.0)


def test_a_multi_turn_trajectory_maps_to_trl_with_the_tool_tokens_masked():
    out = trl_grpo.trl_batch([_trajectory(), _trajectory("s0-p0-g1", mask=(0, 0, 1, 1), reward=0.0)])
    assert out["prompt_ids"] == [[100, 101, 102], [100, 101]]
    assert out["completion_ids"] == [[103, 104, 105, 106, 107, 108, 109], [102, 103]]
    assert out["env_mask"] == [[1, 1, 0, 0, 1, 1, 1], [1, 1]]  # the observation (105, 106) is the tool's
    assert out["logprobs"] == [[-0.5, -0.5, 0.0, 0.0, -0.5, -0.5, -0.5], [-0.5, -0.5]]
    assert out["prorsa_reward"] == [1.0, 0.0] and out["generated_tokens"] == [5, 2]
    assert all(len(c) == len(m) == len(lp) for c, m, lp in zip(out["completion_ids"], out["env_mask"],
                                                                 out["logprobs"]))


def test_a_failed_or_empty_trajectory_is_refused_by_name():
    with pytest.raises(trl_grpo.RolloutError, match="s0-p1-g0: failed .engine died."):
        trl_grpo.trl_batch([_trajectory(), _trajectory("s0-p1-g0", status="failed")])
    with pytest.raises(trl_grpo.RolloutError, match="s0-p0-g0: no generated tokens"):
        trl_grpo.trl_batch([_trajectory(mask=(0, 0, 0))])


def test_prompts_must_come_in_whole_groups_of_the_pipelines_size():
    assert trl_grpo.groups_of(["a", "a", "b", "b"], 2) == ["a", "b"]
    for bad in (["a", "a", "b"], ["a", "b", "a", "b"]):
        with pytest.raises(trl_grpo.RolloutError, match="workload.group_size"):
            trl_grpo.groups_of(bad, 2)


@pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)
@pytest.mark.timeout(1500)  # the warm-up, then two engines' start: 10 minutes on a loaded 2-core machine
def test_two_trl_steps_train_on_prorsa_rollouts_and_each_new_version_reaches_the_engines(tmp_path):
    import torch
    from safetensors.torch import load_file

    # the supervised warm-up first: a model that calls the calculator only sometimes, so the
    # environment's reward differs within a group and GRPO has an advantage to follow
    warm = tmp_path / "sft"
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "sft", "--output", str(warm)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    start = load_file(str(warm / "model.safetensors"))

    result = trl_grpo.train(ROOT / "pipelines" / "trl-grpo.yaml", steps=2, output=tmp_path / "out", model=str(warm),
                            **{"engines.vllm.start_timeout_s": 900})  # a loaded CI machine starts servers slowly

    # every step pushed the trainer's weights first, and its trajectories were sampled under them
    assert [s.version for s in result.steps] == [1, 2]
    assert [s.versions_seen for s in result.steps] == [[1] * 8, [2] * 8]
    assert sum(s.multi_turn for s in result.steps) > 0 and sum(s.env_masked for s in result.steps) > 0
    rows = [r for r in result.log if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows)
    trained = result.trainer.accelerator.unwrap_model(result.trainer.model).state_dict()
    assert set(start) <= set(trained)
    assert any(not torch.equal(start[k], trained[k].detach().cpu()) for k in start)
