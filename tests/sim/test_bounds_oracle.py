"""The makespan lower bound and the oracle policy."""

from __future__ import annotations

import pytest

from prorsa.config.pipeline import PipelineConfig
from prorsa.control.policy import make_policy
from prorsa.sim.bounds import lower_bound
from prorsa.sim.run import simulate

BASE = {
    "name": "bound", "seed": 1, "policy": "colocated",
    "engines": {"backend": "emulated", "count": 4, "slots": 32, "model": "qwen3-8b"},
    "workload": {"family": "search", "mode": "sync", "prompts": 8, "group_size": 4, "max_turns": 6},
}


def test_no_policy_beats_the_bound_and_the_bound_has_both_limits():
    cfg = PipelineConfig.model_validate(BASE)
    b = lower_bound(cfg)
    assert b.makespan_s == max(b.critical_path_s, b.work_s) > 0
    for policy in ("colocated", "static:1:3", "prorsa", "oracle"):
        assert simulate(cfg, policy).makespan_s >= b.makespan_s, policy
    # more engines only lower the work limit; the critical path stays
    wide = lower_bound(PipelineConfig.model_validate(BASE | {"engines": BASE["engines"] | {"count": 16}}))
    assert wide.work_s == pytest.approx(b.work_s / 4) and wide.critical_path_s == b.critical_path_s


def test_async_bound_counts_concurrency():
    d = BASE | {"workload": BASE["workload"] | {"mode": "async", "concurrency": 2, "trajectories": 8}}
    b = lower_bound(PipelineConfig.model_validate(d))
    assert b.makespan_s > b.critical_path_s  # two at a time: at least four critical paths in a row


def test_oracle_needs_the_future_and_reads_it():
    with pytest.raises(ValueError, match="simulator only"):
        make_policy("oracle")
    cfg = PipelineConfig.model_validate(BASE)
    run = simulate(cfg, "oracle")
    assert run.summary["trajectories_completed"] == 32 and run.policy == "oracle"
    assert any(c.forecast for c in run.recorder.controls)  # it planned from forecasts
