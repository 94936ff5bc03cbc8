"""Workload: determinism, order independence, family shapes against FACTS.md, caps, replay."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prorsa.agent.families import FAMILIES, get_family
from prorsa.agent.trace import write_trace
from prorsa.agent.workload import TraceError, TrajectorySpec, TurnSpec, Workload, context_budget
from prorsa.config.pipeline import WorkloadConfig

SMALL = Path(__file__).resolve().parents[1] / "data" / "small_trace.jsonl"


def make(seed: int = 0, **cfg) -> Workload:
    return Workload.from_config(WorkloadConfig(**cfg), seed)


def _check_shape(spec: TrajectorySpec) -> None:
    assert spec.turns[-1].done and spec.turns[-1].tool_latency_s == 0
    assert not any(t.done for t in spec.turns[:-1])
    assert all(t.decode_tokens >= 1 and t.appended_tokens >= 0 for t in spec.turns)


# --- determinism ------------------------------------------------------------------------------

def test_same_seed_same_specs_different_seed_different():
    a, b, c = (make(seed, prompts=4, group_size=3) for seed in (1, 1, 2))
    for step in (0, 1):
        assert a.trajectories_for_step(step) == b.trajectories_for_step(step)
        assert a.trajectories_for_step(step) != c.trajectories_for_step(step)
    assert a.trajectories_for_step(0) != a.trajectories_for_step(1)
    assert [a.trajectory(i) for i in range(8)] == [b.trajectory(i) for i in range(8)]
    assert a.trajectory(5).turns != c.trajectory(5).turns


def test_order_independence():
    fresh = make(3, mode="async", trajectories=100, group_size=4)
    t17 = fresh.trajectory(17)
    warmed = make(3, mode="async", trajectories=100, group_size=4)
    for i in range(17):
        warmed.trajectory(i)
    assert warmed.trajectory(17) == t17
    assert make(3).trajectories_for_step(5) == make(3).trajectories_for_step(5)
    w = make(3)
    later_first = w.trajectories_for_step(2)
    w.trajectories_for_step(0), w.trajectories_for_step(1)
    assert w.trajectories_for_step(2) == later_first
    assert make(3).trajectories_for_step(2, first=5) == later_first[:5]  # the first ones, drawn alone
    assert make(3).trajectories_for_step(2, first=10**6) == later_first


def test_sync_labels_and_ids():
    specs = make(0, prompts=3, group_size=2).trajectories_for_step(4)
    assert [s.traj_id for s in specs] == [f"s4-p{p}-g{g}" for p in range(3) for g in range(2)]
    assert all(s.step == 4 and s.family == "swe" for s in specs)
    assert len({s.seed for s in specs}) == len(specs)  # token ids differ within a group
    for s in specs:
        _check_shape(s)


def test_async_groups_of_consecutive_indices_share_a_prompt():
    w = make(0, mode="async", trajectories=12, group_size=3)
    specs = [w.trajectory(i) for i in range(9)]
    assert [s.traj_id for s in specs] == [f"a{i}" for i in range(9)]
    assert [(s.prompt_index, s.group_index) for s in specs] == [(i // 3, i % 3) for i in range(9)]
    for p in range(3):
        group = specs[3 * p: 3 * p + 3]
        assert len({s.turns[0].appended_tokens for s in group}) == 1  # one prompt
        assert len({s.turns for s in group}) == 3  # different samples
    with pytest.raises(ValueError):
        w.trajectory(-1)


def test_group_members_share_hardness_and_it_scales_turns_and_decode():
    w = make(0, family="math-tir", prompts=600, group_size=4)
    specs = w.trajectories_for_step(0)
    h = np.array([w.prompt_hardness(0, p) for p in range(600)])
    assert w.prompt_hardness(0, 7) == h[7] != w.prompt_hardness(1, 7)  # per (step, prompt)
    turns = np.array([len(s.turns) for s in specs], float).reshape(600, 4)
    decode = np.array([np.mean([t.decode_tokens for t in s.turns]) for s in specs]).reshape(600, 4)
    assert np.corrcoef(np.log(h), np.log(turns.mean(axis=1)))[0, 1] > 0.3
    assert np.corrcoef(np.log(h), np.log(decode.mean(axis=1)))[0, 1] > 0.3
    # Members of a group resemble each other more than strangers (intra-class correlation).
    for x in (turns, np.log(decode)):
        within = x.var(axis=1, ddof=1).mean()
        between = x.mean(axis=1).var(ddof=1) - within / 4
        assert between / (between + within) > 0.1


def test_agent_package_stays_engine_agnostic():
    code = (
        "import sys, prorsa.agent.workload, prorsa.agent.trace, prorsa.agent.families\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')\n"
        "       or m.startswith(('prorsa.sim', 'prorsa.rollout'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- family shapes against FACTS.md -------------------------------------------------------------

# Loose bands around "Workload figures for agentic RL"; realised (after the context cap) values:
# mean turns, max turns, appended median, decode (statistic, lo, hi), tool median, timeout, ctx cap
FACTS = {
    "swe": ((16, 64), 128, (700, 1000), ("mean", 400, 700), (0.1, 0.6), 60, 65536),
    "search": ((1, 4), 4, (300, 600), ("max", 1, 512), (0.5, 3.0), 30, 15000),
    "math-tir": ((3, 16), 16, (50, 1000), ("median", 1000, 4000), (0.05, 1.0), 120, 24576),
    "terminal": ((1, 50), 50, (900, 20000), ("median", 150, 600), (1.0, 30.0), 600, 32768),
}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_family_draws_match_facts(name):
    (t_lo, t_hi), max_turns, (a_lo, a_hi), (stat, d_lo, d_hi), (l_lo, l_hi), timeout, cap = FACTS[name]
    specs = make(11, family=name, prompts=750, group_size=4).trajectories_for_step(0)
    turns = np.array([len(s.turns) for s in specs])
    appended = np.array([t.appended_tokens for s in specs for t in s.turns[1:]])
    decode = np.array([t.decode_tokens for s in specs for t in s.turns])
    tools = np.array([t.tool_latency_s for s in specs for t in s.turns[:-1]])
    assert t_lo <= turns.mean() <= t_hi and turns.max() <= max_turns
    assert a_lo <= np.median(appended) <= a_hi
    assert d_lo <= getattr(np, stat)(decode) <= d_hi
    assert decode.max() <= FAMILIES[name].max_decode
    assert l_lo <= np.median(tools) <= l_hi and tools.max() <= timeout
    assert max(s.context_tokens for s in specs) <= cap
    if name == "swe":  # the heavy tails FACTS quotes: p90 3-6k, p99 10-31k appended tokens
        assert 3000 <= np.percentile(appended, 90) <= 6000
        assert 10000 <= np.percentile(appended, 99) <= 31000
        assert (tools > 10).mean() > 0.005  # a tail to minutes, not just a lognormal body


def test_registry_names_match_the_config_literal():
    literal = WorkloadConfig.model_fields["family"].annotation.__args__[0].__args__  # Literal[...] | None
    assert set(FAMILIES) == set(literal)
    with pytest.raises(KeyError, match="known: swe"):
        get_family("chess")


# --- shaping ------------------------------------------------------------------------------------

def test_max_turns_keeps_a_prefix():
    full = make(5, prompts=6, group_size=2).trajectories_for_step(0)
    capped = make(5, prompts=6, group_size=2, max_turns=3).trajectories_for_step(0)
    for f, c in zip(full, capped):
        _check_shape(c)
        assert len(c.turns) == min(3, len(f.turns))
        assert c.turns[:-1] == f.turns[: len(c.turns) - 1]
        last, orig = c.turns[-1], f.turns[len(c.turns) - 1]
        assert (last.appended_tokens, last.decode_tokens) == (orig.appended_tokens, orig.decode_tokens)


@pytest.mark.parametrize("max_context", [16, 500, 3000, 20000])
def test_max_context_is_honoured(max_context):
    full = make(6, prompts=20, group_size=2).trajectories_for_step(0)
    capped = make(6, prompts=20, group_size=2, max_context=max_context).trajectories_for_step(0)
    for f, c in zip(full, capped):
        _check_shape(c)
        assert c.context_tokens <= max_context
        if len(c.turns) > 1 or f.turns[0].appended_tokens + f.turns[0].decode_tokens <= max_context:
            assert c.turns[:-1] == f.turns[: len(c.turns) - 1]  # ended early, not reshaped
        if len(c.turns) < len(f.turns) and len(c.turns) > 1:
            nxt = f.turns[len(c.turns)]  # the dropped turn would not have fitted
            assert c.context_tokens + nxt.appended_tokens + nxt.decode_tokens > max_context
    if max_context == 16:  # SWE prompts are ~2k tokens: one clipped turn, still >= 1 decoded
        assert all(len(c.turns) == 1 and c.turns[0].decode_tokens >= 1 for c in capped)


def test_token_and_tool_time_scale():
    base = make(7, prompts=5, group_size=2).trajectories_for_step(0)
    scaled = make(7, prompts=5, group_size=2, token_scale=0.01, tool_time_scale=2.0).trajectories_for_step(0)
    for b, s in zip(base, scaled):
        assert len(b.turns) == len(s.turns) and b.seed == s.seed
        for tb, ts in zip(b.turns, s.turns):
            assert ts.appended_tokens == max(1, round(tb.appended_tokens * 0.01))
            assert ts.decode_tokens == max(1, round(tb.decode_tokens * 0.01))
            assert ts.tool_latency_s == pytest.approx(2.0 * tb.tool_latency_s)
    no_tools = make(7, prompts=5, group_size=2, tool_time_scale=0).trajectories_for_step(0)
    assert all(t.tool_latency_s == 0 for s in no_tools for t in s.turns)


def test_token_scale_then_max_context_in_engine_units():
    specs = make(8, prompts=10, group_size=2, token_scale=0.05, max_context=512).trajectories_for_step(0)
    assert all(s.context_tokens <= 512 for s in specs)
    assert max(len(s.turns) for s in specs) > 3  # scaled down, several turns still fit


@settings(max_examples=25, deadline=None)
@given(family=st.sampled_from(["swe", "terminal", "math-tir", "search"]), scale=st.sampled_from([0.3, 1.0, 2.0, 4.0]),
       max_turns=st.sampled_from([None, 3]), seed=st.integers(0, 2**16))
def test_context_budget_bounds_every_scaled_trajectory(family, scale, max_turns, seed):
    cfg = WorkloadConfig(family=family, prompts=6, group_size=2, token_scale=scale, max_turns=max_turns)
    specs = Workload.from_config(cfg, seed).trajectories_for_step(0)
    assert max(s.context_tokens for s in specs) <= context_budget(cfg)


def test_context_budget_known_answers():
    swe = get_family("swe")
    # SWE's 65,536 in its own units, x4, and a token for each of two counts a turn, up to 128 turns
    assert context_budget(WorkloadConfig(family="swe", token_scale=4.0)) == 4 * swe.context_cap + 2 * swe.max_turns
    assert context_budget(WorkloadConfig(family="swe", token_scale=4.0, max_turns=12)) == 4 * 65536 + 24
    assert context_budget(WorkloadConfig(family="swe", token_scale=4.0, max_context=8192)) == 8192
    assert context_budget(WorkloadConfig(family="swe")) == swe.context_cap  # unscaled: nothing rounds
    assert context_budget(WorkloadConfig(trace="t.jsonl", max_context=4096)) == 4096
    assert context_budget(WorkloadConfig(mix={"search": 1, "swe": 1}, token_scale=0.5, max_turns=2)) == 32768 + 4
    # the scaled cap is reached: at x4, the longest of 128 SWE trajectories is past 3.5x the unscaled cap
    x4 = dict(family="swe", prompts=16, group_size=8, token_scale=4.0, max_turns=12)
    longest = max(s.context_tokens for s in make(0, **x4).trajectories_for_step(0))
    assert 3.5 * swe.context_cap < longest <= context_budget(WorkloadConfig(**x4))


# --- trace replay -------------------------------------------------------------------------------

def test_trace_replay_reproduces_the_specs(tmp_path):
    drawn = make(9, prompts=3, group_size=2)
    original = [drawn.trajectories_for_step(s) for s in (0, 1)]
    path = tmp_path / "run.jsonl"
    write_trace(path, original[0] + original[1])
    replay = make(9, trace=str(path), prompts=3, group_size=2)
    assert replay.trajectories_for_step(0) == original[0]
    assert replay.trajectories_for_step(1) == original[1]
    # Cycling: step 2 reuses step 0's trajectories under new ids and seeds.
    again = replay.trajectories_for_step(2)
    assert [s.turns for s in again] == [s.turns for s in original[0]]
    assert [s.traj_id for s in again] == [f"s2-p{p}-g{g}" for p in range(3) for g in range(2)]
    assert all(a.seed != o.seed for a, o in zip(again, original[0]))
    assert replay.prompt_hardness(0, 0) == 1.0


def test_the_opening_prompts_are_the_first_turns_a_run_starts_at_once(tmp_path):
    """Sync: the first step's B x G prompts; async: the first `concurrency` (fewer if the run has
    fewer), less any a trace releases later."""
    sync = make(1, prompts=3, group_size=2)
    assert sync.opening_prompts() == [s.turns[0].appended_tokens for s in sync.trajectories_for_step(0)]
    a = make(1, mode="async", concurrency=5, group_size=2, trajectories=50)
    assert a.opening_prompts() == [a.trajectory(i).turns[0].appended_tokens for i in range(5)]
    assert len(make(1, mode="async", concurrency=5, trajectories=3).opening_prompts()) == 3
    specs = [replace(s, start_s=[None, 0.0, 2.0, 0.0][i]) for i, s in enumerate(sync.trajectories_for_step(0)[:4])]
    write_trace(tmp_path / "t.jsonl", specs)
    staggered = make(1, trace=str(tmp_path / "t.jsonl"), mode="async", concurrency=4, trajectories=8)
    assert staggered.opening_prompts() == [specs[i].turns[0].appended_tokens for i in (0, 1, 3)]


def test_trace_replay_async_cycles_the_fixture():
    w = make(0, trace=str(SMALL), mode="async", trajectories=10, group_size=2)
    specs = [w.trajectory(i) for i in range(9)]
    assert [s.family for s in specs[:5]] == ["swe", "search", "math-tir", "trace", "swe"]
    assert specs[4].turns == specs[0].turns and specs[8].turns == specs[0].turns
    assert len({s.traj_id for s in specs}) == 9
    assert specs[2].seed == 7  # the trace's own seed on the first pass


def test_trace_replay_applies_scaling_and_explicit_family_label():
    w = make(0, trace=str(SMALL), family="terminal", prompts=2, group_size=2,
             token_scale=0.5, max_turns=2)
    specs = w.trajectories_for_step(0)
    assert specs[0].turns[0].appended_tokens == 900 and len(specs[0].turns) == 2
    assert specs[2].turns[1].appended_tokens == 0  # an empty observation stays empty
    assert specs[3].family == "terminal"  # the fixture's unlabelled trajectory


def test_empty_trace_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(TraceError, match="holds no trajectories"):
        make(0, trace=str(path))


def test_replay_does_not_mutate_the_trace():
    w = make(0, trace=str(SMALL), prompts=2, group_size=2, token_scale=0.1)
    before = w.trace
    w.trajectories_for_step(0)
    assert w.trace == before and w.trace is not None
    assert replace(w.trace[0], traj_id="x").turns == before[0].turns


# --- mixes of families --------------------------------------------------------------------------

def test_a_mix_of_one_family_draws_exactly_that_family():
    for kw in ({"prompts": 5, "group_size": 3, "steps": 2, "decode_growth": 4.0},
               {"mode": "async", "trajectories": 20, "group_size": 2}):
        alone, mixed = make(4, family="math-tir", **kw), make(4, mix={"math-tir": 2.5}, **kw)
        if kw.get("mode") == "async":
            assert [mixed.trajectory(i) for i in range(12)] == [alone.trajectory(i) for i in range(12)]
        else:
            assert mixed.trajectories_for_step(1) == alone.trajectories_for_step(1)  # decode_growth too
        assert mixed.prompt_hardness(0, 3) == alone.prompt_hardness(0, 3)


def test_mix_families_are_fixed_by_the_seed_and_shared_by_a_group():
    w = make(0, mix={"swe": 1, "math-tir": 1, "search": 2}, prompts=8, group_size=2, steps=2)
    step0, step1 = w.trajectories_for_step(0), w.trajectories_for_step(1)
    assert [s.family for s in step0[::2]] == ["search", "search", "math-tir", "swe", "swe", "search", "swe", "swe"]
    assert [s.family for s in step1[::2]] == ["search", "math-tir", "math-tir", "math-tir", "search", "search",
                                              "swe", "search"]
    assert all(a.family == b.family for a, b in zip(step0[::2], step0[1::2]))  # a GRPO group shares its task
    assert [w.family_of(0, p).name for p in range(8)] == [s.family for s in step0[::2]]
    for s in step0:
        _check_shape(s)
        assert s.context_tokens <= get_family(s.family).context_cap  # each family's own context cap
    # the order the pipeline lists them in does not matter
    again = make(0, mix={"search": 2, "math-tir": 1, "swe": 1}, prompts=8, group_size=2, steps=2)
    assert again.trajectories_for_step(0) == step0
    a = make(4, mix={"swe": 1, "terminal": 1}, mode="async", trajectories=8, group_size=2)
    assert [a.trajectory(i).family for i in range(8)] == ["swe", "swe", "terminal", "terminal"] + ["swe"] * 4


def test_mix_end_moves_the_shares_linearly_across_steps():
    w = make(0, mix={"swe": 3, "math-tir": 1}, mix_end={"math-tir": 1}, steps=5, prompts=4, group_size=1)
    assert [w.mix_weights(s) for s in range(5)] == [
        {"swe": 0.75, "math-tir": 0.25}, {"swe": 0.5625, "math-tir": 0.4375}, {"swe": 0.375, "math-tir": 0.625},
        {"swe": 0.1875, "math-tir": 0.8125}, {"math-tir": 1.0}]
    assert make(0).mix_weights(0) is None


def test_mix_shares_per_step_follow_the_weights():
    n = 2000
    w = make(1, mix={"swe": 1, "search": 0}, mix_end={"search": 1}, steps=5, prompts=n, group_size=1)
    for step in range(5):
        share = np.mean([w.family_of(step, p).name == "search" for p in range(n)])
        p = step / 4
        assert abs(share - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-12, (step, share)  # exact at both ends
    # and the specs carry the family drawn: the forecaster learns per family from them
    last = w.trajectories_for_step(4, first=50)
    assert {s.family for s in last} == {"search"} and max(len(s.turns) for s in last) <= 4


def test_decode_growth_and_the_family_caps_hold_in_a_mix():
    grown = make(2, mix={"math-tir": 1, "search": 1}, steps=3, prompts=40, group_size=2, decode_growth=8.0)
    flat = make(2, mix={"math-tir": 1, "search": 1}, steps=3, prompts=40, group_size=2)
    for g, f in zip(grown.trajectories_for_step(2), flat.trajectories_for_step(2)):
        assert g.family == f.family
        assert g.context_tokens <= get_family(g.family).context_cap
    decode = {k: np.mean([t.decode_tokens for s in w.trajectories_for_step(2) if s.family == "search" for t in s.turns])
              for k, w in (("grown", grown), ("flat", flat))}
    assert decode["grown"] > 4 * decode["flat"]  # search's turns are short: the growth shows in full


# --- releases (start_s) in traces ---------------------------------------------------------------

def _released(tmp_path, starts: list[float | None]) -> Path:
    specs = [TrajectorySpec(f"t{i}", "swe", i, 0, 0, (TurnSpec(10, 5, 0.0, True),), seed=i, start_s=s)
             for i, s in enumerate(starts)]
    write_trace(tmp_path / "r.jsonl", specs)
    return tmp_path / "r.jsonl"


def test_sync_replay_keeps_each_release_relative_to_its_step(tmp_path):
    w = make(0, trace=str(_released(tmp_path, [4.0, None, 1.5, 0.0])), prompts=2, group_size=2, steps=2)
    assert [s.start_s for s in w.trajectories_for_step(0)] == [4.0, None, 1.5, 0.0]
    assert [s.start_s for s in w.trajectories_for_step(1)] == [4.0, None, 1.5, 0.0]


def test_async_replay_runs_in_release_order_and_repeats_a_period_later(tmp_path):
    w = make(0, trace=str(_released(tmp_path, [4.0, None, 1.5, 0.0])), mode="async", trajectories=8)
    specs = [w.trajectory(i) for i in range(8)]
    assert [s.seed for s in specs[:4]] == [1, 3, 2, 0]  # stable: the unreleased one keeps its place
    assert [s.start_s for s in specs] == [None, 0.0, 1.5, 4.0, None, 4.0, 5.5, 8.0]
    plain = make(0, trace=str(SMALL), mode="async", trajectories=8)
    assert [plain.trajectory(i).seed for i in range(4)] == [s.seed for s in plain.trace]  # no releases: trace order
