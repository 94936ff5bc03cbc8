"""A turn's engine legs as requests, and the TurnResult they add up to; shared by both bodies.

    PREFILL_LEGS, DECODE_LEGS    the leg phases (task annotations) that need each role
    legs_to_drain(new_role)      the leg phases an engine gives up when it switches to new_role
    leg_requests(turn, route, priority)   -> (PrefillRequest or None, DecodeRequest) for the routed
                                engines, both admitted at `priority` (control/tail.py; 0: first come)
    warm_request(turn, decoded, generated, priority)   -> the PrefillRequest that warms another
                                engine with the context after the turn's decode (scheduling.migrate)
    turn_result(turn, pre, dec, start_s, end_s, tool_s)   -> the TurnResult the agent loop gets

No transport here: the Dask runtime wraps the requests in tasks, the simulator awaits the engines.
"""

from __future__ import annotations

from prorsa.agent.loop import TurnRequest, TurnResult
from prorsa.engine.base import DecodeRequest, DecodeResult, PrefillRequest, PrefillResult
from prorsa.roles import Role
from prorsa.rollout.router import Route

PREFILL_LEGS = ("prefill",)
DECODE_LEGS = ("decode", "generate", "local")  # every leg that generates: its engine serves decode
FIRST_LEGS = ("prefill", "generate", "local")  # the leg that starts a turn
WARM_LEGS = ("warm",)  # a migration's warm-up: no role needs it drained, a relayout does


def legs_to_drain(new: Role) -> tuple[str, ...]:
    return (() if new.serves_prefill else PREFILL_LEGS) + (() if new.serves_decode else DECODE_LEGS)


def leg_requests(turn: TurnRequest, route: Route, priority: float = 0.0) -> tuple[PrefillRequest | None, DecodeRequest]:
    pre = None
    if route.prefill is not None:
        pre = PrefillRequest(turn.traj_id, turn.turn, turn.context_tokens, turn.appended_tokens, turn.token_ids,
                             priority=priority)
    dec = DecodeRequest(
        traj_id=turn.traj_id,
        turn=turn.turn,
        context_tokens=turn.context_tokens,
        max_tokens=turn.decode_tokens,
        token_ids=turn.token_ids,
        new_tokens=0 if pre else turn.appended_tokens,
        seed=turn.seed,
        ignore_eos=not (turn.live or turn.to_eos),  # replay wants exact lengths; a live model ends its own turn
        priority=priority,
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
        start_s=start_s,
        end_s=end_s,
        queue_s=(pre.queue_s if pre else 0.0) + dec.queue_s,
        prefill_s=pre.compute_s if pre else dec.prefill_s,
        transfer_s=dec.transfer_s,
        decode_s=dec.decode_s,
        tool_s=tool_s,
    )
