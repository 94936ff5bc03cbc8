"""A role switch by restart on real vLLM CPU engines started without kv_both (engines.role_switch:
restart), mid-run: every trajectory completes once, and the restarted engine serves its new leg.

Two engines of the tiny model: engine-0 mixed (kv_consumer), engine-1 decode (kv_consumer); with
no KV producer every turn runs whole on one of them. A scripted policy turns engine-1 into a
prefill engine once some turns have run: it is closed to new work, drained, restarted as
kv_producer, and from then on the turns prefill there and engine-0 decodes them, pulling the KV
over NIXL from the restarted server. The run is `prorsa run` in a process of its own (this file is
its entry point, so the policy is registered there).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prorsa.control.lifecycle import Phase
from prorsa.control.policy import Decision
from prorsa.roles import Role

# slow, and skipped without vLLM (tests/conftest.py); two starts and a restart on a loaded machine
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

PIPELINE = """\
name: kvrole
seed: 4
policy: restart-once
engines:
  backend: vllm
  count: 2
  slots: 16
  gpu: cpu
  model: tiny
  role_switch: restart
  vllm: {dtype: float32, device: cpu, max_model_len: 2048, cores_per_engine: 1, start_timeout_s: 900}
workload: {family: swe, mode: async, concurrency: 8, trajectories: 128, max_turns: 4,
           token_scale: 0.1, max_context: 1536, tool_time_scale: 1.0}
runtime: {tool_workers: 1, metrics_interval_s: 0.5, control_interval_s: 0.5, dashboard_address: null,
          output_batch: 1}
"""
# decodes ended before the switch is asked for: turns are in flight when it starts, and the rollout
# (64 trajectories at a fifth of SWE's tool times took 44 s) outlasts a restart on a loaded 2-core
# machine (30-100 s: a switch still under way when the rollout ends is cancelled, not recorded)
AFTER_TURNS = 6


class RestartOnce:
    """Opens mixed + decode; once AFTER_TURNS decodes have ended, asks for engine-1 as prefill."""

    name = "restart-once"

    def __init__(self) -> None:
        self.decoded = 0
        self.asked = False

    def initial_roles(self, n: int) -> list[Role]:
        return [Role.MIXED] + [Role.DECODE] * (n - 1)

    def decide(self, snap) -> Decision:
        self.decoded += sum(e.phase is Phase.TOOL for e in snap.events)
        if self.asked or self.decoded < AFTER_TURNS:
            return Decision({})
        self.asked = True
        return Decision({"engine-1": Role.PREFILL}, reason=f"test: after {self.decoded} decodes")


if __name__ == "__main__":
    from prorsa.cli import main
    from prorsa.control.policy import register

    register(RestartOnce.name)(RestartOnce)
    main(sys.argv[1:])


def _launches(log: Path) -> list[str]:
    """The server's command lines, one a launch (server.py writes `# prorsa: DATE TIME starting: ...`)."""
    return re.findall(r"^# prorsa: \S+ \S+ starting: (.*)$", log.read_text(errors="replace"), re.M)


def test_an_engine_restarted_into_kv_producer_mid_run_prefills_and_nothing_is_lost(tmp_path):
    from runs import assert_exactly_once, expected_specs

    pipeline = tmp_path / "kvrole.yaml"
    pipeline.write_text(PIPELINE)
    specs = expected_specs(pipeline)
    out = tmp_path / "runs"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "run", str(pipeline), f"output_dir={out}"],
                          capture_output=True, text=True, timeout=1500)
    took = time.monotonic() - t0
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in output, output[-6000:]
    (run_dir,) = out.iterdir()
    rows = assert_exactly_once(run_dir, specs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_failed"] == 0 and summary["role_switches"] == 1

    # engine-1 started as a consumer and was restarted as the producer, once
    launches = _launches(run_dir / "engines" / "engine-1.log")
    assert len(launches) == 2 and '"kv_role": "kv_consumer"' in launches[0] and '"kv_role": "kv_producer"' in launches[1]
    assert all('"kv_role": "kv_consumer"' in ln for ln in _launches(run_dir / "engines" / "engine-0.log"))

    # before the switch every turn ran whole; after it, turns prefilled on engine-1 and engine-0
    # decoded them from the KV it shipped
    turns = [t for r in rows for t in r["turns"]]
    whole = [t for t in turns if not t["prefill_engine"]]
    shipped = [t for t in turns if t["prefill_engine"]]
    assert whole and shipped, (len(whole), len(shipped))
    assert {(t["prefill_engine"], t["decode_engine"]) for t in shipped} == {("engine-1", "engine-0")}
    assert max(t["start_s"] for t in whole) <= max(t["start_s"] for t in shipped)
    print(f"\n{len(rows)} trajectories, {len(turns)} turns ({len(whole)} whole before the switch, {len(shipped)} "
          f"shipped from the restarted engine), retried {summary['turns_retried']}; test {took:.0f} s")
