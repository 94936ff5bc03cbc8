"""The controller's acceptance run, live: every policy on one synchronous step whose demand changes
as it runs (pipelines/moe-step.yaml: a prompt flood, a decode-heavy middle, a long tail).

Each policy runs as a user runs it, `prorsa run PIPELINE --policy P`, on a LocalCluster with
emulated engines at half real time. prorsa must find its roles without being told (it opens from
the pipeline's workload hint), switch as the step moves through its phases, lose and duplicate
nothing, beat colocated, and come within 3% of the best static split, judged in hindsight.

Live runs on a small shared machine are noisy (5-10% run to run under other load), and noise only
ever adds time, so prorsa and the best static split each run twice, alternating, and a third time
while prorsa is not within 3%; each keeps its fastest run. In the simulator the same step gives
colocated 1.26x the best static split's makespan and prorsa 1.00x
(benchmarks/policies_live.py --pipeline pipelines/moe-step.yaml measures them live).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import numpy as np
import pytest

from prorsa.metrics.outputs import ROLE_CODES
from prorsa.metrics.rundata import load_run

ROLE_NAMES = {code: role.value for role, code in ROLE_CODES.items()}
PIPELINE = Path(__file__).resolve().parents[2] / "pipelines" / "moe-step.yaml"
STATICS = ("static:1:3", "static:2:2", "static:3:1")
TRAJECTORIES = 16 * 8
LOOKS = 3  # runs of prorsa and of the best static split, at most


def _run(policy: str, out: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(PIPELINE), "--policy", policy,
                           "--output", str(out)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    return run_dir


def _checked(run_dir: Path) -> dict:
    """The run's summary, once every trajectory and turn is in its output exactly once."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == TRAJECTORIES and summary["trajectories_failed"] == 0
    rows = pq.read_table(run_dir / "trajectories.parquet").to_pylist()
    assert len(rows) == len({r["traj_id"] for r in rows}) == TRAJECTORIES
    turns = [(r["traj_id"], t["turn"]) for r in rows for t in r["turns"]]
    assert len(turns) == len(set(turns)) == summary["turns"]
    return summary


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_prorsa_follows_the_phases_of_a_step_beats_colocated_and_matches_the_best_static(tmp_path):
    runs: dict[str, list[Path]] = {}
    for policy in ("prorsa", "colocated", *STATICS):
        runs[policy] = [_run(policy, tmp_path / policy.replace(":", "_") / "1")]
    makespan = {p: [_checked(d)["makespan_s"] for d in ds] for p, ds in runs.items()}
    best_static = min(STATICS, key=lambda p: makespan[p][0])
    for look in range(2, LOOKS + 1):  # the pair the 3% bound is about: more looks while it fails
        if look > 2 and min(makespan["prorsa"]) <= 1.03 * min(makespan[best_static]):
            break
        for policy in (best_static, "prorsa"):
            runs[policy].append(_run(policy, tmp_path / policy.replace(":", "_") / str(look)))
            makespan[policy].append(_checked(runs[policy][-1])["makespan_s"])
    fastest = {p: min(m) for p, m in makespan.items()}
    table = ", ".join(f"{p} {m}" for p, m in makespan.items())
    print(f"makespans (wall s): {table}")

    assert fastest["prorsa"] < fastest["colocated"], table
    assert fastest["prorsa"] <= 1.03 * fastest[best_static], table
    for policy in STATICS + ("colocated",):
        assert json.loads((runs[policy][0] / "summary.json").read_text())["role_switches"] == 0

    # the phases, as prorsa met them: dedicated decode engines while the step is decode-heavy,
    # then mixed engines for the tail, where too few trajectories are left for separation to pay
    run = load_run(min(runs["prorsa"], key=lambda d: json.loads((d / "summary.json").read_text())["makespan_s"]))
    to = [ROLE_NAMES[int(r)] for r in run.ds.switch_to.values]
    t = [float(x) * run.control_unit for x in run.ds.switch_time_s.values]  # body -> wall seconds
    assert "decode" in to and to[-1] == "mixed", list(zip(t, to))
    median_end = float(np.median(run.ds.traj_end_s.values))
    assert t[to.index("decode")] < median_end < t[-1], (list(zip(t, to)), median_end)
