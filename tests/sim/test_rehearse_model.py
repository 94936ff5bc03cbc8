"""A rehearsal under a corrected model, its lifecycle events kept; a policy told a wrong model."""

import pytest

from prorsa.agent.workload import Workload
from prorsa.config.pipeline import PipelineConfig
from prorsa.control.calibration import PhaseClock
from prorsa.control.lifecycle import Phase
from prorsa.costmodel.misfit import ModelScale
from prorsa.rollout.context import resolve
from prorsa.sim.rehearse import rehearser
from prorsa.sim.run import simulate, simulate_async

CFG = PipelineConfig.model_validate({
    "name": "rehearse-model", "seed": 3, "policy": "static:1:2",
    "engines": {"count": 3, "slots": 64, "gpu": "h200", "model": "qwen3-30b-a3b", "ep": 2},
    "workload": {"family": "math-tir", "mode": "sync", "prompts": 6, "group_size": 4, "max_turns": 3}})


def test_a_rehearsal_keeps_its_events_and_runs_the_model_it_is_given():
    rehearse = rehearser(resolve(CFG), simulate_async)
    specs = Workload.from_config(CFG.workload, CFG.seed).trajectories_for_step(0)
    events: list = []
    exact = rehearse(specs, (1, 2, 0), events=events)
    # the replay's events reach the policy each control interval: all but the last interval's
    done = sum(e.phase is Phase.DONE for e in events)
    assert 0.8 * len(specs) <= done <= len(specs)
    clock = PhaseClock()
    for ev in events:
        clock.observe(ev)
    rates = clock.rates()
    turns = sum(len(s.turns) for s in specs)
    assert 0.8 * turns <= rates.decode_legs <= turns and rates.prefill_legs >= rates.decode_legs
    # a model whose memory is half as fast decodes slower: the rehearsal runs on it, not the run's
    assert rehearse(specs, (1, 2, 0), scale=ModelScale(decode=0.5)) > 1.2 * exact
    assert rehearse(specs, (1, 2, 0)) == exact


def test_a_wrong_model_moves_the_policy_and_never_the_engines():
    """A static split has no model to be wrong: its run is the same under any model error."""
    a = simulate(resolve(CFG)).makespan_s
    assert simulate(resolve(CFG), model_error=ModelScale(prefill=0.5, decode=2.0)).makespan_s == pytest.approx(a)
