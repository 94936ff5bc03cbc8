"""No channel to the future, in the simulator: a policy sees only what a real run could see then.

Two traces hold the same trajectories up to one turn, whose decode is longer in the second and
after which the trajectory goes on instead of ending. Run under `prorsa`, with and without a
prior, every snapshot handed to the policy, and every decision (time, targets, reason), is the
same in both runs until the first lifecycle event that differs: the shorter of the two decodes
ending. The changed decodes are in flight on the engines, and the policy decides several times,
before that, so a KV figure that counted a decode's replayed length (a reservation of context +
max_tokens, as the engine's kv_tokens used to report) would show the difference early and fail
the test.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from prorsa.agent.trace import TrajectorySpec, TurnSpec, write_trace
from prorsa.config.pipeline import ExpectConfig, PipelineConfig
from prorsa.control.lifecycle import Phase
from prorsa.control.policy import Decision, Snapshot, make_policy
from prorsa.rollout.context import policy_context, resolve
from prorsa.sim.rehearse import rehearser
from prorsa.sim.run import simulate, simulate_async

CHANGED_TURN = 2  # the turn whose decode, and what follows it, differs between the two traces


def trajectories(n: int = 48, seed: int = 5) -> list[TrajectorySpec]:
    """Trajectories of a tool-using family's shape: a prompt, then 4-6 turns of observations and
    decodes of a few hundred tokens, and tool calls of a second or two."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(4, 7))
        turns = tuple(TurnSpec(int(rng.integers(1500, 3000)) if t == 0 else int(rng.integers(100, 600)),
                               int(rng.integers(150, 450)), 0.0 if t == k - 1 else float(rng.uniform(0.5, 2.0)),
                               t == k - 1) for t in range(k))
        out.append(TrajectorySpec(traj_id=f"t{i}", family="trace", prompt_index=i // 8, group_index=i % 8,
                                  step=0, turns=turns, seed=1000 + i))
    return out


def apart(specs: list[TrajectorySpec]) -> list[TrajectorySpec]:
    """The same trajectories; every third one's CHANGED_TURN decodes three times as long and four
    turns follow it instead of what the first trace has (it ends there, or goes on otherwise)."""
    out = []
    for i, s in enumerate(specs):
        if i % 3:
            out.append(s)
            continue
        head = s.turns[:CHANGED_TURN]
        t = s.turns[CHANGED_TURN]
        changed = TurnSpec(t.appended_tokens, 3 * t.decode_tokens, 1.5, False)
        tail = tuple(TurnSpec(200 + 50 * j, 300, 1.0 if j < 3 else 0.0, j == 3) for j in range(4))
        out.append(replace(s, turns=head + (changed,) + tail))
    return out


def pipeline(trace, prior: bool) -> PipelineConfig:
    d = {
        "name": "nofuture", "seed": 1, "policy": "prorsa",
        "engines": {"backend": "emulated", "count": 4, "slots": 64, "model": "qwen3-30b-a3b", "ep": 4},
        "workload": {"trace": str(trace), "mode": "sync", "prompts": 6, "group_size": 8},
        "runtime": {"control_interval_s": 0.25},
    }
    if prior:
        d["prior"] = ExpectConfig(prompt_tokens=2200, observation_tokens=350, decode_tokens=300, tool_s=1.2,
                                  turns=5).model_dump()
    return PipelineConfig.model_validate(d)


class Recording:
    """Wraps a policy; keeps every snapshot it was shown and what it decided."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.seen: list[tuple[Snapshot, Decision]] = []

    def initial_roles(self, n):
        return self.inner.initial_roles(n)

    def between_steps(self, *args, **kwargs):
        return self.inner.between_steps(*args, **kwargs)

    def decide(self, snap: Snapshot) -> Decision:
        decision = self.inner.decide(snap)
        self.seen.append((snap, decision))
        return decision


def run(trace, prior: bool) -> Recording:
    cfg = pipeline(trace, prior)
    # as the simulator makes it, with the rehearsal of observed trajectories it lends a policy
    context = replace(policy_context(cfg), rehearse=rehearser(resolve(cfg), simulate_async))
    policy = Recording(make_policy("prorsa", context))
    sim = simulate(resolve(cfg), policy)
    assert sim.summary["trajectories_completed"] == 48
    return policy


def first_apart(a: Recording, b: Recording) -> int:
    """Index of the first decision whose snapshot's lifecycle events differ."""
    for i, ((sa, _), (sb, _)) in enumerate(zip(a.seen, b.seen)):
        if sa.events != sb.events:
            return i
    raise AssertionError("the two runs never told the policy anything different")


@pytest.mark.parametrize("prior", [False, True], ids=["no-prior", "prior"])
def test_the_policy_sees_and_decides_alike_until_a_difference_is_observed(tmp_path, prior):
    specs = trajectories()
    # one path for both traces, the second written once the first has run: the no-prior opening
    # rehearses the plausible families' fixed draws, keyed by the pipeline (the trace's path) and
    # those draws, so the second run finds them in the rehearsal cache (~9 s each). What either run
    # reads of its own trace (its opening prompts, its trajectories) is read afresh, and an opening
    # that replayed the trace's trajectories would be keyed by them and miss.
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, specs)
    a = run(trace, prior)
    write_trace(trace, apart(specs))
    b = run(trace, prior)
    cut = first_apart(a, b)
    # what told them apart is a changed turn's decode coming back (its tokens, or the end after it)
    sa, sb = a.seen[cut][0], b.seen[cut][0]
    changed = {f"s0-p{i // 8}-g{i % 8}" for i in range(len(specs)) if i % 3 == 0}  # the slots they replay in
    diff = set(sa.events) ^ set(sb.events)
    assert diff and all(e.traj_id in changed and e.turn >= CHANGED_TURN and e.phase in (Phase.TOOL, Phase.DONE)
                        for e in diff)
    # the changed decodes were on the engines for several decisions before that
    began = min(i for i, (s, _) in enumerate(a.seen) for e in s.events
                if e.traj_id in changed and e.turn == CHANGED_TURN and e.phase is Phase.DECODE)
    assert cut - began >= 3
    for i in range(cut):
        (sa, da), (sb, db) = a.seen[i], b.seen[i]
        assert sa.time_s == sb.time_s
        assert sa.engines == sb.engines, f"decision {i} at {sa.time_s:.2f}s: the engines' loads differ"
        assert sa == sb
        assert (da.targets, da.reason) == (db.targets, db.reason)
    # and the engines held KV that grew as the changed decodes went on, as it was written
    assert any(e.kv_tokens > 0 for s, _ in a.seen[began:cut] for e in s.engines)
