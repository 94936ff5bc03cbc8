"""Weight updates between training steps: engines stall and forget every cached prefix."""

from __future__ import annotations

import pytest

from prorsa.config.pipeline import PipelineConfig
from prorsa.sim.run import simulate
from prorsa.rollout.context import resolve

BASE = {
    "name": "updates", "seed": 2, "policy": "colocated",
    "engines": {"backend": "emulated", "count": 4, "slots": 32, "model": "qwen3-8b"},
    "workload": {"family": "search", "mode": "sync", "prompts": 4, "group_size": 4, "steps": 2, "max_turns": 4},
}


def cfg(**workload) -> PipelineConfig:
    return PipelineConfig.model_validate(BASE | {"workload": BASE["workload"] | workload})


def test_sync_steps_are_separated_by_the_update():
    plain, paused = simulate(resolve(cfg())), simulate(resolve(cfg(weight_update_s=30.0)))
    assert paused.summary["trajectories_completed"] == plain.summary["trajectories_completed"] == 32
    assert paused.makespan_s >= plain.makespan_s + 30.0 - 1e-6
    first = min(r.start_s for r in paused.recorder.trajectories if r.spec.step == 1)
    last = max(r.end_s for r in paused.recorder.trajectories if r.spec.step == 0)
    assert first >= last + 30.0 - 1e-6  # no step-1 turn starts before the weights are in


def test_async_updates_invalidate_the_prefixes_of_trajectories_in_flight():
    """Rollout goes on through updates, but every trajectory in flight loses its cached context
    and re-prefills it whole: recomputed tokens appear where there were none."""
    kw = {"mode": "async", "concurrency": 16, "trajectories": 48, "prompts": 2, "group_size": 4}
    plain, updated = simulate(resolve(cfg(**kw))), simulate(resolve(cfg(**kw, weight_update_s=1.0)))
    assert updated.summary["trajectories_completed"] == 48
    assert updated.summary["recomputed_tokens"] > plain.summary["recomputed_tokens"]
    assert updated.summary["prefix_hit_rate"] < plain.summary["prefix_hit_rate"]


MOE = {"backend": "emulated", "count": 4, "slots": 64, "gpu": "h200", "model": "qwen3-30b-a3b", "ep": 4}
ASYNC = {"mode": "async", "concurrency": 16, "trajectories": 32, "max_turns": 4, "weight_update_s": 1.0,
         "weight_update_every_s": 5.0}


def test_a_rehearsal_replays_the_declared_updates():
    """The policy's simulator replays an asynchronous run's weight updates: the same trajectories
    take longer, under the same split, where updates are declared."""
    from prorsa.agent.workload import Workload
    from prorsa.rollout.context import resolve
    from prorsa.sim.rehearse import rehearser
    from prorsa.sim.run import simulate_async

    updated = cfg(**ASYNC)
    plain = cfg(**ASYNC | {"weight_update_s": 0.0, "weight_update_every_s": None})
    specs = [Workload.from_config(updated.workload, seed=2).trajectory(i) for i in range(32)]
    took = {name: rehearser(resolve(c), simulate_async)(specs, (0, 0, 4)) for name, c in
            (("plain", plain), ("updated", updated))}
    assert took["updated"] > took["plain"] + 1.0


def test_with_declared_updates_and_no_prior_prorsa_opens_on_a_rehearsed_split_and_holds_it():
    c = PipelineConfig.model_validate(BASE | {"engines": MOE, "workload": ASYNC | {"family": "swe"}})
    run = simulate(resolve(c), "prorsa")
    first = run.recorder.controls[0].reason
    assert first.startswith("hold P"), first
    assert run.summary["role_switches"] == 0
    assert run.summary["trajectories_completed"] == 32


def test_auto_prices_the_update_from_the_model_and_a_declared_value_wins():
    from prorsa.costmodel import CostModel
    from prorsa.rollout.context import update_seconds

    priced = CostModel.from_names("h200", "qwen3-8b").weight_update_time()
    assert update_seconds(cfg(weight_update_s="auto")) == pytest.approx(priced)
    assert update_seconds(cfg(weight_update_s=7.0)) == 7.0
    assert update_seconds(cfg()) == 0.0  # none declared: no update modelled, as before
    bigger = PipelineConfig.model_validate(BASE | {"engines": BASE["engines"] | {"model": "qwen3-32b"},
                                                   "workload": BASE["workload"] | {"weight_update_s": "auto"}})
    assert update_seconds(bigger) > update_seconds(cfg(weight_update_s="auto"))
    plain, auto = simulate(resolve(cfg())), simulate(resolve(cfg(weight_update_s="auto")))
    assert auto.makespan_s >= plain.makespan_s + priced - 1e-6
