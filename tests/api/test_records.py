"""A trajectory as the API hands it back is the context the engines were sent: run the real agent
loop over a runner that works on token ids and compare."""

from __future__ import annotations

import asyncio
import math

from prorsa.agent.loop import TurnRequest, TurnResult, run_trajectory
from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.api.records import trajectory_of

VOCAB = 500


class IdRunner:
    """Generates `decode_tokens` ids per turn with a logprob each, and keeps what it was sent."""

    needs_token_ids = True
    vocab_size = VOCAB

    def __init__(self) -> None:
        self.sent: list[TurnRequest] = []

    async def run_turn(self, req: TurnRequest) -> TurnResult:
        self.sent.append(req)
        ids = tuple(range(100 + 10 * req.turn, 100 + 10 * req.turn + req.decode_tokens))
        return TurnResult(req.traj_id, req.turn, "engine-0", "engine-1", req.appended_tokens, 0, len(ids),
                          token_ids=ids, logprobs=tuple(-0.5 - i for i in range(len(ids))), prefill_s=0.1,
                          decode_s=0.2, tool_s=req.tool_latency_s)


def _spec() -> TrajectorySpec:
    return TrajectorySpec("s0-p1-g0", "swe", 1, 0, 0, (TurnSpec(7, 3, 0.5, False), TurnSpec(4, 2, 0.25, False),
                                                     TurnSpec(5, 2, 0.0, True)), seed=11)


def test_the_sequence_is_the_context_the_engines_were_sent():
    runner = IdRunner()
    result = asyncio.run(run_trajectory(_spec(), runner, lambda: 0.0))
    t = trajectory_of(result, VOCAB)
    last = runner.sent[-1]
    assert t.token_ids == last.token_ids + tuple(range(120, 122))  # the last context, then its decode
    generated = [i for i, m in enumerate(t.loss_mask) if m]
    assert [t.token_ids[i] for i in generated] == [100, 101, 102, 110, 111, 120, 121]
    assert [t.rollout_logprobs[i] for i in generated] == [-0.5, -1.5, -2.5, -0.5, -1.5, -0.5, -1.5]
    assert all(t.rollout_logprobs[i] == 0.0 for i, m in enumerate(t.loss_mask) if not m)
    assert t.loss_mask[:7] == (0,) * 7 and len(t.token_ids) == 7 + 3 + 4 + 2 + 5 + 2


def test_turns_and_outcome_are_carried_over():
    result = asyncio.run(run_trajectory(_spec(), IdRunner(), lambda: 0.0))
    result.policy_version = 3
    t = trajectory_of(result, VOCAB)
    assert (t.status, t.policy_version, t.group, t.traj_id) == ("completed", 3, "s0-p1", "s0-p1-g0")
    assert math.isnan(t.reward) and t.task_id == ""  # no environment: no reward, no task
    assert [(x.index, x.prefill_tokens, x.decode_tokens, x.tool_s) for x in t.turns] == [
        (0, 7, 3, 0.5), (1, 4, 2, 0.25), (2, 5, 2, 0.0)]


def test_engines_without_ids_give_counts_only():
    class Counts(IdRunner):
        needs_token_ids = False

        async def run_turn(self, req):
            return TurnResult(req.traj_id, req.turn, "engine-0", "engine-1", req.appended_tokens, 0,
                              req.decode_tokens)

    t = trajectory_of(asyncio.run(run_trajectory(_spec(), Counts(), lambda: 0.0)), 0)
    assert t.token_ids == t.loss_mask == t.rollout_logprobs == ()
    assert sum(x.decode_tokens for x in t.turns) == 7
