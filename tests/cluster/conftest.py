"""A batch system on this machine (fakebatch/fakebatch.py on PATH as sbatch, squeue, scancel, qsub,
qstat, qdel: each job script runs at once, in its own process group), TLS certificates, and vLLM
servers faked (fake_servers: the interpreter the engine workers launch runs fake_vllm_server.py,
which records each launch in the directory returned)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prorsa.cluster.certs import make_certs as make_certs_with_cryptography

FAKE = Path(__file__).parent / "fakebatch" / "fakebatch.py"
COMMANDS = ("sbatch", "squeue", "scancel", "qsub", "qstat", "qdel")


class FakeBatch:
    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.state = root / "jobs"
        self.bin.mkdir(parents=True)
        self.state.mkdir(parents=True)
        for cmd in COMMANDS:
            (self.bin / cmd).symlink_to(FAKE)

    def env(self, base: dict | None = None) -> dict:
        base = dict(os.environ if base is None else base)
        return base | {"PATH": f"{self.bin}{os.pathsep}{base.get('PATH', '')}", "FAKE_BATCH_DIR": str(self.state)}

    def jobs(self) -> list[str]:
        return sorted(p.stem for p in self.state.glob("*.pid"))

    def script(self, job: str) -> str:
        return (self.state / f"{job}.sh").read_text()

    def output(self, job: str) -> str:
        return (self.state / f"{job}.out").read_text(errors="replace")

    def cancelled(self, job: str) -> bool:
        return (self.state / f"{job}.cancelled").exists()

    def alive(self, job: str) -> bool:
        try:
            os.killpg(int((self.state / f"{job}.pid").read_text()), 0)
        except ProcessLookupError:
            return False
        return True

    def kill_all(self) -> None:
        for job in self.jobs():
            if self.alive(job):
                os.killpg(int((self.state / f"{job}.pid").read_text()), signal.SIGKILL)


@pytest.fixture
def fake_batch(tmp_path, monkeypatch):
    batch = FakeBatch(tmp_path / "batch")
    monkeypatch.setenv("PATH", batch.env()["PATH"])
    monkeypatch.setenv("FAKE_BATCH_DIR", str(batch.state))
    yield batch
    batch.kill_all()  # a failed test must not leave workers behind


def make_certs(where: Path, name: str = "prorsa") -> dict[str, Path]:
    """A CA and a certificate it signed (with its key): ca.pem, <name>.pem, <name>-key.pem."""
    where.mkdir(parents=True, exist_ok=True)
    ca, cert, key = where / "ca.pem", where / f"{name}.pem", where / f"{name}-key.pem"
    try:
        make_certs_with_cryptography(ca, cert, key)
    except ImportError:
        _certs_with_openssl(where, ca, cert, key)
    return {"ca_file": ca, "cert": cert, "key": key}


def _certs_with_openssl(where: Path, ca: Path, cert: Path, key: Path) -> None:
    ca_key, csr = where / "ca-key.pem", where / "req.csr"

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-subj", f"/CN={where.name}-ca", "-days", "1")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=prorsa")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "1")


FAKE_SERVER = Path(__file__).parent / "fake_vllm_server.py"


def _record(tmp_path: Path, monkeypatch) -> Path:
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv("RECORD_DIR", str(record))
    return record


def _end_fakes(record: Path) -> None:
    """Kill every recorded fake still running (each leads a process group of its own, as a vLLM
    server does): those of an in-process cluster outlive a failed test, their launcher being it."""
    for launch in record.glob("*.json"):
        try:
            os.killpg(json.loads(launch.read_text())["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def fake_servers(tmp_path, monkeypatch):
    record = _record(tmp_path, monkeypatch)
    wrapper = tmp_path / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SERVER}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(wrapper))
    yield record
    _end_fakes(record)


@pytest.fixture
def job_fake_servers(tmp_path, monkeypatch) -> Path:
    """fake_servers for the workers of batch jobs (fake_batch), processes of their own: there a
    sitecustomize makes sys.executable a Python that runs the fake for a vLLM server's command line
    and itself for anything else (the nanny's worker process)."""
    record = _record(tmp_path, monkeypatch)
    site = tmp_path / "fake-site"
    site.mkdir()
    wrapper = site / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1 $2" = "-m prorsa.engine.vllm._launch" ]; then shift 2; '
                       f'exec "{sys.executable}" "{FAKE_SERVER}" "$@"; fi\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    (site / "sitecustomize.py").write_text(f"import sys\nsys.executable = {str(wrapper)!r}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    yield record
    _end_fakes(record)
