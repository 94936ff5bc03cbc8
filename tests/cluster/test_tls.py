"""Dask TLS from a cluster file: a pipeline runs on a TLS local cluster, and its scheduler refuses a
client without a certificate, or with one its CA did not sign, while it runs."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from distributed import Client
from distributed.security import Security

from prorsa.cluster.launch import open_run_cluster
from prorsa.cluster.local import engine_addresses
from prorsa.config.cluster import load_cluster
from prorsa.config.load import load_pipeline
from prorsa.control.policy import make_policy

from .conftest import make_certs

PIPELINE = {
    "name": "tls", "seed": 2, "policy": "static:1:1",
    "engines": {"backend": "emulated", "count": 2, "slots": 8, "time_scale": 0.05},
    # long enough (about 30 s) to knock on the scheduler's door several times while it runs, even
    # when a refused client takes its whole connect timeout on a busy machine
    "workload": {"family": "swe", "mode": "sync", "prompts": 2, "group_size": 2, "steps": 12, "max_turns": 3,
                 "token_scale": 0.5, "tool_time_scale": 1.0},
    "runtime": {"metrics_interval_s": 0.2, "dashboard_address": None, "tool_threads": 4},
}


def connects(address: str, security: Security | None) -> bool:
    # an asynchronous client in a loop of our own: a synchronous one starts a loop thread that
    # distributed gives a fixed 10 s, which a loaded machine can miss (AssertionError, not a refusal)
    async def attempt() -> bool:
        client = Client(address, security=security, timeout=5, asynchronous=True)
        try:
            await client
            return (await client.scheduler.identity())["address"] == address
        finally:  # a refused client too, or it closes itself later on a loop that is gone
            await client.close()

    try:
        return asyncio.run(attempt())
    except (OSError, TimeoutError, TypeError):  # TypeError: distributed will not speak tls:// without one
        return False


def tls_probe(address: str, ca_file: Path, cert: dict | None) -> str:
    """A raw TLS client that trusts the scheduler, with or without a certificate of its own: what
    the scheduler sends back ("answered"), or why not. TLS 1.3 finishes the client's side of the
    handshake first; a refusal arrives as an alert on the first read."""
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.check_hostname = False
    if cert is not None:
        ctx.load_cert_chain(str(cert["cert"]), str(cert["key"]))
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(b"\0" * 8)
            return "answered" if tls.recv(1) else "closed"
    except (ssl.SSLError, OSError) as e:
        return str(e)


@pytest.mark.slow
def test_a_tls_cluster_runs_a_pipeline_and_refuses_clients_without_its_certificate(tmp_path):
    certs = make_certs(tmp_path / "certs")
    stranger = make_certs(tmp_path / "stranger")  # a certificate from another CA
    spec = tmp_path / "tls.yaml"
    spec.write_text(yaml.safe_dump({"kind": "local", "tls": {k: str(v) for k, v in certs.items()}}))
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump(PIPELINE))
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), "--cluster", str(spec),
                             f"output_dir={tmp_path / 'runs'}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        seen = ""
        deadline = time.time() + 120
        while "engines ready" not in seen and time.time() < deadline and proc.poll() is None:
            seen += proc.stdout.readline()
        assert "engines ready" in seen, seen + proc.stderr.read()
        address = seen.split("scheduler: ")[1].split()[0]
        assert address.startswith("tls://127.0.0.1:")  # localhost only, by default

        ours = Security(tls_ca_file=str(certs["ca_file"]), tls_client_cert=str(certs["cert"]),
                        tls_client_key=str(certs["key"]), require_encryption=True)
        theirs = Security(tls_ca_file=str(certs["ca_file"]), tls_client_cert=str(stranger["cert"]),
                          tls_client_key=str(stranger["key"]), require_encryption=True)
        assert connects(address, ours)  # the scheduler is up and answers its own
        assert tls_probe(address, certs["ca_file"], certs) == "answered"
        assert tls_probe(address, certs["ca_file"], None) != "answered"  # no certificate
        assert not connects(address, None)
        assert not connects(address, theirs)  # a certificate its CA never signed
        assert not connects(address.replace("tls://", "tcp://"), None)  # plain TCP on the TLS port
        assert proc.poll() is None, "the run ended before every client was tried"
        assert connects(address, ours)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out + err
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == 48 and summary["trajectories_failed"] == 0


def test_the_local_tls_cluster_refuses_what_its_ca_did_not_sign(tmp_path):
    """The same checks in-process, fast: the cluster a TLS local file opens, its own client in."""
    certs = make_certs(tmp_path / "certs")
    stranger = make_certs(tmp_path / "stranger")
    spec = tmp_path / "tls.yaml"
    spec.write_text(yaml.safe_dump({"kind": "local", "tls": {k: str(v) for k, v in certs.items()}}))
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(yaml.safe_dump(PIPELINE))
    cfg = load_pipeline(pipeline)
    roles = make_policy(cfg.policy).initial_roles(cfg.engines.count)

    async def probe() -> tuple[str, dict, list[str]]:
        async with open_run_cluster(load_cluster(spec), cfg, roles, tmp_path / "run") as run:
            address = run.client.scheduler.address
            names = sorted((await engine_addresses(run.client)))
            probes = {
                "ours": await asyncio.to_thread(tls_probe, address, certs["ca_file"], certs),
                "none": await asyncio.to_thread(tls_probe, address, certs["ca_file"], None),
                "stranger": await asyncio.to_thread(tls_probe, address, certs["ca_file"], stranger),
            }
            return address, probes, names

    address, probes, names = asyncio.run(probe())
    assert address.startswith("tls://127.0.0.1:") and names == ["engine-0", "engine-1"]
    assert probes["ours"] == "answered"
    # refused in the handshake: an alert (certificate required / unknown CA) or the connection cut
    assert probes["none"] != "answered" and probes["stranger"] != "answered"


def test_a_certificate_that_is_not_there_is_one_error_line(tmp_path):
    from click.testing import CliRunner

    from prorsa.cli import main

    spec = tmp_path / "tls.yaml"
    spec.write_text("kind: local\ntls: {ca_file: ca.pem, cert: me.pem}\n")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(PIPELINE))
    result = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "--cluster", str(spec)])
    assert result.exit_code == 2
    assert result.stderr == (f"error: {spec}: tls.ca_file: got '{tmp_path / 'ca.pem'}'; no such file "
                             f"(test certificates: prorsa certs {tmp_path})\n")


@pytest.fixture(autouse=True)
def _quiet_tls_logs():
    import logging

    # refused handshakes are logged by distributed at warning level; they are the point here
    logging.getLogger("distributed.comm").setLevel(logging.CRITICAL)
