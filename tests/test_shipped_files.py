"""Every shipped pipeline, sweep and cluster file validates in one `prorsa validate`, each told
apart by its contents; the TLS example once `prorsa certs` has made the certificates it names."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from prorsa.cli import main

REPO = Path(__file__).resolve().parents[1]


def _cluster_files(tmp_path: Path) -> Path:
    """The shipped cluster files where certificates may be made beside them (relative to the file)."""
    where = tmp_path / "cluster"
    where.mkdir()
    for f in (REPO / "cluster").glob("*.yaml"):
        shutil.copy(f, where)
    return where


def test_every_shipped_file_validates_in_one_command(tmp_path):
    cluster = _cluster_files(tmp_path)
    made = CliRunner().invoke(main, ["certs", str(cluster / "certs")])
    assert made.exit_code == 0, made.output
    pipelines = sorted((REPO / "pipelines").glob("*.yaml"))
    sweeps = sorted((REPO / "configs" / "sweeps").glob("*.yaml"))
    clusters = sorted(cluster.glob("*.yaml"))
    assert len(pipelines) > 10 and sweeps and any(f.name == "slurm-tls.yaml" for f in clusters)
    r = CliRunner().invoke(main, ["validate", *map(str, pipelines + sweeps + clusters)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert [ln.split()[1] for ln in lines] == list(map(str, pipelines + sweeps + clusters))
    assert all(ln.startswith("ok: ") for ln in lines)
    kinds = [ln.split("(", 1)[1].split()[0] for ln in lines]
    assert kinds[len(pipelines):] == ["sweep"] * len(sweeps) + ["cluster"] * len(clusters)
    assert "cluster" not in kinds[:len(pipelines)] and "sweep" not in kinds[:len(pipelines)]


def test_a_missing_certificate_says_how_to_make_test_ones(tmp_path):
    tls = _cluster_files(tmp_path) / "slurm-tls.yaml"
    r = CliRunner().invoke(main, ["validate", str(tls)])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    certs = tmp_path / "cluster" / "certs"
    assert r.output == f"error: {tls}: tls.ca_file: got '{certs / 'ca.pem'}'; no such file " \
                       f"(test certificates: prorsa certs {certs})\n"
    assert CliRunner().invoke(main, ["certs", str(certs)]).exit_code == 0
    assert CliRunner().invoke(main, ["validate", str(tls)]).exit_code == 0
    key = (certs / "node-key.pem").stat().st_mode & 0o777
    assert key == 0o600  # a private key: its owner's only
    again = CliRunner().invoke(main, ["certs", str(certs)])
    assert again.exit_code == 2 and "never overwrites" in again.output
