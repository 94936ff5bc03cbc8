"""Engines larger than a node: DP-attention ranks split over nodes, a leader and headless
followers whose command lines vLLM's own parser accepts; refusals in one line."""

from __future__ import annotations

import asyncio
import re

from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.cluster import engine_host
from prorsa.cluster.devices import DevicePlanError
from prorsa.cluster.hosts import WorkerEngineHost
from prorsa.cluster.jobs import run_jobs
from prorsa.cluster.launch_plan import LEADER_HOST, RPC_PORT, launch_plan
from prorsa.cluster.nodes import node_args, span_nodes
from prorsa.config.cluster import load_cluster
from prorsa.config.layout import EngineLayout
from prorsa.config.load import load_pipeline
from prorsa.engine.registry import hosted_engines
from prorsa.roles import Role

REPO = Path(__file__).resolve().parents[2]
GROUPS = REPO / "pipelines" / "gpu-moe-groups.yaml"
EIGHT_GPUS = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


@pytest.fixture
def files(tmp_path):
    """Two 1-GPU prefill engines and one 16-GPU DP-attention decode engine; SLURM jobs of 8 GPUs."""
    text = GROUPS.read_text()
    assert "    - count: 3\n" in text and "data_parallel_size: 8 " in text  # what is changed below
    pipeline = tmp_path / "wide.yaml"
    pipeline.write_text(text.replace("    - count: 3\n", "    - count: 1\n")
                        .replace("data_parallel_size: 8 ", "data_parallel_size: 16 "))
    slurm = (REPO / "cluster" / "slurm.yaml").read_text()
    assert "  gpus: null " in slurm
    cluster = tmp_path / "slurm8.yaml"
    cluster.write_text(slurm.replace("  gpus: null ", "  gpus: 8 #"))
    return pipeline, cluster


@pytest.mark.parametrize(("tp", "dp", "node_gpus", "nodes", "local_dp", "starts"), [
    (1, 16, 8, 2, 8, [0, 8]),
    (2, 12, 8, 3, 4, [0, 4, 8]),  # 24 GPUs: three nodes of four 2-GPU ranks
    (4, 4, 8, 2, 2, [0, 2]),
    (1, 32, 8, 4, 8, [0, 8, 16, 24]),
    (3, 6, 8, 3, 2, [0, 2, 4]),  # 18 GPUs: 6 of each node's 8, as a tp 3 rank cannot use the rest
])
def test_ranks_split_evenly_over_the_fewest_nodes(tp, dp, node_gpus, nodes, local_dp, starts):
    span = span_nodes(EngineLayout(tp, dp, True), node_gpus)
    assert (span.nodes, span.local_dp) == (nodes, local_dp)
    assert [span.start_rank(k) for k in range(nodes)] == starts
    assert span.local_dp * tp <= node_gpus
    with pytest.raises(IndexError):
        span.start_rank(nodes)


def test_an_engine_that_fits_a_node_spans_none():
    assert span_nodes(EngineLayout(1, 8, True), 8) is None
    assert span_nodes(EngineLayout(2, 2), 8) is None


@pytest.mark.parametrize(("layout", "message"), [
    (EngineLayout(16, 2), "engines.vllm: tensor_parallel_size 16 is larger than a node's 8 GPUs (engines.gpus)"),
    (EngineLayout(1, 9), "engines.vllm: data_parallel_size 9 does not divide evenly over the 2 nodes of 8 GPUs"),
    (EngineLayout(3, 5), "engines.vllm: data_parallel_size 5 does not divide evenly over the 2 nodes"),
])
def test_layouts_that_cannot_span_nodes_are_refused(layout, message):
    with pytest.raises(DevicePlanError, match="^" + re.escape(message)):
        span_nodes(layout, 8)


def test_only_followers_are_headless_and_given_their_start_rank():
    span = span_nodes(EngineLayout(1, 16, True), 8)
    assert node_args(span, 0, "h0", 13345) == ["--data-parallel-size-local", "8", "--data-parallel-address", "h0",
                                               "--data-parallel-rpc-port", "13345"]
    assert node_args(span, 1, "h0", 13345) == ["--headless", "--data-parallel-size-local", "8",
                                               "--data-parallel-start-rank", "8", "--data-parallel-address", "h0",
                                               "--data-parallel-rpc-port", "13345"]


def _wide_plan(files):
    cfg = load_pipeline(str(files[0]))
    roles = [Role.PREFILL] * 2 + [Role.DECODE]
    return launch_plan(hosted_engines(cfg), roles, local=False, environ={}, count_gpus=lambda: 0, node_gpus=8)


def test_vllms_own_parser_reads_the_leader_and_the_follower(files):
    cli_args = pytest.importorskip("vllm.entrypoints.launchers.cli_args")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    plans = _wide_plan(files)
    assert [len(p.followers) for p in plans] == [0, 0, 1]
    wide = plans[2]
    assert wide.runs_on == "2 jobs of 8 GPUs" and wide.layout == "tp1 x dp16 ep"
    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    filled = {LEADER_HOST: "node-a"}
    seen = []
    for command in (wide.command, *wide.followers):
        argv = [filled.get(a, a) for a in command]
        assert argv[:3] == ["vllm", "serve", "models/Qwen3-30B-A3B"]  # the leader's and the --headless follower's
        args = parser.parse_args(argv[2:])
        cli_args.validate_parsed_serve_args(args)
        engine = AsyncEngineArgs.from_cli_args(args)
        assert (engine.tensor_parallel_size, engine.data_parallel_size, engine.enable_expert_parallel) == (1, 16, True)
        assert (engine.data_parallel_address, engine.data_parallel_rpc_port) == ("node-a", RPC_PORT + 2)
        seen.append((args.headless, engine.data_parallel_size_local, engine.data_parallel_start_rank))
    assert seen == [(False, 8, None), (True, 8, 8)]
    for p in plans[:2]:  # 1-GPU engines fit a node: no DP arguments
        assert "--data-parallel-size-local" not in p.command


def test_dry_run_on_slurm_prints_every_nodes_command_line(files, tmp_path):
    pipeline, cluster = files
    r = CliRunner().invoke(main, ["run", str(pipeline), "--cluster", str(cluster), "--dry-run",
                                  f"output_dir={tmp_path / 'runs'}"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("engine-")]
    assert [ln.split(":")[0] for ln in lines] == ["engine-0", "engine-1", "engine-2", "engine-2 node 1"]
    leader, follower = lines[2], lines[3]
    assert "--headless" not in leader and "--data-parallel-size-local 8 --data-parallel-address" in leader
    assert "--headless --data-parallel-size-local 8 --data-parallel-start-rank 8" in follower
    assert "2 jobs of 8 GPUs" in r.output
    assert not (tmp_path / "runs").exists()


def _one_error_line(r, message):
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and r.output.startswith("error: ") and message in r.output, r.output


def test_a_multi_node_engine_gets_a_job_per_further_node_with_no_role(files):
    pipeline, cluster = files
    cfg, spec = load_pipeline(pipeline), load_cluster(cluster)
    jobs = run_jobs(spec, cfg, [Role.PREFILL, Role.PREFILL, Role.DECODE])
    assert list(jobs) == ["engine-0", "engine-1", "engine-2", "node-1-of-engine-2", "tools-0"]
    follower = jobs["node-1-of-engine-2"]
    assert "--gres=gpu:8" in follower["job_extra_directives"]  # a node of engines.gpus, as its leader's
    assert "--gres=gpu:8" in jobs["engine-2"]["job_extra_directives"]
    assert follower["worker_extra_args"] == ["--resources", "prefill=0,decode=0,env=0"]
    assert (follower["cores"], follower["job_name"]) == (1, "prorsa-node-1-of-engine-2")


@pytest.mark.parametrize(("layout", "message"), [
    ("      data_parallel_size: 9 ", "engines.groups: data_parallel_size 9 does not divide evenly over the 2 nodes"),
    ("      tensor_parallel_size: 16\n      data_parallel_size: 2 ",
     "engines.groups: tensor_parallel_size 16 is larger than a node's 8 GPUs (engines.gpus)"),
])
def test_a_layout_that_cannot_span_is_refused_on_slurm(files, layout, message):
    pipeline, cluster = files
    pipeline.write_text(pipeline.read_text().replace("      data_parallel_size: 16 ", layout))
    for extra in (["--dry-run"], []):
        r = CliRunner().invoke(main, ["run", str(pipeline), "--cluster", str(cluster), *extra])
        _one_error_line(r, message)


def test_on_one_machine_an_engine_larger_than_it_stays_refused(files):
    r = CliRunner().invoke(main, ["run", str(files[0]), "--dry-run"], env=EIGHT_GPUS)
    _one_error_line(r, "is larger than the node's 8 GPUs (CUDA_VISIBLE_DEVICES); an engine spans nodes only from "
                       "batch jobs (engines.gpus in a slurm or pbs cluster file)")


def test_validate_plans_on_the_cluster_file_given(files):
    pipeline, cluster = files
    r = CliRunner().invoke(main, ["validate", "--plan", "--cluster", str(cluster), str(pipeline)])
    assert r.exit_code == 0, r.output
    assert "engine-2 node 1: " in r.output and "--data-parallel-start-rank 8" in r.output
    r = CliRunner().invoke(main, ["validate", "--plan", str(pipeline)], env=EIGHT_GPUS)
    assert r.exit_code == 2 and "an engine spans nodes only from batch jobs" in r.output


def test_a_pbs_cluster_file_plans_over_nodes_the_same(files, tmp_path):
    pbs = (REPO / "cluster" / "pbs.yaml").read_text()
    assert "  gpus: 1\n" in pbs
    cluster = tmp_path / "pbs8.yaml"
    cluster.write_text(pbs.replace("  gpus: 1\n", "  gpus: 8\n"))
    r = CliRunner().invoke(main, ["run", str(files[0]), "--cluster", str(cluster), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert [ln.split(":")[0] for ln in r.output.splitlines() if ln.startswith("engine-2")] == ["engine-2",
                                                                                              "engine-2 node 1"]


SPAN = REPO / "pipelines" / "cpu-moe-span.yaml"


def test_a_cpu_engine_spans_nodes_of_node_ranks_on_one_machine(tmp_path):
    r = CliRunner().invoke(main, ["run", str(SPAN), "--dry-run", f"output_dir={tmp_path / 'runs'}"])
    assert r.exit_code == 0, r.output
    lines = {ln.split(":")[0]: ln for ln in r.output.splitlines() if ln.startswith("engine-")}
    assert list(lines) == ["engine-0", "engine-1", "engine-1 node 1"]
    leader, follower = lines["engine-1"], lines["engine-1 node 1"]
    assert "VLLM_CPU_OMP_THREADS_BIND=0 " in leader and " PRORSA_CPU_DP=1 " in leader and "--headless" not in leader
    assert "VLLM_CPU_OMP_THREADS_BIND=1 " in follower and " PRORSA_CPU_DP=1 " in follower
    assert ("--headless --data-parallel-size-local 1 --data-parallel-start-rank 1 --data-parallel-address 127.0.0.1"
            in follower)
    assert "2 workers: cores 0|1" in r.output
    assert "--data-parallel-size-local" not in lines["engine-0"]  # the DP=1 engine fits a node


@pytest.mark.parametrize(("edits", "message"), [
    ([("    device: cpu", "    device: cuda")],
     "node_ranks: CPU engines only; on GPUs a node is the cluster file's engines.gpus"),
    ([("      data_parallel_size: 2 ", "      data_parallel_size: 3 "), ("node_ranks: 1 ", "node_ranks: 2 "),
      ("cores_per_engine: 2 ", "cores_per_engine: 0 ")],
     "engines.groups: data_parallel_size 3 does not divide evenly over the 2 nodes of 2 ranks that tp 1 x dp 3 = 3 "
     "ranks takes (engines.vllm.node_ranks)"),
])
def test_a_cpu_span_that_cannot_run_is_refused_in_one_line(tmp_path, edits, message):
    text = SPAN.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    pipeline = tmp_path / "span.yaml"
    pipeline.write_text(text)
    r = CliRunner().invoke(main, ["run", str(pipeline), "--dry-run"])
    _one_error_line(r, message)


def test_a_cpu_span_on_a_running_scheduler_is_refused_in_one_line(tmp_path):
    r = CliRunner().invoke(main, ["run", str(SPAN), "--cluster", str(REPO / "cluster" / "scheduler.yaml"),
                                  f"output_dir={tmp_path / 'runs'}"])
    _one_error_line(r, "engine-1 spans 2 nodes of 1 ranks (engines.vllm.node_ranks); engines spanning nodes are "
                       "launched on a local cluster or batch jobs, not on a running scheduler")
    assert not (tmp_path / "runs").exists()


def test_a_gpu_leader_on_a_batch_job_takes_its_jobs_gpus_and_meets_on_its_host(files, tmp_path, monkeypatch):
    made = {}

    def make_engine(index, role, cfg, run_dir, gpus, peers):
        made.update(index=index, gpus=gpus, peers=peers)
        raise RuntimeError("made")

    async def get_metadata(keys, default=None):
        return default

    monkeypatch.setattr(engine_host, "make_engine", make_engine)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", EIGHT_GPUS["CUDA_VISIBLE_DEVICES"])
    cfg = hosted_engines(load_pipeline(files[0]))
    host = WorkerEngineHost([Role.PREFILL, Role.PREFILL, Role.DECODE], cfg, str(tmp_path), node_gpus=8)
    worker = SimpleNamespace(name="engine-2", address="tcp://10.1.2.3:4567",
                             scheduler=SimpleNamespace(get_metadata=get_metadata))

    async def main():
        with pytest.raises(RuntimeError, match="made"):
            await host.setup(worker)
        await host.teardown(worker)

    asyncio.run(main())
    peers = made["peers"]
    assert made["index"] == 2 and made["gpus"] is None  # the job's CUDA_VISIBLE_DEVICES as given: a node
    assert (peers.host, peers.node, peers.nodes, peers.local_dp) == ("10.1.2.3", 0, 2, 8)
