"""The dashboard's scheduler-side state, folded from hand-made intervals: no cluster."""

import json

from prorsa.control.allocator import PlanSummary
from prorsa.control.forecast import ForecastSummary
from prorsa.control.lifecycle import LifecycleEvent, Phase
from prorsa.dashboard.feed import DashboardFeed
from prorsa.dashboard.state import STATES, LiveState, Report
from prorsa.loads import EngineLoad
from prorsa.metrics.recorder import ControlRecord, EngineSample, RoleChange, RunRecorder
from prorsa.roles import Role

META = {"name": "t", "policy": "prorsa", "engines": ["engine-0", "engine-1"], "slots": 8,
        "kv_capacity": 1000, "time_unit": 1.0, "expected": 4}


def load(engine: str, role: str, prefills=0, decodes=0) -> EngineLoad:
    """As the scheduler sees an engine: its role and the legs sent there (cluster/lifecycle_plugin.py)."""
    return EngineLoad(engine, Role(role), queued_prefill_tokens=10 * prefills, prefill_legs=prefills,
                      decode_legs=decodes)


def ev(t, traj, turn, phase, tokens=0) -> LifecycleEvent:
    return LifecycleEvent(t, traj, "swe", turn, phase, tokens)


def test_intervals_fold_into_series_spans_and_counts():
    s = LiveState(META)
    s.fold(1.0, [ev(0.1, "a", 0, Phase.QUEUED, 500), ev(0.2, "a", 0, Phase.PREFILL, 500),
                 ev(0.3, "b", 0, Phase.QUEUED, 300)],
           {"engine-0": load("engine-0", "prefill", 1), "engine-1": load("engine-1", "decode")}, None)
    s.fold(2.0, [ev(1.1, "a", 0, Phase.DECODE), ev(1.5, "a", 0, Phase.TOOL, 40),
                 ev(1.8, "a", 1, Phase.QUEUED, 200)],
           {"engine-0": load("engine-0", "mixed"), "engine-1": load("engine-1", "decode", decodes=1)},
           Report(t=1.9, samples=(EngineSample(1.9, EngineLoad("engine-1", Role.DECODE, 2, 1, 250, 1000)),),
                  decision=ControlRecord(1.5, {}, "keep", ForecastSummary(prefill_tokens=800.0, horizon_s=4.0,
                                                                          decode_seqs_mean=1.5),
                                         {"prefill_tps@0-0.5s": 0.2}),
                  switches=(RoleChange(1.2, "engine-0", Role.PREFILL, Role.MIXED, "burst", 0.3),),
                  switching=("engine-0",), turns=1, tokens=540))
    d = json.loads(json.dumps(s.to_json(), allow_nan=False))
    assert d["version"] == 1 and d["t"] == 2.0 and d["turns"] == 1 and d["tokens"] == 540
    assert d["series"]["t"] == [1.0, 2.0]
    # later turns only (what the forecaster predicts): 200 tokens over the 1 s interval
    assert d["series"]["prefill_tps"] == [0.0, 200.0] and d["series"]["prefill_tps_all"] == [800.0, 200.0]
    assert d["series"]["decode_seqs"] == [0, 0]
    assert d["trajectories"] == {"queued": 2, "prefill": 0, "decode": 0, "tool": 0, "done": 0, "failed": 0}
    assert d["series"]["trajectories"]["queued"] == [1, 2] and set(d["series"]["trajectories"]) == set(STATES)
    assert d["roles"]["engine-0"] == [[1.0, 2.0, "prefill"], [2.0, 2.0, "mixed"]]
    assert d["roles"]["engine-1"] == [[1.0, 2.0, "decode"]]
    e1 = d["engines"]["engine-1"]
    assert (e1["queued"], e1["active"], e1["kv_use"], e1["legs_decode"]) == (2, 1, 0.25, 1)
    assert d["engines"]["engine-0"]["switching"] and not e1["switching"]
    assert d["series"]["kv_use"]["engine-1"] == [0.0, 0.25] and d["series"]["queued"]["engine-1"] == [0, 2]
    assert d["switches"] == [{"t": 1.2, "engine": "engine-0", "from": "prefill", "to": "mixed",
                              "reason": "burst", "drain_s": 0.3}]
    assert d["decision"]["reason"] == "keep" and d["decision"]["forecast_error"] == {"prefill_tps@0-0.5s": 0.2}
    assert d["forecasts"] == {"t": [1.5], "horizon_s": [4.0], "prefill_tps": [200.0], "decode_seqs": [1.5]}
    assert d["cost"]["folds"] == 2 and s.version == 2


def test_lanes_start_with_the_run_failures_done_and_non_finite_forecasts():
    s = LiveState(META)
    assert s.to_json()["roles"] == {"engine-0": [], "engine-1": []}
    s.begin(0.0, {"engine-0": load("engine-0", "mixed"), "engine-1": load("engine-1", "mixed"), "tools-0": load("tools-0", "mixed")})
    s.fold(1.0, [ev(0.1, "a", 0, Phase.QUEUED, 5), ev(0.2, "b", 0, Phase.QUEUED, 5),
                 ev(0.5, "b", 0, Phase.DONE)], {"engine-0": load("engine-0", "mixed"), "engine-1": load("engine-1", "decode")}, None)
    s.fold(2.0, [], {}, Report(t=2.0, failed=("a",),
                               decision=ControlRecord(1.9, {}, "", PlanSummary(switch_cost_seq_s=float("inf")), {})))
    d = json.loads(json.dumps(s.to_json(), allow_nan=False))
    assert d["trajectories"]["failed"] == 1 and d["trajectories"]["done"] == 1 and d["trajectories"]["queued"] == 0
    assert d["decision"]["forecast"]["switch_cost_seq_s"] is None and d["decision"]["forecast"]["horizon_s"] == 0
    assert d["forecasts"]["t"] == []  # a policy without a horizon forecasts nothing to plot
    assert set(d["engines"]) == set(d["roles"]) == {"engine-0", "engine-1"}  # other workers are not engines
    assert d["roles"] == {"engine-0": [[0.0, 1.0, "mixed"]], "engine-1": [[0.0, 1.0, "mixed"], [1.0, 1.0, "decode"]]}


def test_feed_reports_only_what_is_new():
    rec = RunRecorder(engines=["engine-0"], slots=8, expected=None)
    feed = DashboardFeed(rec, lambda: 3.0)
    assert feed.report().decision is None
    rec.control(ControlRecord(1.0, {}, "why", None, {}))
    rec.role_change(RoleChange(1.0, "engine-0", Role.MIXED, Role.DECODE, "why", 0.1))
    r = feed.report(("engine-0",))
    assert r.decision.reason == "why" and len(r.switches) == 1 and r.switching == ("engine-0",) and r.t == 3.0
    again = feed.report()
    assert again.decision is None and again.switches == () and again.switching == ()
