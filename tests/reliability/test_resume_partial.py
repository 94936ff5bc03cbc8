"""SIGKILL the driver of a partial rollout mid-run, then `prorsa run --resume`: every trajectory
trained once or dropped by the stated rule, none twice, each step's batch whole groups; on
emulated engines and on vLLM CPU engines."""

from __future__ import annotations

import json
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from prorsa.metrics.journal import MANIFEST

from runs import VLLM_ENGINES, kill_group, prorsa, start, wait_for, write_trace

STEPS, PROMPTS, GROUP = 4, 4, 2
EMULATED = f"""\
name: partial
seed: 5
policy: static:2:1
engines: {{backend: emulated, count: 3, slots: 8, time_scale: 0.05}}
workload: {{trace: trace.jsonl, mode: sync, prompts: {PROMPTS}, group_size: {GROUP}, steps: {STEPS}}}
partial_rollout: {{over_sample: 0.5, carry: true, max_staleness: 0}}  # carried groups go stale: dropped rows early
runtime: {{metrics_interval_s: 0.2, dashboard_address: null, output_batch: 1, output_flush_s: 0.1}}
"""
VLLM = "name: partial\nseed: 4\n" + VLLM_ENGINES + f"""\
workload: {{family: swe, mode: sync, prompts: {PROMPTS}, group_size: {GROUP}, steps: {STEPS}, max_turns: 3,
           token_scale: 0.1, max_context: 1536, tool_time_scale: 0.2}}
partial_rollout: {{over_sample: 0.5, carry: true}}
runtime: {{tool_workers: 1, metrics_interval_s: 0.5, dashboard_address: null, output_batch: 1, output_flush_s: 0.2}}
"""


def _manifest(run_dir) -> dict:
    try:
        return json.loads((run_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.parametrize("pipeline", [
    EMULATED, pytest.param(VLLM, id="vllm", marks=[pytest.mark.vllm, pytest.mark.timeout(1800)])])
def test_a_killed_partial_rollout_resumes_to_each_trajectory_once(tmp_path, pipeline):
    write_trace(tmp_path / "trace.jsonl")
    (tmp_path / "p.yaml").write_text(pipeline)
    out = tmp_path / "runs"
    proc = start("run", str(tmp_path / "p.yaml"), f"output_dir={out}")
    try:
        run_dir = wait_for(lambda: next(iter(out.glob("partial-*")), None), 120, proc)
        # killed once a step's batch is committed and before the last step's is
        wait_for(lambda: _manifest(run_dir).get("driver_state", {}).get("step", 0) >= 1, 900, proc, every=0.2)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    manifest = _manifest(run_dir)
    state = manifest["driver_state"]
    assert not manifest["complete"] and state["step"] < STEPS and state["groups"]
    listed = [run_dir / p["file"] for p in manifest["parts"]]
    before = {r["traj_id"]: r for p in listed for r in pq.read_table(p).to_pylist()}

    resumed = prorsa("run", "--resume", str(run_dir), timeout=1200)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"{len(before)} trajectories saved earlier" in resumed.stdout

    rows = pq.read_table(run_dir / "trajectories.parquet").to_pylist()
    ids = [r["traj_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a trajectory saved twice"
    # what the killed session saved is kept as it was
    assert all(json.dumps(before[i], sort_keys=True) == json.dumps(r, sort_keys=True)
               for r in rows if (i := r["traj_id"]) in before)
    # the groups in flight at the last commit ran again, whole
    pending = {t for _, _, members in state["groups"] for t in members}
    assert pending <= set(ids) - set(before)
    trained = defaultdict(lambda: defaultdict(list))
    for r in rows:
        assert r["status"] in ("completed", "cancelled", "stale"), (r["traj_id"], r["error"])
        if r["trained_step"] is not None:
            assert r["status"] == "completed"
            trained[r["trained_step"]][r["traj_id"].rsplit("-g", 1)[0]].append(r)
            assert [t["turn"] for t in r["turns"]] == list(range(len(r["turns"])))
    assert sorted(trained) == list(range(STEPS))
    for step, groups in trained.items():
        assert len(groups) == PROMPTS and all(len(m) == GROUP for m in groups.values()), (step, list(groups))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_resumed"] == len(before)
    # what a partial rollout drops is no failure, whichever session dropped it
    dropped = sum(r["status"] in ("cancelled", "stale") for r in rows)
    assert (summary["trajectories_failed"], summary["trajectories_dropped"]) == (0, dropped), summary
    assert _manifest(run_dir)["complete"] is True
