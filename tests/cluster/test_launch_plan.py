"""The dry run: every engine's GPUs or cores, role, layout and server command line, nothing started;
the command lines are ones vLLM's own argument parser accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.cluster.launch_plan import PORT, launch_plan
from prorsa.config.load import load_pipeline
from prorsa.engine.registry import hosted_engines
from prorsa.roles import Role

REPO = Path(__file__).resolve().parents[2]
GPU, MOE, QUICKSTART = (str(REPO / "pipelines" / f) for f in ("gpu.yaml", "gpu-moe.yaml", "quickstart.yaml"))
EIGHT_GPUS = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def _plan(path: str, overrides: dict | None = None, environ: dict | None = None, count_gpus=lambda: 0):
    cfg = load_pipeline(path, overrides)
    roles = [Role.PREFILL] + [Role.DECODE] * (cfg.engines.count - 1)
    return launch_plan(hosted_engines(cfg), roles, environ=environ if environ is not None else {}, count_gpus=count_gpus)


def test_gpu_pipeline_on_an_eight_gpu_node_puts_four_engines_on_four_gpus():
    plans = _plan(GPU, count_gpus=lambda: 8)  # a fake NVML count: no CUDA_VISIBLE_DEVICES set
    assert [p.gpus for p in plans] == [("0",), ("1",), ("2",), ("3",)]
    for p in plans:
        assert dict(p.env) == {"CUDA_VISIBLE_DEVICES": p.gpus[0]}
        assert p.shell().startswith(f"CUDA_VISIBLE_DEVICES={p.gpus[0]} ")


def test_moe_pipeline_gives_each_dp_attention_engine_four_gpus():
    plans = _plan(MOE, environ=EIGHT_GPUS)
    assert [p.gpus for p in plans] == [("0", "1", "2", "3"), ("4", "5", "6", "7")]
    assert {p.layout for p in plans} == {"tp1 x dp4 ep"}


def test_cpu_engines_are_planned_on_cores_without_gpus():
    plans = _plan(QUICKSTART, environ=EIGHT_GPUS)
    assert all(p.gpus is None and "CUDA_VISIBLE_DEVICES" not in dict(p.env) for p in plans)
    assert plans[0].runs_on.startswith("cores ")


def test_engines_joining_from_batch_jobs_take_their_jobs_gpus():
    cfg = load_pipeline(MOE)
    plans = launch_plan(cfg.engines, [Role.MIXED] * 2, local=False, environ={}, count_gpus=lambda: 0)
    assert [p.runs_on for p in plans] == ["4 GPUs of its job"] * 2 and not plans[0].env


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    r = CliRunner().invoke(main, ["run", GPU, "--dry-run", f"output_dir={tmp_path}",
                                  "engines.vllm.tensor_parallel_size=2"], env=EIGHT_GPUS)
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("engine-")]
    assert [ln.split()[1] for ln in lines] == [f"CUDA_VISIBLE_DEVICES={g}" for g in ("0,1", "2,3", "4,5", "6,7")]
    assert "prefill" in r.output and "decode" in r.output and "tp2" in r.output
    assert not any(tmp_path.iterdir())  # no run directory


@pytest.mark.parametrize(("args", "message"), [
    (["engines.vllm.tensor_parallel_size=3"], "do not divide into engines of tp 3"),
    (["engines.vllm.tensor_parallel_size=16"], "is larger than the node's 8 GPUs"),
    (["engines.count=9", "policy=static:1:8"], "engines.count: 9 engines x 1 GPU = 9 GPUs, but the node has 8"),
])
def test_engines_that_do_not_fit_are_refused_in_one_line(args, message):
    r = CliRunner().invoke(main, ["run", GPU, "--dry-run", *args], env=EIGHT_GPUS)
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and r.output.startswith("error: ") and message in r.output, r.output


def test_validate_refuses_a_listed_device_list_too_small(tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text(Path(GPU).read_text().replace("  count: 4", "  count: 4\n  devices: [0, 1, 2]"))
    r = CliRunner().invoke(main, ["validate", str(small)])
    assert r.exit_code == 2 and "4 engines x 1 GPU = 4 GPUs, but the node has 3 (engines.devices)" in r.output
    r = CliRunner().invoke(main, ["validate", "--plan", MOE], env=EIGHT_GPUS)
    assert r.exit_code == 0 and "GPU 4,5,6,7" in r.output


def test_vllms_own_parser_accepts_every_planned_command_line():
    # one test for every layout: importing vLLM's parser takes seconds
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    cases = [(QUICKSTART, {}, (1, 1, False)), (GPU, {"engines.vllm.tensor_parallel_size": 2}, (2, 1, False)),
             (MOE, {}, (1, 4, True)),
             (MOE, {"engines.vllm.tensor_parallel_size": 2, "engines.vllm.data_parallel_size": 2}, (2, 2, True))]
    for path, overrides, (tp, dp, ep) in cases:
        for plan in _plan(path, overrides, environ=EIGHT_GPUS):
            argv = [a if a != PORT else "8000" for a in plan.command]
            assert argv[1:3] == ["-m", "prorsa.engine.vllm._launch"]  # vLLM's api_server entry point behind it
            args = parser.parse_args(argv[3:])
            cli_args.validate_parsed_serve_args(args)
            engine = AsyncEngineArgs.from_cli_args(args)
            assert (engine.tensor_parallel_size, engine.data_parallel_size, engine.enable_expert_parallel) == (tp, dp, ep)
            assert shlex.split(plan.shell())[len(plan.env):] == list(plan.command)
