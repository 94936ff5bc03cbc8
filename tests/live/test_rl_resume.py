"""A training run on vLLM CPU engines, stopped and resumed (`prorsa run --resume`), and one whose
steps a trainer of the user's own takes (train.trainer: examples/custom_trainer.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file

from prorsa.train.export import read_batch

pytestmark = pytest.mark.vllm  # slow, and skipped without vLLM (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, GROUP = 4, 2, 4
BATCH = PROMPTS * GROUP


# Without the warm-up the tiny model never calls the calculator, so tool_use would reward every
# trajectory 0 and no update would move the weights; this reward differs within every group.
REWARD = """def by_length(task, response):
    return (len(response) % 5) / 4
"""


def _pipeline(tmp_path: Path, steps: int, **train) -> Path:
    """pipelines/rl-toy.yaml made small: no warm-up, one engine, 2 x 4 trajectories a step, each
    trajectory journalled as it finishes."""
    cfg = yaml.safe_load((ROOT / "pipelines" / "rl-toy.yaml").read_text())
    cfg["name"] = "rl-resume"
    cfg["policy"] = "colocated"
    cfg["engines"]["count"] = 1
    cfg["workload"] |= {"prompts": PROMPTS, "group_size": GROUP, "steps": steps}
    cfg["environment"] |= {"tasks": 32, "reward": "length_reward:by_length"}
    cfg["train"] |= {"sft_steps": 0, "micro_batch": 4} | train
    cfg["runtime"] |= {"output_batch": 1}
    (tmp_path / "length_reward.py").write_text(REWARD)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    """The reward's module importable in the driver and the tool workers."""
    return os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}


def _committed(run_dir: Path) -> int:
    try:
        return json.loads((run_dir / "manifest.json").read_text())["trajectories"]
    except (OSError, ValueError, KeyError):
        return 0


def _prorsa(tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=_env(tmp_path))
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def _engines_model() -> Path:
    from prorsa.config.load import load_pipeline
    from prorsa.engine.registry import resolve_model_dir

    return resolve_model_dir(load_pipeline(ROOT / "pipelines" / "rl-toy.yaml").engines)


def _updates(run_dir: Path) -> list[dict]:
    path = run_dir / "train.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _adam_steps(run_dir: Path) -> set[int]:
    state = torch.load(run_dir / "trainer-state" / "trainer" / "trainer.pt", weights_only=False)
    return {int(s["step"]) for s in state["optimizer"]["state"].values()}


@pytest.mark.timeout(2400)  # two sessions, each starting its engine
def test_a_training_run_stopped_after_an_update_resumes_at_the_next_step(tmp_path):
    pipeline = _pipeline(tmp_path, STEPS)
    out = tmp_path / "runs"
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: nobody reads it while the run goes on
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), f"output_dir={out}"],
                            stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True,
                            env=_env(tmp_path))
    try:
        deadline = time.monotonic() + 1200
        # stopped within step 1: its first trajectories journalled, no update has taken them
        while not ((run_dirs := list(out.glob("rl-resume-*"))) and len(_updates(run_dirs[0])) >= 1
                   and _committed(run_dirs[0]) >= BATCH + 2):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before step 1"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the session keeps what finished and stops
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log.seek(0)
    text = log.read()
    assert proc.returncode == 2 and "prorsa run --resume" in text, text[-4000:]
    (run_dir,) = run_dirs
    state = json.loads((run_dir / "trainer-state" / "learner.json").read_text())
    k = state["version"]
    assert 1 <= k < STEPS - 1, f"stopped after update {k}: too late to leave a step for the resume"
    assert _adam_steps(run_dir) == {k}  # one AdamW update per step (grad_accum unset)
    saved_before = set(state["taken"])
    print(f"stopped after update {k} with {_committed(run_dir)} trajectories saved")
    v_k = load_file(str(run_dir / "weights" / f"v{k}" / "model.safetensors"))

    resumed = _prorsa(tmp_path, "run", "--resume", str(run_dir), timeout=1500)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    ups = _updates(run_dir)
    assert [u["version"] for u in ups] == list(range(1, STEPS))  # every update once, none redone
    assert all(u["trajectories"] == BATCH for u in ups)
    assert _adam_steps(run_dir) == {STEPS - 1}  # the moments went on from the saved ones
    t = pq.read_table(run_dir / "trajectories.parquet", columns=["traj_id", "step", "policy_version"]).to_pandas()
    assert len(t) == STEPS * BATCH and t["traj_id"].is_unique  # none lost, none twice
    assert (t["policy_version"] == t["step"]).all()  # step s rolled out by version s, across the stop
    taken = json.loads((run_dir / "trainer-state" / "learner.json").read_text())["taken"]
    assert len(taken) == len(set(taken)) == (STEPS - 1) * BATCH and saved_before <= set(taken)
    for v in range(STEPS - 1):  # each batch trained once, by the version that rolled it out
        assert {e.sample.policy_version for e in read_batch(run_dir / "batches" / f"v{v}.parquet")} == {v}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train"]["policy_versions"] == STEPS - 1  # over both sessions
    assert summary["train"]["trained_trajectories"] == (STEPS - 1) * BATCH
    assert summary["trajectories_resumed"] > 0
    v_last = load_file(str(run_dir / "weights" / f"v{STEPS - 1}" / "model.safetensors"))
    assert any(not torch.equal(v_k[n], v_last[n]) for n in v_k)  # the resumed updates moved the weights


@pytest.mark.timeout(1500)
def test_a_trainer_of_ones_own_takes_the_steps_and_the_engines_get_its_weights(tmp_path):
    pipeline = _pipeline(tmp_path, 2, trainer="examples.custom_trainer:ReinforceTrainer", lr=5e-4)
    proc = _prorsa(tmp_path, "run", str(pipeline), f"output_dir={tmp_path / 'runs'}", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    (update,) = _updates(run_dir)
    assert update["version"] == 1 and update["trajectories"] == BATCH and update["push_s"] > 0
    t = pq.read_table(run_dir / "trajectories.parquet", columns=["step", "policy_version"]).to_pandas()
    assert (t["policy_version"] == t["step"]).all() and set(t["step"]) == {0, 1}  # step 1 on its weights
    assert (run_dir / "weights" / "v1" / "model.safetensors").is_file()
    start = load_file(str(_engines_model() / "model.safetensors"))
    mine = load_file(str(run_dir / "weights" / "v1" / "model.safetensors"))
    assert any(not torch.equal(start[n], mine[n]) for n in start)  # REINFORCE's step, not a copy
    assert len(read_batch(run_dir / "batches" / "v0.parquet")) == BATCH
    assert (run_dir / "trainer-state" / "trainer" / "reinforce.pt").is_file()
