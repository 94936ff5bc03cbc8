"""A `prorsa sim --output` folder for tests that read stored runs (report, figures, records), and a
simulated run that switches roles."""

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


# A run that switches within two seconds of simulation: prorsa told SWE-like means (told nothing, it
# holds its rehearsed opening through an async run) with a low bar for switching
SWITCHING = {"name": "switching", "seed": 5, "policy": "prorsa:4:1:2:1:0.02",
             "prior": {"prompt_tokens": 1750, "observation_tokens": 1560, "decode_tokens": 465, "tool_s": 0.9,
                       "turns": 3},
             "engines": {"backend": "emulated", "count": 4, "slots": 128, "model": "qwen3-8b"},
             "workload": {"family": "swe", "mode": "async", "concurrency": 64, "trajectories": 64, "max_turns": 3},
             "runtime": {"control_interval_s": 0.2}}
