"""train.trainer: a trainer of the user's own (examples/custom_trainer.py, REINFORCE in plain
torch) in the RL loop in place of GRPO: checked when the pipeline loads (one error line naming
train.trainer), stepped by the learner, its weights saved as the next version for the engines and
its batch exported, its state saved and restored like the built-in trainer's."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from prorsa.config.pipeline import TrainConfig
from prorsa.train.export import read_batch
from prorsa.train.learner import Learner, LearnerFiles
from prorsa.train.protocol import PolicyTrainer, make_trainer

from step_results import BATCH, step_result as _result

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples.custom_trainer:ReinforceTrainer"


def _validate(tmp_path, trainer: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cfg = yaml.safe_load((ROOT / "pipelines" / "rl-toy.yaml").read_text())
    cfg["train"]["trainer"] = trainer
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "half_trainer.py").write_text("class OnlyStep:\n    version = 0\n    def step(self, s, a): ...\n")
    return subprocess.run([sys.executable, "-m", "prorsa.cli", "validate", str(tmp_path / "p.yaml")],
                          capture_output=True, text=True, timeout=300, cwd=cwd or tmp_path)


@pytest.mark.parametrize("trainer, says", [
    ("no_such_module:Trainer", "cannot import no_such_module (ModuleNotFoundError"),
    ("half_trainer:Missing", "half_trainer has no class Missing"),
    ("half_trainer:OnlyStep", "OnlyStep lacks the trainer protocol's save, save_state, load_state"),
    ("half_trainer.OnlyStep", 'expected "package.module:ClassName"'),
])
def test_a_trainer_that_does_not_import_or_lacks_a_method_is_one_error_line(tmp_path, trainer, says):
    proc = _validate(tmp_path, trainer)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: ") and "train.trainer" in line and says in line, line
    assert "Traceback" not in proc.stdout + proc.stderr


def test_the_example_trainer_validates_from_the_working_directory(tmp_path):
    proc = _validate(tmp_path, EXAMPLE, cwd=ROOT)  # the repository root, where examples/ is
    assert proc.returncode == 0, proc.stderr


def test_the_example_trainer_steps_in_the_learner_and_its_weights_are_the_next_version(tiny_dir, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.chdir(ROOT)  # where a user names examples.custom_trainer from
    pushed = []

    async def push(path):
        pushed.append(path)

    def open_learner():
        cfg = TrainConfig(lr=1e-3, trainer=EXAMPLE)
        trainer = make_trainer(cfg.trainer, tiny_dir, cfg, builtin=lambda: pytest.fail("the built-in trainer"))
        assert isinstance(trainer, PolicyTrainer) and type(trainer).__name__ == "ReinforceTrainer"
        return trainer, Learner(cfg, trainer, tmp_path / "weights", push, BATCH, "sync",
                                files=LearnerFiles(batches_dir=tmp_path / "batches", state_dir=tmp_path / "state"))

    trainer, learner = open_learner()
    for i in range(BATCH):
        learner.on_done(_result(0, i, 0))
    asyncio.run(learner.update())
    assert learner.version == trainer.version == 1 and pushed == [tmp_path / "weights" / "v1"]
    record = learner.records[0]
    assert record.trajectories == BATCH and record.tokens == 4 * BATCH and torch.isfinite(torch.tensor(record.loss))
    before = load_file(str(tiny_dir / "model.safetensors"))
    after = load_file(str(tmp_path / "weights" / "v1" / "model.safetensors"))
    assert any(not torch.equal(before[n], after[n]) for n in before)  # the step moved the weights
    exported = read_batch(tmp_path / "batches" / "v0.parquet")  # written for any trainer, not GRPO's alone
    assert len(exported) == BATCH and {e.sample.policy_version for e in exported} == {0}

    again, resumed = open_learner()
    asyncio.run(resumed.load_state())
    assert resumed.version == again.version == 1 and again.baseline == trainer.baseline
    for (name, a), b in zip(trainer.model.state_dict().items(), again.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_step_that_does_not_move_the_version_by_one_is_an_error(tiny_dir, tmp_path):
    class Stuck:
        version = 0

        def step(self, samples, advantages):
            return {"loss": 0.0}

    async def push(path):
        pass

    learner = Learner(TrainConfig(), Stuck(), tmp_path / "weights", push, BATCH, "sync")
    for i in range(BATCH):
        learner.on_done(_result(0, i, 0))
    with pytest.raises(RuntimeError, match="Stuck.step moved version 0 -> 0"):
        asyncio.run(learner.update())
