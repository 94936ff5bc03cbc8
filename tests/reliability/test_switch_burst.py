"""Fault: a role switch lands in a prefill burst (real LocalCluster, emulated engines).

Each of two synchronous steps starts 64 trajectories at once: a burst of long prefills, 32 on
each prefill engine of 16 slots. A scripted policy waits until a prefill engine holds the burst,
then swaps it with the decode engine: the prefill engine gives up prefill while its legs are
admitted, prefilling and queued behind the worker's slots, and the decode engine gives up decode
while the burst's decodes are bound for it, waiting for their prefills. The switch protocol must
let every one of those legs run where it was sent, once.

The run is `prorsa run` in a process of its own (this file is its entry point), so a protocol
that strands a leg shows as a run that never ends, not as a hung test session; the policy and a
ledger of every request the engines served live only in that process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr

from prorsa.control.policy import Decision
from prorsa.engine.registry import engine_name
from prorsa.roles import Role
from runs import assert_exactly_once, expected_specs

SCALE = 0.5  # engine time: wall seconds per cost-model second
SLOTS = 16
BURST = 64  # trajectories started together (16 prompts x 4)
PROMPT, OBSERVATION, DECODE = 4000, 1000, 30
TRIGGER_TOKENS = 12 * OBSERVATION  # prompt tokens sent to one prefill engine that count as a burst
STALLED_S = 120  # the run takes ~20 s on a busy 2-core machine

PIPELINE = f"""\
name: burst
seed: 11
policy: static:2:1
engines: {{backend: emulated, count: 3, slots: {SLOTS}, time_scale: {SCALE}}}
workload: {{trace: trace.jsonl, mode: sync, prompts: 16, group_size: 4, steps: 2}}
runtime: {{metrics_interval_s: 0.05, control_interval_s: 0.05, dashboard_address: null, output_batch: 16}}
"""


def _write_pipeline(d: Path) -> Path:
    # equal tool latencies and decode lengths: the tool returns of a turn arrive together too
    lines = [json.dumps({"traj": f"t{i}", "turn": k, "appended_tokens": PROMPT if k == 0 else OBSERVATION,
                         "decode_tokens": DECODE, "tool_latency_s": 0.0 if k == 2 else 0.2, "done": k == 2})
             for i in range(16) for k in range(3)]
    (d / "trace.jsonl").write_text("\n".join(lines) + "\n")
    (d / "p.yaml").write_text(PIPELINE)
    return d / "p.yaml"


# -- the run's own process ------------------------------------------------------------------------


class BurstSwap:
    """Starts P P D; when a prefill engine holds at least `trigger` prompt tokens of prefill legs,
    swaps it with the decode engine, at most `swaps` times, one swap at a time."""

    name = "burst-swap"

    def __init__(self, swaps: str = "3", trigger: str = str(TRIGGER_TOKENS)) -> None:
        self.swaps = int(swaps)
        self.trigger = int(trigger)
        self.goal: dict[str, Role] = {}

    def initial_roles(self, n: int) -> list[Role]:
        roles = [Role.PREFILL] * (n - 1) + [Role.DECODE]
        self.goal = {engine_name(i): r for i, r in enumerate(roles)}
        return roles

    def decide(self, snap) -> Decision:
        roles = {e.engine_id: e.role for e in snap.engines}
        if self.swaps == 0 or roles != self.goal:  # the last swap is still draining
            return Decision({})
        loaded = [e for e in snap.engines if e.role is Role.PREFILL]
        deepest = max(loaded, key=lambda e: e.queued_prefill_tokens)
        if deepest.queued_prefill_tokens < self.trigger:
            return Decision({})
        decoder = next(e.engine_id for e in snap.engines if e.role is Role.DECODE)
        self.swaps -= 1
        self.goal = {**self.goal, deepest.engine_id: Role.DECODE, decoder: Role.PREFILL}
        return Decision({deepest.engine_id: Role.DECODE, decoder: Role.PREFILL},
                        reason=f"burst: {deepest.queued_prefill_tokens} prompt tokens on {deepest.engine_id}")


def _serve_run() -> None:
    """`prorsa run ...` with the scripted policy registered, and every request an engine
    served written to $BURST_LEDGER: leg, traj, turn, engine, its role then, whether it succeeded."""
    import functools

    from prorsa.cli import main
    from prorsa.control.policy import register
    from prorsa.engine.emulated import EmulatedEngine

    register(BurstSwap.name)(BurstSwap)
    ledger: list[dict] = []

    def record(leg: str, method):
        @functools.wraps(method)
        async def served(self, req):
            entry = {"leg": leg, "traj": req.traj_id, "turn": req.turn, "engine": self.engine_id,
                     "role": self.role.value, "ok": False}
            ledger.append(entry)
            result = await method(self, req)
            entry["ok"] = True
            return result
        return served

    # generate() goes through decode(): one entry per leg either way
    EmulatedEngine.prefill = record("prefill", EmulatedEngine.prefill)
    EmulatedEngine.decode = record("decode", EmulatedEngine.decode)
    try:
        main(sys.argv[1:])
    finally:
        Path(os.environ["BURST_LEDGER"]).write_text(json.dumps(ledger))


if __name__ == "__main__":
    _serve_run()


# -- the test -------------------------------------------------------------------------------------


def test_switching_roles_during_a_prefill_burst_loses_and_repeats_nothing(tmp_path):
    pipeline = _write_pipeline(tmp_path)
    specs = expected_specs(pipeline)
    assert len(specs) == 2 * BURST
    out, ledger_file = tmp_path / "runs", tmp_path / "ledger.json"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "run", str(pipeline), "--policy", "burst-swap", f"output_dir={out}"],
            capture_output=True, text=True, timeout=STALLED_S, env=os.environ | {"BURST_LEDGER": str(ledger_file)})
    except subprocess.TimeoutExpired as e:  # a leg stranded by a switch: the run never ends
        progress = (e.stdout or b"").decode(errors="replace").strip().splitlines()[-3:]
        pytest.fail(f"the run stalled for {STALLED_S} s; its last progress: {progress}")
    took = time.monotonic() - t0
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr[-4000:]
    (run_dir,) = out.iterdir()

    # every trajectory exactly once, completed, every turn of its spec there once
    rows = assert_exactly_once(run_dir, specs)
    turns = [(r["traj_id"], t) for r in rows for t in r["turns"]]
    keys = [(traj, t["turn"]) for traj, t in turns]
    assert len(keys) == len(set(keys)) == sum(len(s.turns) for s in specs.values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trajectories_completed"] == 2 * BURST and summary["trajectories_failed"] == 0
    assert summary["turns"] == len(keys) and summary["turns_retried"] == 0 and summary["legs_rescued"] == 0

    # nothing ran twice: each turn's prefill and decode were served once, by the engines it names
    served = json.loads(ledger_file.read_text())
    assert all(e["ok"] for e in served)
    for leg, field in (("prefill", "prefill_engine"), ("decode", "decode_engine")):
        by_turn = [(e["traj"], e["turn"], e["engine"]) for e in served if e["leg"] == leg]
        assert len(by_turn) == len(set(by_turn)) == len(keys), f"{leg}: {len(by_turn)} legs for {len(keys)} turns"
        assert sorted(by_turn) == sorted((traj, t["turn"], t[field]) for traj, t in turns)
    # ... each on an engine whose role then still served it (a draining engine serves both) ...
    wrong = [e for e in served if not getattr(Role(e["role"]), f"serves_{e['leg']}")]
    assert not wrong, wrong[:5]
    # ... and where it was routed: the router gives a turn's two legs to a prefill and a decode
    # engine, so a turn whose legs shared one engine had a leg fall off its route (the scheduler
    # sends a leg whose engine lost its role to wherever its input lies, resources ignored)
    shared = [(traj, t["turn"], t["prefill_engine"]) for traj, t in turns if t["prefill_engine"] == t["decode_engine"]]
    assert not shared and all(t["prefill_engine"] for _, t in turns), shared[:5]

    # the switches, from the run's metrics: engine, when asked, drain (wall seconds, as the turns)
    ds = xr.open_dataset(run_dir / "metrics.nc")
    codes = json.loads(ds.attrs["role_codes"])
    assert ds.attrs["clock"] == "wall" and ds.attrs["time_scale"] == SCALE
    switches = [(str(e), float(t), float(d), int(a), int(b)) for e, t, d, a, b in zip(
        ds.switch_engine.values, ds.switch_time_s.values, ds.switch_drain_s.values,
        ds.switch_from.values, ds.switch_to.values)]
    assert len(switches) == summary["role_switches"] >= 2
    # A prefill leg routed to the engine before its switch was asked for (start_s < t) was still
    # in flight then if start_s + prefill_s > t: it cannot end before that (the engine's own
    # compute time after it was sent). Only this lower bound counts, so a leg still queued in
    # the worker is not counted; and the switch must not have ended before any counted leg.
    in_flight = {}
    for engine, t, drain, old, new in switches:
        if old != codes["prefill"]:
            continue
        ends = [tr["start_s"] + tr["prefill_s"] for _, tr in turns
                if tr["prefill_engine"] == engine and tr["start_s"] < t < tr["start_s"] + tr["prefill_s"]]
        in_flight[(engine, round(t, 3))] = len(ends)
        if ends:
            assert new == codes["decode"] and t + drain >= max(ends) - 1e-3, (engine, t, drain, max(ends))
    assert max(in_flight.values(), default=0) >= 1, (in_flight, switches)
    print(f"\n{len(switches)} switches (engine, wall s, drain s) "
          f"{[(e, round(t, 2), round(d, 2)) for e, t, d, *_ in switches]}; prefill legs in flight on the "
          f"switching engine: {in_flight}; {len(rows)} trajectories, {len(keys)} turns; "
          f"run {summary['makespan_s']:.1f} s, test {took:.1f} s")
