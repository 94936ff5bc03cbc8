"""A driver SIGKILLed at any instant of its write-out (trajectories.parquet, metrics.nc,
summary.json, the seal) leaves a run that `--resume` completes without starting a cluster, and
that `prorsa report` reads; the instants are spread over the window by counting the write-out's
own Python calls, not by sleeping. The killed runs, and then their resumes, go two at a time: each
is its own process and output folder, and a run's count of calls does not depend on the clock."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runs import assert_exactly_once, expected_specs, write_pipeline

KILLS = 12  # instants spread evenly from the write-out's first call to near its last
AT_ONCE = 2  # processes at a time
HERE = Path(__file__).parent


def _run(pipeline: Path, out: Path, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "killed_in_write_out.py"), str(kill_at), "run", str(pipeline),
                           "--output", str(out)], capture_output=True, text=True, timeout=300)


def _prorsa(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prorsa.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_kill_anywhere_in_the_write_out_leaves_a_run_resume_completes_without_a_cluster(tmp_path):
    pipeline = write_pipeline(tmp_path / "p.yaml", time_scale=0.02)
    whole = _run(pipeline, tmp_path / "whole", 0)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    calls = int(whole.stdout.rsplit("write-out calls: ", 1)[1].split()[0])
    assert calls > 10 * KILLS, calls  # enough calls to tell the instants apart
    reference = json.loads((tmp_path / "whole" / "summary.json").read_text())
    specs = expected_specs(pipeline)
    # from the first call to near the last: a run's count varies by a few percent
    at = [1 + i * (int(calls * 0.95) - 1) // (KILLS - 1) for i in range(KILLS)]
    killed = [tmp_path / f"k{k}" for k in at]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        procs = list(pool.map(lambda k, out: _run(pipeline, out, k), at, killed))
    for k, proc in zip(at, procs):
        assert proc.returncode == -9, (k, proc.stdout + proc.stderr)
    manifests = [json.loads((out / "manifest.json").read_text()) for out in killed]
    assert not any(m["complete"] for m in manifests)
    with ThreadPoolExecutor(AT_ONCE) as pool:
        resumes = list(pool.map(lambda out: _prorsa("run", "--resume", str(out)), killed))
    without_cluster = 0
    for out, manifest, resumed in zip(killed, manifests, resumes):
        assert resumed.returncode == 0, (out, resumed.stdout + resumed.stderr)
        if manifest.get("rolled_out"):  # the last part committed: nothing to roll out, no cluster
            assert "every trajectory was saved; wrote its outputs" in resumed.stdout, resumed.stdout
            assert "starting" not in resumed.stdout and "engines ready" not in resumed.stdout
            without_cluster += 1
        else:  # killed before the last commit: its trajectories run again
            assert "trajectories saved earlier" in resumed.stdout, resumed.stdout
        assert json.loads((out / "manifest.json").read_text())["complete"]
        assert_exactly_once(out, specs)
        summary = json.loads((out / "summary.json").read_text())
        for key in ("trajectories_completed", "turns", "decode_tokens", "prefill_tokens"):
            assert summary[key] == reference[key], (out.name, key)
    assert without_cluster >= KILLS - 2, without_cluster  # the last commit is a sliver of the window
    report = _prorsa("report", *map(str, killed), "--output", str(tmp_path / "report"))
    assert report.returncode == 0, report.stdout + report.stderr
