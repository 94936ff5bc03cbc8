"""A turn's engine legs as requests, and the TurnResult they add up to; shared by both bodies.

    PREFILL_LEGS, DECODE_LEGS    the leg phases (task annotations) that need each role
    legs_to_drain(new_role)      the leg phases an engine gives up when it switches to new_role
    leg_requests(turn, route, priority, budget)   -> (PrefillRequest or None, DecodeRequest) for the
                                routed engines, both admitted at `priority` (control/tail.py; 0:
                                first come); `budget`: the run's context budget, which caps replies
    response_cap(turn, budget)  the max_tokens a real run sets on the turn's decode
    warm_request(turn, decoded, generated, priority)   -> the PrefillRequest that warms another
                                engine with the context after the turn's decode (scheduling.migrate)
    turn_result(turn, pre, dec, start_s, end_s, tool_s)   -> the TurnResult the agent loop gets

No transport here: the Dask runtime wraps the requests in tasks, the simulator awaits the engines.

A decode request carries the cap a real run would set (`max_tokens`) and, apart from it, where a
replayed turn ends (`replay_tokens`, the workload's drawn length: the stand-in for the model's
EOS), which only the engine reads. A real run cannot know a turn's length before its decode
returns, so nothing that plans, routes or estimates KV may read it.
"""

from __future__ import annotations

from prorsa.agent.loop import TurnRequest, TurnResult
from prorsa.engine.base import DecodeRequest, DecodeResult, PrefillRequest, PrefillResult
from prorsa.roles import Role
from prorsa.rollout.router import Route
from prorsa.sampling import Sampling

PREFILL_LEGS = ("prefill",)
DECODE_LEGS = ("decode", "generate", "local")  # every leg that generates: its engine serves decode
FIRST_LEGS = ("prefill", "generate", "local")  # the leg that starts a turn
WARM_LEGS = ("warm",)  # a migration's warm-up: no role needs it drained, a relayout does


def legs_to_drain(new: Role) -> tuple[str, ...]:
    return (() if new.serves_prefill else PREFILL_LEGS) + (() if new.serves_decode else DECODE_LEGS)


def response_cap(turn: TurnRequest, budget: int | None) -> int | None:
    """A live or served turn's decode_tokens is its cap already (the environment's
    max_response_tokens, or the request's max_tokens, within the context left). A replayed turn's
    is the context budget it has left (workload.py context_budget: the task family's context cap
    in the run's scaled tokens, or max_context where tighter), which every replayed decode fits
    in; the pipeline declares no per-turn response limit of its own. None where the run declares
    no budget (a trace with no max_context): the engine's context limit caps it, as vLLM's does
    when a request sets no max_tokens."""
    if not replaying(turn):
        return turn.decode_tokens
    return None if budget is None else max(budget - turn.context_tokens, 1)


def replaying(turn: TurnRequest) -> bool:
    """Whether the turn's decode length is the workload's to say (a replay, or a served request
    that asks exactly its max_tokens) rather than the model's EOS."""
    return not (turn.live or turn.to_eos)


def leg_requests(turn: TurnRequest, route: Route, priority: float = 0.0,
                 budget: int | None = None) -> tuple[PrefillRequest | None, DecodeRequest]:
    pre = None
    if route.prefill is not None:
        pre = PrefillRequest(turn.traj_id, turn.turn, turn.context_tokens, turn.appended_tokens, turn.token_ids,
                             priority=priority)
    dec = DecodeRequest(
        traj_id=turn.traj_id,
        turn=turn.turn,
        context_tokens=turn.context_tokens,
        max_tokens=response_cap(turn, budget),
        token_ids=turn.token_ids,
        new_tokens=0 if pre else turn.appended_tokens,
        seed=turn.seed,
        sampling=turn.sampling or Sampling(),
        ignore_eos=replaying(turn),  # a live model ends its own turn
        priority=priority,
        replay_tokens=turn.decode_tokens if replaying(turn) else None,
    )
    return pre, dec


def warm_request(turn: TurnRequest, decoded: int, generated: tuple[int, ...] = (),
                 priority: float = 0.0) -> PrefillRequest:
    """The context as the next turn will find it, less that turn's append; a prefill of it all
    (new_tokens 0: nothing of it is new, whatever the engine has cached)."""
    ids = None if turn.token_ids is None else turn.token_ids + tuple(generated)
    return PrefillRequest(turn.traj_id, turn.turn, turn.context_tokens + decoded, 0, ids, priority=priority)


def turn_result(turn: TurnRequest, pre: PrefillResult | None, dec: DecodeResult,
                start_s: float, end_s: float, tool_s: float) -> TurnResult:
    cached = pre.cached_tokens if pre else dec.cached_tokens
    return TurnResult(
        traj_id=turn.traj_id,
        turn=turn.turn,
        prefill_engine=pre.engine_id if pre else "",
        decode_engine=dec.engine_id,
        prefill_tokens=turn.appended_tokens,
        cached_tokens=cached,
        decode_tokens=dec.n_tokens,
        recomputed_tokens=max(0, turn.context_tokens - turn.appended_tokens - cached),
        token_ids=dec.token_ids,
        logprobs=dec.logprobs,
        top_logprobs=dec.top_logprobs,
        sampling=turn.sampling or Sampling(),
        start_s=start_s,
        end_s=end_s,
        queue_s=(pre.queue_s if pre else 0.0) + dec.queue_s,
        prefill_s=pre.compute_s if pre else dec.prefill_s,
        transfer_s=dec.transfer_s,
        decode_s=dec.decode_s,
        tool_s=tool_s,
    )
