"""A `prorsa sim --output` folder for tests that read stored runs (report, figures, records)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from prorsa.cli import main


def sim_output(base: Path, pipeline: str, policies: str) -> Path:
    """base/out: results.nc and runs/<policy>/ of each policy (comma-separated) on `pipeline` (YAML text)."""
    (base / "p.yaml").write_text(pipeline)
    res = CliRunner().invoke(main, ["sim", str(base / "p.yaml"), "--policy", policies, "--output", str(base / "out")])
    assert res.exit_code == 0, res.output
    return base / "out"
