"""train.placement: a bad value is one error line naming it; `worker` adds one worker that declares
{"trainer": 1} to the local cluster and one job to a batch run; `driver` (the default) adds none."""

from __future__ import annotations

import pytest

from prorsa.cluster.jobs import job_scripts, run_jobs
from prorsa.cluster.local import TRAINER_NAME, worker_specs
from prorsa.config.cluster import JobSettings, SlurmSpec
from prorsa.config.load import ConfigError, load_pipeline
from prorsa.control.policy import make_policy

RL = """\
name: t
policy: static:1:1
engines: {{backend: vllm, count: 2, slots: 4, vllm: {{model: {model}}}}}
workload: {{family: math-tir, prompts: 2, group_size: 2, steps: 1}}
environment: {{mode: live, dataset: arith, tools: [calculator], reward: tool_use}}
train: {train}
"""


def rl_pipeline(tmp_path, train: str = "{}"):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")  # a model directory as far as the cluster spec looks
    path = tmp_path / "p.yaml"
    path.write_text(RL.format(model=model, train=train))
    cfg = load_pipeline(path)
    return cfg, make_policy(cfg.policy).initial_roles(cfg.engines.count)


def test_a_bad_placement_is_one_line_naming_the_field_and_the_choices(tmp_path):
    with pytest.raises(ConfigError) as err:
        rl_pipeline(tmp_path, "{placement: gpu}")
    msg = str(err.value)
    assert "\n" not in msg
    for needle in ("train.placement", "gpu", "driver", "worker"):
        assert needle in msg, (needle, msg)


def test_the_trainer_stays_in_the_driver_by_default(tmp_path):
    cfg, roles = rl_pipeline(tmp_path)
    assert cfg.train.placement == "driver"
    assert TRAINER_NAME not in worker_specs(cfg, roles, tmp_path)
    assert TRAINER_NAME not in run_jobs(SlurmSpec(), cfg, roles)


def test_placement_worker_adds_a_trainer_worker_and_nothing_else_declares_it(tmp_path):
    cfg, roles = rl_pipeline(tmp_path, "{placement: worker}")
    specs = worker_specs(cfg, roles, tmp_path)
    assert list(specs) == ["engine-0", "engine-1", "tools-0", TRAINER_NAME]
    trainer = specs[TRAINER_NAME]["options"]
    assert trainer["resources"]["trainer"] == 1 and trainer["nthreads"] == 1 and not trainer.get("plugins")
    assert all(s["options"]["resources"].get("trainer", 0) == 0 for name, s in specs.items() if name != TRAINER_NAME)


def test_a_batch_run_submits_one_trainer_job_with_its_cores(tmp_path):
    cfg, roles = rl_pipeline(tmp_path, "{placement: worker}")
    spec = SlurmSpec(trainer=JobSettings(cpus=6, memory="24GB"))
    jobs = run_jobs(spec, cfg, roles)
    assert list(jobs)[-1] == TRAINER_NAME
    script = job_scripts(spec, jobs, "tcp://10.1.2.3:8786")[TRAINER_NAME]
    assert "#SBATCH --cpus-per-task=6" in script and "--gres" not in script
    assert f"--name {TRAINER_NAME} --nthreads 6 " in script
    assert "--resources prefill=0,decode=0,env=0,trainer=1" in script
