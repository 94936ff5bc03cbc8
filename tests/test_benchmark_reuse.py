"""--reuse keeps an earlier results file's points only while one of them still simulates to the
figure the file holds: points made before the simulator changed are refused, not mixed with
today's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.benchmark_scripts import BENCHMARKS, load_script

drivers = load_script("drivers.py")


def _reused_file(tmp_path, colocated_figure: float | None = None):
    """Every point of drivers.py's EP1 sync cell but the oracle's: the colocated one as simulated
    today, or with `colocated_figure` in its place."""
    points = [list(drivers.run(("ep", 1, "sync", "colocated")))]
    if colocated_figure is not None:
        points[0][4] = colocated_figure
    # the other points are reused as written: only the colocated one is simulated again
    points += [["ep", 1, "sync", p, 100.0, 0.5, 0] for p in drivers.POLICIES if p not in ("colocated", "oracle")]
    path = tmp_path / "drivers-ep-old.json"
    path.write_text(json.dumps({"command": "-", "rows": [], "points": points, "reused": []}))
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    return path


def _drivers(tmp_path, reuse) -> subprocess.CompletedProcess:
    # run where it writes benchmarks/results/: the temporary folder, not the repository's
    env = os.environ | {"PYTHONPATH": str(BENCHMARKS.parent)}
    return subprocess.run([sys.executable, str(BENCHMARKS / "drivers.py"), "--factor", "ep", "--values", "1",
                           "--modes", "sync", "--workers", "1", "--reuse", str(reuse)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_file_the_simulator_moved_past_is_refused(tmp_path):
    out = _drivers(tmp_path, _reused_file(tmp_path, colocated_figure=69.4572))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "ep 1 sync colocated" in out.stderr and "69.4572" in out.stderr and "run without --reuse" in out.stderr
    assert not (tmp_path / "benchmarks" / "results" / "drivers-ep.json").exists()


def test_a_file_that_still_holds_is_reused(tmp_path):
    out = _drivers(tmp_path, _reused_file(tmp_path))
    assert out.returncode == 0, out.stderr
    written = json.loads((tmp_path / "benchmarks" / "results" / "drivers-ep.json").read_text())
    assert sorted(p for _, _, p in written["reused"]) == sorted(p for p in drivers.POLICIES if p != "oracle")
    assert [p[4] for p in written["points"] if p[3] == "static:1:7"] == [100.0]  # kept as the file holds it
