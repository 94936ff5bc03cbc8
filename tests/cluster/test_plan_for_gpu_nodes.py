"""A plan for GPU nodes from a machine without GPUs (--gpus-per-node, --devices): every engine's
command line and environment whole, pasteable (`vllm serve MODEL ...`, ports of its own), read by
vLLM's own argument parser, and the same as what an engine worker's start runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.cluster.launch_plan import launch_plan
from prorsa.config.pipeline import EnginesConfig
from prorsa.roles import Role

from .test_devices import _launch_recorded

REPO = Path(__file__).resolve().parents[2]
MOE, GROUPS, GPU = (str(REPO / "pipelines" / f) for f in ("gpu-moe.yaml", "gpu-moe-groups.yaml", "gpu.yaml"))
NO_GPUS = {"CUDA_VISIBLE_DEVICES": None}  # unset: this machine's GPUs are NVML's (none here)


def _commands(output: str) -> dict[str, tuple[dict[str, str], list[str]]]:
    """engine -> (environment, argv) of each command line the plan printed."""
    out = {}
    for line in output.splitlines():
        if not line.startswith("engine-"):
            continue
        name, _, shell = line.partition(": ")
        words = shlex.split(shell)
        at = next(i for i, w in enumerate(words) if "=" not in w)
        out[name] = dict(w.split("=", 1) for w in words[:at]), words[at:]
    return out


def _side_channels(env: dict[str, str], dp: int) -> set[int]:
    first = int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"])  # each DP rank opens the next one
    return set(range(first, first + dp))


def test_gpu_moe_plan_for_eight_gpu_nodes_passes_vllms_own_parser(tmp_path):
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    r = CliRunner().invoke(main, ["run", MOE, "--dry-run", "--gpus-per-node", "8", f"output_dir={tmp_path}"],
                           env=NO_GPUS)
    assert r.exit_code == 0, r.output
    assert "nodes: 1 of 8 GPUs (--gpus-per-node 8) for the engines' 8 GPUs" in r.output
    commands = _commands(r.output)
    assert list(commands) == ["engine-0", "engine-1"]
    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    gpus, ports, sides = [], set(), set()
    for env, argv in commands.values():
        assert argv[:2] == ["vllm", "serve"] and "<" not in " ".join(argv)  # no placeholder left
        args = parser.parse_args(argv[2:])
        cli_args.validate_parsed_serve_args(args)
        engine = AsyncEngineArgs.from_cli_args(args)
        assert args.model_tag == "models/Qwen3-30B-A3B"
        assert (engine.tensor_parallel_size, engine.data_parallel_size, engine.enable_expert_parallel) == (1, 4, True)
        # what the start sets: its own GPUs, side channels and port, networking kept on loopback
        gpus.append(env["CUDA_VISIBLE_DEVICES"].split(","))
        assert not sides & _side_channels(env, 4)
        sides |= _side_channels(env, 4)
        assert args.port not in ports
        ports.add(args.port)
        assert (env["UCX_NET_DEVICES"], env["VLLM_HOST_IP"]) == ("lo", "127.0.0.1")
    assert gpus == [["0", "1", "2", "3"], ["4", "5", "6", "7"]]
    assert not any(tmp_path.iterdir())  # nothing started, no run folder


def test_engines_wider_than_one_node_are_planned_over_as_many_nodes_as_they_take(tmp_path):
    r = CliRunner().invoke(main, ["validate", GROUPS, "--plan", "--gpus-per-node", "8"], env=NO_GPUS)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("ok: ")
    # 2 x 1 GPU + 3 x 8 GPUs = 26: the three wide engines a node each, the two narrow ones a fourth
    assert "nodes: 4 of 8 GPUs (--gpus-per-node 8) for the engines' 26 GPUs" in r.output
    runs_on = re.findall(r"│ (engine-\d) │ \w+ +│ (node \d): GPU ([\d,]+)", r.output)
    assert runs_on == [("engine-0", "node 3", "0"), ("engine-1", "node 3", "1"),
                       *((f"engine-{i}", f"node {i - 2}", "0,1,2,3,4,5,6,7") for i in (2, 3, 4))]


def test_devices_name_the_nodes_gpus():
    r = CliRunner().invoke(main, ["run", GPU, "--dry-run", "--devices", "4,5,6,7"], env=NO_GPUS)
    assert r.exit_code == 0, r.output
    assert [env["CUDA_VISIBLE_DEVICES"] for env, _ in _commands(r.output).values()] == ["4", "5", "6", "7"]


@pytest.mark.parametrize(("args", "message"), [
    (["run", GPU, "--gpus-per-node", "8"], "--gpus-per-node and --devices say which node a plan is for: give --dry-run"),
    (["run", GPU, "--dry-run", "--gpus-per-node", "4", "--devices", "0,1"], "--gpus-per-node 4 but --devices lists 2"),
    (["run", GPU, "--dry-run", "--devices", "0,,1"], "--devices: got '0,,1'"),
    (["validate", GPU, "--gpus-per-node", "8"], "give --plan too"),
])
def test_a_node_given_wrongly_is_one_error_line(args, message):
    r = CliRunner().invoke(main, args, env=NO_GPUS)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and message in r.output, r.output


def test_validate_plan_never_says_ok_before_an_error():
    r = CliRunner().invoke(main, ["validate", "--plan", GPU, MOE], env=NO_GPUS)
    assert r.exit_code == 2
    assert "ok:" not in r.output and r.output.count("error: ") == 2, r.output
    assert "no GPU was found (NVML)" in r.output and "--gpus-per-node N" in r.output


def test_the_plan_prints_the_command_and_environment_an_engine_worker_starts(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 32}')
    engines = EnginesConfig(backend="vllm", count=2, devices=[4, 5, 6, 7],
                            vllm={"device": "cuda", "model": str(model), "tensor_parallel_size": 2,
                                  "start_timeout_s": 60})
    planned = launch_plan(engines, [Role.PREFILL, Role.DECODE], environ={})[1]
    started_env, started_args = _launch_recorded(tmp_path, monkeypatch, engines, index=1)
    # the worker runs our launcher (it watches its owner), with vLLM's arguments exactly as planned
    assert planned.command[:3] == ("vllm", "serve", str(model)) and not planned.launcher
    planned_args = " ".join(["-m", "prorsa.engine.vllm._launch", "--model", *planned.command[2:]])
    assert re.sub(r"--port \d+", "--port P", started_args.strip()) == re.sub(r"--port \d+", "--port P", planned_args)
    for key, value in planned.env:
        assert key in started_env, key
        assert started_env[key] == value or key == "VLLM_NIXL_SIDE_CHANNEL_PORT"  # a start picks free ports
