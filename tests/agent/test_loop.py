"""The trajectory loop against a recording TurnRunner (the loop's own contract, no engines)."""

import asyncio

from prorsa.agent.loop import TurnRequest, TurnResult, run_trajectory, synth_ids
from prorsa.agent.workload import TrajectorySpec, TurnSpec


class Recorder:
    def __init__(self, needs_ids: bool, fail_at: int | None = None):
        self.needs_token_ids = needs_ids
        self.vocab_size = 100
        self.requests: list[TurnRequest] = []
        self.fail_at = fail_at

    async def run_turn(self, req: TurnRequest) -> TurnResult:
        self.requests.append(req)
        if req.turn == self.fail_at:
            raise ConnectionError("engine went away")
        gen = tuple(range(req.decode_tokens)) if self.needs_token_ids else ()
        return TurnResult(req.traj_id, req.turn, "e0", "e1", req.appended_tokens, 0, req.decode_tokens, gen)


def spec(seed=7, prompt=0):
    turns = (TurnSpec(5, 3, 0.1, False), TurnSpec(4, 2, 0.2, False), TurnSpec(6, 1, 0.0, True))
    return TrajectorySpec("t", "swe", prompt, 0, 0, turns, seed)


def test_context_grows_by_appends_and_decodes():
    r = Recorder(needs_ids=False)
    res = asyncio.run(run_trajectory(spec(), r, lambda: 0.0))
    assert res.status == "completed" and len(res.turns) == 3
    assert [q.context_tokens for q in r.requests] == [5, 5 + 3 + 4, 5 + 3 + 4 + 2 + 6]
    assert r.requests[-1].tool_latency_s == 0.0 and r.requests[-1].done
    assert all(q.token_ids is None for q in r.requests)


def test_token_ids_carry_the_whole_context():
    r = Recorder(needs_ids=True)
    res = asyncio.run(run_trajectory(spec(), r, lambda: 0.0))
    last = r.requests[-1]
    assert len(last.token_ids) == last.context_tokens
    # the context holds the previous turns' generated tokens verbatim
    assert last.token_ids[5:8] == (0, 1, 2)
    assert res.prompt_ids == last.token_ids[:5]


def test_group_members_share_the_prompt_not_the_observations():
    a, b = Recorder(True), Recorder(True)
    asyncio.run(run_trajectory(spec(seed=1), a, lambda: 0.0))
    asyncio.run(run_trajectory(spec(seed=2), b, lambda: 0.0))
    assert a.requests[0].token_ids == b.requests[0].token_ids
    assert a.requests[1].token_ids[8:] != b.requests[1].token_ids[8:]


def test_failed_turn_fails_only_the_trajectory():
    r = Recorder(needs_ids=False, fail_at=1)
    res = asyncio.run(run_trajectory(spec(), r, lambda: 0.0))
    assert res.status == "failed" and "turn 1" in res.error and "engine went away" in res.error
    assert len(res.turns) == 1


def test_synth_ids_deterministic_and_in_range():
    a = synth_ids((1, 2, 3), 50, 64)
    assert a == synth_ids((1, 2, 3), 50, 64)
    assert all(16 <= i < 64 for i in a)
