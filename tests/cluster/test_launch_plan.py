"""The dry run: every engine's GPUs or cores, role, layout, server command line and environment,
nothing started; the command lines are ones vLLM's own argument parser accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.cluster.launch_plan import launch_plan
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
        assert dict(p.env)["CUDA_VISIBLE_DEVICES"] == p.gpus[0]
        assert p.shell().startswith(f"CUDA_VISIBLE_DEVICES={p.gpus[0]} ")
    # side by side on one node: ports of their own, and the start's loopback-only networking
    assert len({p.port for p in plans}) == 4
    assert len({dict(p.env)["VLLM_NIXL_SIDE_CHANNEL_PORT"] for p in plans}) == 4
    assert {dict(p.env)["UCX_NET_DEVICES"] for p in plans} == {"lo"}


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
    assert [p.runs_on for p in plans] == ["4 GPUs of its job"] * 2
    assert "CUDA_VISIBLE_DEVICES" not in dict(plans[0].env)


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
            argv = list(plan.command)
            # CUDA: vLLM's own command; CPU: our launcher, vLLM's api_server entry point behind it
            cpu = path == QUICKSTART
            assert argv[:2] == (["python", "-m"] if cpu else ["vllm", "serve"]) and bool(plan.launcher) == cpu
            args = parser.parse_args(argv[3:] if cpu else argv[2:])
            cli_args.validate_parsed_serve_args(args)
            engine = AsyncEngineArgs.from_cli_args(args)
            assert (engine.tensor_parallel_size, engine.data_parallel_size, engine.enable_expert_parallel) == (tp, dp, ep)
            assert shlex.split(plan.shell())[len(plan.env):] == list(plan.command)


GROUPS = str(REPO / "pipelines" / "gpu-moe-groups.yaml")
THIRTY_TWO_GPUS = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(32)))}


def test_engine_groups_get_their_own_gpu_counts_and_command_lines():
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cfg = load_pipeline(GROUPS)
    roles = [Role.PREFILL] * 2 + [Role.DECODE] * 3
    plans = launch_plan(hosted_engines(cfg), roles, environ=THIRTY_TWO_GPUS, count_gpus=lambda: 0)
    # the wide engines first on the node, each on an aligned 8-GPU slice; the 1-GPU ones after them
    assert [p.gpus for p in plans] == [("24",), ("25",), *(tuple(map(str, range(k, k + 8))) for k in (0, 8, 16))]
    assert [p.layout for p in plans] == ["tp1"] * 2 + ["tp1 x dp8 ep"] * 3
    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    for plan, want in zip(plans, [(1, 1, False)] * 2 + [(1, 8, True)] * 3):
        assert plan.command[:3] == ("vllm", "serve", "models/Qwen3-30B-A3B")
        args = parser.parse_args(list(plan.command[2:]))
        cli_args.validate_parsed_serve_args(args)
        engine = AsyncEngineArgs.from_cli_args(args)
        assert (engine.tensor_parallel_size, engine.data_parallel_size, engine.enable_expert_parallel) == want
        assert dict(plan.env)["CUDA_VISIBLE_DEVICES"] == ",".join(plan.gpus)


def test_engine_groups_that_do_not_fit_the_node_are_refused_in_one_line():
    r = CliRunner().invoke(main, ["run", GROUPS, "--dry-run"], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "engines.groups: 2 x 1 GPU + 3 x 8 GPUs = 26 GPUs, but the node has 8" in r.output
    r = CliRunner().invoke(main, ["run", GROUPS, "--dry-run"], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert r.exit_code == 2 and "an engine of tp 1 x dp 8 = 8 GPUs is larger than the node's 4 GPUs" in r.output


def test_dry_run_of_engine_groups_prints_each_engines_gpus(tmp_path):
    r = CliRunner().invoke(main, ["run", GROUPS, "--dry-run", f"output_dir={tmp_path}"], env=THIRTY_TWO_GPUS)
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("engine-")]
    assert [ln.split()[1] for ln in lines] == ["CUDA_VISIBLE_DEVICES=24", "CUDA_VISIBLE_DEVICES=25",
                                               "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7",
                                               "CUDA_VISIBLE_DEVICES=8,9,10,11,12,13,14,15",
                                               "CUDA_VISIBLE_DEVICES=16,17,18,19,20,21,22,23"]
    assert "--data-parallel-size 8" in lines[2] and "--data-parallel-size" not in lines[0]
    assert not any(tmp_path.iterdir())


def test_each_engine_worker_of_a_group_takes_its_groups_slots(tmp_path):
    from prorsa.cluster.jobs import engine_gpus
    from prorsa.cluster.local import worker_specs
    from prorsa.config.cluster import JobSettings

    cfg = load_pipeline(GROUPS)
    roles = [Role.PREFILL] * 2 + [Role.DECODE] * 3
    specs = worker_specs(cfg, roles, tmp_path)
    assert [specs[f"engine-{i}"]["options"]["nthreads"] for i in range(5)] == [16, 16, 128, 128, 128]
    assert specs["engine-0"]["options"]["resources"]["prefill"] == 16
    # a batch job books its own engine's GPUs
    assert [engine_gpus(JobSettings(), cfg.engines, i) for i in range(5)] == [1, 1, 8, 8, 8]


def test_a_cpu_dp_engine_gets_a_core_per_rank_and_the_dp_patch():
    plans = _plan(str(REPO / "pipelines" / "cpu-moe-dp.yaml"))
    assert [p.layout for p in plans] == ["tp1", "tp1 x dp2 ep"]
    prefill, decode = (dict(p.env) for p in plans)
    assert "PRORSA_CPU_DP" not in prefill and "|" not in prefill["VLLM_CPU_OMP_THREADS_BIND"]
    assert decode["PRORSA_CPU_DP"] == "1" and len(decode["VLLM_CPU_OMP_THREADS_BIND"].split("|")) == 2
    for p in plans:  # the tiny MoE, made on first use
        assert Path(p.command[p.command.index("--model") + 1]).name.startswith("tiny-qwen3moe")
