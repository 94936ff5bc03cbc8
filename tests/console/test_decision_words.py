"""A policy's decisions in words: rendered from the records the policies emit (the allocator's
plans, a simulated run's reactive and between-step decisions), none of the allocator's shorthand."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from prorsa.console.decision_words import decision_line, moves_in_words, stay_in_words
from prorsa.control.allocator import Allocator, Capacity
from prorsa.control.forecast import Forecast
from prorsa.control.policy import Decision, make_policy
from prorsa.costmodel import CostModel
from prorsa.loads import EngineLoad
from prorsa.roles import Role
from prorsa.rollout.context import load_run
from prorsa.sim.run import lend, simulate

REPO = Path(__file__).resolve().parents[2]
P, D, M = Role.PREFILL, Role.DECODE, Role.MIXED
JARGON = re.compile(r"\bP\d+ D\d+ M\d+\b|seq-s|-0\.0\b|\bgains? -?\d+\.\d|\d+x switch")


def steady(append=0.0, turns_per_s=0.0, seqs=0.0, ctx=8192, backlog_turns=0, fresh=False) -> Forecast:
    bins = 8
    return Forecast(
        start_s=0.0, bin_s=0.5, prefill_tokens_per_s=np.full(bins, append * turns_per_s),
        prefill_turns_per_s=np.full(bins, float(turns_per_s)), decode_seqs=np.full(bins, float(seqs)),
        kv_tokens=np.full(bins, float(seqs * ctx)), backlog_tokens=append * backlog_turns,
        backlog_turns=backlog_turns, backlog_fresh_turns=backlog_turns if fresh else 0,
        prefill_prefix_tokens=0.0 if fresh else ctx, decode_tokens_per_turn=300.0,
        decode_tps_per_seq=80.0, decode_remaining_tokens=200.0)


def loads(roles) -> list[EngineLoad]:
    return [EngineLoad(f"engine-{i}", r, 0, 0, 30000, 700000) for i, r in enumerate(roles)]


@pytest.fixture(scope="module")
def dense() -> Capacity:
    return Capacity.from_cost(CostModel.from_names("h200", "qwen3-8b"), slots=16)


def planned(cap: Capacity, fc: Forecast, roles) -> tuple[dict, Decision]:
    """A decision as the adaptive policy emits one from a plan (control/adaptive.py decide)."""
    engines = loads(roles)
    plan = Allocator(cap).plan(fc, engines)
    return {e.engine_id: e.role for e in engines}, Decision(plan.targets, plan.reason, forecast=plan.summary())


def test_a_prefill_flood_move_says_what_moved_why_and_the_predicted_gain(dense):
    flood = steady(append=8192, seqs=64, backlog_turns=64, fresh=True)
    roles, decision = planned(dense, flood, [M] * 8)
    line = decision_line(roles, decision)
    f = decision.forecast
    gain = 100 * (f.cost_now_seq_s - f.cost_goal_seq_s) / f.cost_now_seq_s
    moved = [e for e, r in decision.targets.items() if roles[e] is not r]
    assert moved and line.startswith(f"{len(moved)} engine{'s' if len(moved) > 1 else ''} ({', '.join(moved)}) "
                                     "mixed -> prefill"), line
    assert f"{int(f.backlog_tokens):,} prefill tokens queued" in line
    assert f"(forecast for the next {f.horizon_s:g} s: " in line and line.endswith(f"predicted gain {gain:.0f}%)"), line
    assert f"toward {int(f.goal_prefill)} prefill" in line
    assert not JARGON.search(line), (line, decision.reason)  # the record's own reason is jargon
    assert JARGON.search(decision.reason)


def test_a_move_toward_decoding_tells_the_decode_demand(dense):
    long_decodes = steady(append=500, turns_per_s=4, seqs=110, ctx=16000)
    roles, decision = planned(dense, long_decodes, [P] * 6 + [D] * 2)
    line = decision_line(roles, decision)
    assert "prefill -> " in line and "110 sequences decoding" in line and not JARGON.search(line), line


def test_a_plan_that_keeps_its_split_moves_nothing_and_says_why_in_words(dense):
    roles, decision = planned(dense, steady(append=200, turns_per_s=40, seqs=96), [M] * 8)
    assert decision.reason.startswith("keep ") and not decision.targets
    assert decision_line(roles, decision) is None
    assert stay_in_words(decision.reason) == "no other split gains enough over the horizon to pay for the switch"


def test_moves_are_counted_per_kind_with_the_engines_named():
    roles = {"engine-0": M, "engine-1": M, "engine-2": D}
    assert moves_in_words(roles, {"engine-1": P, "engine-0": P, "engine-2": D}) == \
        "2 engines (engine-0, engine-1) mixed -> prefill"
    assert moves_in_words(roles, {"engine-2": D}) == ""


def _recorded(pipeline: str, policy_name: str) -> list[tuple[dict, Decision]]:
    """Every decision a policy took over a pipeline's rollout, simulated on emulated engines."""
    run = load_run(REPO / "pipelines" / pipeline, {"engines.backend": "emulated"})
    inner = make_policy(policy_name, replace(run.policy, rehearse=lend(run)))
    seen: list[tuple[dict, Decision]] = []

    def recording(fn):
        def call(snapshot):
            decision = fn(snapshot)
            seen.append(({e.engine_id: e.role for e in snapshot.engines}, decision))
            return decision
        return call

    inner.decide = recording(inner.decide)
    if hasattr(inner, "between_steps"):
        inner.between_steps = recording(inner.between_steps)
    simulate(run, inner)
    return seen


def test_a_simulated_runs_decisions_read_in_words():
    reactive = _recorded("moe-step.yaml", "reactive")
    moves = [(roles, d) for roles, d in reactive if decision_line(roles, d) is not None]
    assert moves, [d.reason for _, d in reactive]
    for roles, d in moves:
        line = decision_line(roles, d)
        engine, role = next(iter(d.targets.items()))
        assert line.startswith(f"1 engine ({engine}) {roles[engine].value} -> {role.value} (thresholds crossed: "), line
    stays = {stay_in_words(d.reason) for _, d in reactive if not d.targets}
    assert "waiting out the cooldown after its last switch" in stays
    between = [d for _, d in _recorded("quickstart.yaml", "prorsa") if d.reason.startswith("next step")]
    assert between
    roles = {"engine-0": P, "engine-1": M, "engine-2": M}  # a split the next step leaves
    line = decision_line(roles, replace(between[0], targets={"engine-0": M}))
    assert line.startswith("1 engine (engine-0) prefill -> mixed (the split for the next step (")
    assert not JARGON.search(line), line
