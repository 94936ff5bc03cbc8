"""Role switches by restart (engines.role_switch: restart) in the emulated engine and the simulator:
an engine crossing the KV connector's sides empties, is held engines.restart_s and loses its
prefix cache; between decode and mixed it switches in place."""

from __future__ import annotations

import asyncio

import pytest

from prorsa.config.pipeline import PipelineConfig
from prorsa.costmodel import CostModel
from prorsa.engine.base import DecodeRequest, PrefillRequest
from prorsa.engine.emulated import EmulatedEngine
from prorsa.roles import Role, restarts_kv
from prorsa.rollout.context import policy_context, resolve
from prorsa.sim.clock import run_virtual
from prorsa.sim.run import simulate

RESTART_S = 20.0
DENSE = {
    "name": "restart", "seed": 3, "policy": "reactive",
    "engines": {"backend": "emulated", "count": 4, "slots": 32, "model": "qwen3-8b"},
    "workload": {"family": "swe", "mode": "sync", "prompts": 8, "group_size": 4, "max_turns": 4,
                 "tool_time_scale": 0.25},
}


def cfg_of(**engines) -> PipelineConfig:
    return PipelineConfig.model_validate(DENSE | {"engines": DENSE["engines"] | engines})


def test_a_restart_holds_the_engine_and_empties_its_prefix_cache():
    cost = CostModel.from_names("h200", "qwen3-8b", restart_s=RESTART_S)

    async def main():
        engine = EmulatedEngine("e0", Role.PREFILL, cost, slots=8)
        await engine.start()
        await engine.prefill(PrefillRequest("a", 0, 4000, 4000))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await engine.restart_as(Role.MIXED)  # no-op for the layout, a restart for the connector
        held = loop.time() - t0
        lost = await engine.generate(DecodeRequest("a", 1, context_tokens=4100, max_tokens=10, new_tokens=100))
        t1 = loop.time()
        await engine.restart_as(Role.DECODE)  # both pull KV: in place
        assert loop.time() == t1 and engine.role is Role.DECODE
        await engine.stop()
        return held, lost.cached_tokens

    held, cached = run_virtual(main())
    assert held == pytest.approx(RESTART_S) and cached == 0


def test_the_restart_price_reaches_the_policy_and_the_engines_only_on_that_path():
    assert policy_context(cfg_of()).cost.restart_s is None
    assert resolve(cfg_of()).switch == "in_place"
    run = resolve(cfg_of(role_switch="restart", restart_s=RESTART_S))
    assert run.switch == "restart" and run.policy.cost.restart_s == RESTART_S
    assert all(c.mixed.restart_s == RESTART_S for c in run.engine_costs)


def test_switches_by_restart_in_a_run_lose_nothing_and_take_the_restart():
    in_place = simulate(resolve(cfg_of()), "reactive")
    restart = simulate(resolve(cfg_of(role_switch="restart", restart_s=RESTART_S)), "reactive")
    for sim in (in_place, restart):
        assert sim.summary["trajectories_completed"] == 32 and sim.summary["trajectories_failed"] == 0
    across = [c for c in restart.recorder.role_changes if restarts_kv(c.from_role, c.to_role)]
    assert across, "reactive made no switch across the connector's sides"
    assert all(c.drain_s >= RESTART_S for c in across)
    assert all(c.drain_s < RESTART_S for c in in_place.recorder.role_changes)
