"""A local run listens on this machine only: every socket the scheduler, the workers (in this
process or as processes, with their HTTP servers and Nannies), and in a whole run the vLLM servers
open is on a loopback address."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from distributed.security import Security

from prorsa.cluster.local import start_local_cluster
from prorsa.cluster.security import exposure
from prorsa.config.pipeline import PipelineConfig
from prorsa.roles import Role


def listening() -> set[tuple[int, str, int]]:
    me = psutil.Process()
    out = set()
    for p in [me, *me.children(recursive=True)]:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out |= {(p.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}
    return out


@pytest.mark.parametrize("processes", [False, True])
def test_every_listener_of_a_local_cluster_is_on_loopback(tmp_path, processes):
    cfg = PipelineConfig.model_validate({
        "name": "t", "engines": {"backend": "emulated", "count": 2, "time_scale": 0},
        "runtime": {"processes": processes, "dashboard_address": None}})  # fmt: skip
    before = listening()

    async def opened() -> set:
        async with await start_local_cluster(cfg, [Role.PREFILL, Role.DECODE], tmp_path):
            return listening() - before

    new = asyncio.run(opened())
    # the scheduler's and three workers' HTTP servers at least; as processes, their comm ports too
    assert len(new) >= (4 if not processes else 10), new
    assert [s for s in new if not ipaddress.ip_address(s[1]).is_loopback] == []


def run_listeners(cmd: list[str], log: Path) -> tuple[int, dict[tuple[str, int], str]]:
    """Run `cmd` and list, until it exits, every socket its processes listen on (TCP) or hold
    bound and unconnected (UDP): address -> the command line that opened it."""
    seen: dict[tuple[str, int], str] = {}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in tree:
                try:
                    conns, cmdline = p.net_connections(kind="inet"), " ".join(p.cmdline())
                except psutil.Error:
                    continue
                for c in conns:
                    if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr):
                        seen[(c.laddr.ip, c.laddr.port)] = cmdline
            time.sleep(0.2)
    return proc.returncode, seen


VLLM_PIPELINE = """
name: listen
policy: static:1:1
engines:
  backend: vllm
  count: 2
  slots: 4
  vllm: {model: tiny, dtype: float32, max_model_len: 2048, cores_per_engine: 1, start_timeout_s: 1200}
workload: {family: math-tir, prompts: 2, group_size: 2, steps: 1, max_turns: 2, token_scale: 0.1,
           max_context: 1536, tool_time_scale: 0.1}
environment: {dataset: math-tir, tasks: 2, tools: [python]}
runtime: {tool_workers: 1, processes: PROCESSES}
"""


@pytest.mark.vllm
@pytest.mark.parametrize("processes", [True])
def test_every_listener_of_a_vllm_run_is_on_loopback(tmp_path, processes):
    """A whole `prorsa run`: the scheduler, the workers, the dashboard, the vLLM servers with
    their engine cores and NIXL (KV shipped prefill -> decode), and the tools' sandboxes. Workers
    as processes, the run with the most listeners (the Dask side with in-process workers is
    listed in both modes by the fast test above; the engines' sockets do not depend on it)."""
    pipeline = tmp_path / "listen.yaml"
    pipeline.write_text(VLLM_PIPELINE.replace("PROCESSES", str(processes).lower()))
    rc, seen = run_listeners([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), "--output",
                              str(tmp_path / "runs")], tmp_path / "run.log")
    assert rc == 0, (tmp_path / "run.log").read_text()[-3000:]
    servers = {a for a, cmd in seen.items() if "VLLM" in cmd or "prorsa.engine.vllm" in cmd}
    assert len(servers) >= 4, seen  # two engines' HTTP servers and engine cores at least
    assert len(seen) - len(servers) >= (3 if not processes else 9), seen  # the Dask side
    assert {a: cmd for a, cmd in seen.items() if not ipaddress.ip_address(a[0]).is_loopback} == {}


def test_a_scheduler_beyond_loopback_without_tls_is_warned_about():
    assert exposure("127.0.0.1", None) is None and exposure("::1", None) is None
    assert exposure("localhost", None) is None
    assert "listens on 0.0.0.0 without TLS" in exposure("0.0.0.0", None)
    assert "listens on every interface without TLS" in exposure(None, None)  # a batch scheduler
    assert "node7" in exposure("node7", None)  # a name may resolve to anything
    assert exposure(None, Security()) is None


EMULATED_PIPELINE = """
name: wide
policy: static:1:1
engines: {backend: emulated, count: 2, time_scale: 0}
workload: {family: swe, prompts: 2, group_size: 2, steps: 1, max_turns: 2}
runtime: {processes: true}
"""


def test_wider_listeners_come_only_from_the_cluster_file_and_are_warned_about(tmp_path):
    (tmp_path / "p.yaml").write_text(EMULATED_PIPELINE)
    (tmp_path / "wide.yaml").write_text("kind: local\nhost: 0.0.0.0\n")
    rc, seen = run_listeners([sys.executable, "-m", "prorsa.cli", "run", str(tmp_path / "p.yaml"), "--cluster",
                              str(tmp_path / "wide.yaml"), "--output", str(tmp_path / "runs")], tmp_path / "run.log")
    log = (tmp_path / "run.log").read_text()
    assert rc == 0, log[-3000:]
    assert "listens on 0.0.0.0 without TLS" in log
    assert any(ip == "0.0.0.0" for ip, _ in seen), seen  # the file asked for it, and got it


@pytest.mark.parametrize("address, wide", [("127.0.0.1:0", False), ("localhost:8787", False), ("[::1]:0", False),
                                           (None, False), ("0.0.0.0:0", True), (":8787", True), ("10.0.0.5:80", True)])
def test_a_dashboard_beyond_this_machine_is_warned_about(address, wide):
    from prorsa.cluster.security import dashboard_exposure

    said = dashboard_exposure(address)
    assert (said is not None) == wide
    assert said is None or ("without a login" in said and "127.0.0.1:0" in said)
