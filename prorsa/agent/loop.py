"""The trajectory loop: one coroutine per trajectory, turn after turn until done.

It speaks to the world through one protocol, `TurnRunner.run_turn`, which the live Dask runtime
and the simulator both implement; the loop itself knows neither.

    run_trajectory(spec, runner, ..., episode=None)   play a TrajectorySpec to its end -> TrajectoryResult
    TrajectoryStatus                    running, then completed | failed (| cancelled | stale)
    play_turn(runner, req, result, on_turn)   one turn, recorded in result; None when it failed
    Episode                             what an environment adds (agent/environment.py): the real
                                        tool call after each decode, the reward at the end
                                        (a DrivingEpisode, live mode, runs its own turns)

Without an episode every turn replays the spec (appended tokens, tool latency). With one, each
turn carries the episode's tool call to the runner, and a runner that ran it reports the
observation's length in `TurnResult.observation_tokens`: the next turn appends that instead of
the spec's figure.

A turn, as the loop sees it:

    context  = prompt | decode_0 | obs_1 | decode_1 | obs_2 | ...
    turn k   = append obs_k (turn 0: the prompt) -> prefill -> decode_k -> tool (unless done)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from prorsa.agent.tools.base import ToolCall
from prorsa.agent.workload import TrajectorySpec
from prorsa.sampling import Sampling


@dataclass(frozen=True)
class TurnRequest:
    traj_id: str
    turn: int
    family: str
    appended_tokens: int  # prefilled this turn on top of the cached context
    context_tokens: int  # context after the append, before decoding
    decode_tokens: int  # tokens to generate
    tool_latency_s: float  # the tool call after the decode (0 when done)
    done: bool
    seed: int
    token_ids: tuple[int, ...] | None = None  # the whole context, for engines that need ids
    tool_call: ToolCall | None = None  # run for real after the decode (environments); else the latency
    live: bool = False  # live mode: decode to the model's EOS; the tool worker parses the call from the text
    group: str = ""  # its GRPO group (step and prompt): members share the task and its difficulty
    to_eos: bool = False  # decode until the model's EOS (a served request, unless it asks ignore_eos)
    sampling: Sampling | None = None  # None: the pipeline's (the runner fills it in)


@dataclass(frozen=True)
class TurnResult:
    traj_id: str
    turn: int
    prefill_engine: str  # "" when the turn had no separate prefill leg (colocated)
    decode_engine: str
    prefill_tokens: int  # tokens appended this turn
    cached_tokens: int  # of the context, served from a prefix cache
    decode_tokens: int
    token_ids: tuple[int, ...] = ()  # generated this turn
    logprobs: tuple[float, ...] = ()
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per token: (id, logprob) alternatives, if asked
    sampling: Sampling | None = None  # how its tokens were drawn (the pipeline's or a request's)
    start_s: float = 0.0  # the body's clock, seconds since the rollout began
    end_s: float = 0.0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    transfer_s: float = 0.0
    decode_s: float = 0.0
    tool_s: float = 0.0
    recomputed_tokens: int = 0  # of the context before this turn's append, prefilled again (cache miss)
    tool_name: str = ""  # the real tool called after the decode; "" when none ran
    tool_status: str = ""  # ok | error | timeout | crash | truncated (agent/tools/base.py)
    observation: str = ""  # what the tool returned, as the model sees it
    observation_tokens: int | None = None  # the next turn's append; None: the spec's figure
    observation_ids: tuple[int, ...] = ()  # live mode: the observation as the chat template writes it
    final: bool = False  # live mode: the model gave its answer
    policy_version: int = 0  # the engines' weights when the turn was sent (the RL loop's updates so far)


class TrajectoryStatus(StrEnum):
    """How a trajectory ended. A str, so saved files (trajectories.parquet, summary.json) and
    comparisons with the plain words keep working: TrajectoryStatus.COMPLETED == "completed"."""

    RUNNING = "running"  # not ended yet
    COMPLETED = "completed"  # played to its final turn
    FAILED = "failed"  # a turn failed (engine, tool, context); `error` says why
    CANCELLED = "cancelled"  # partial rollouts: cut when its step ended, untrained
    STALE = "stale"  # partial rollouts: dropped, started more than max_staleness versions back


@dataclass
class TrajectoryResult:
    spec: TrajectorySpec
    turns: list[TurnResult] = field(default_factory=list)
    status: TrajectoryStatus = TrajectoryStatus.RUNNING
    error: str = ""
    reward: float = float("nan")  # replay has no reward; environments set one
    reward_error: str = ""  # why the reward function failed (reward NaN)
    task_id: str = ""  # the environment's task this trajectory worked on
    start_s: float = 0.0
    end_s: float = 0.0
    prompt_ids: tuple[int, ...] = ()
    policy_version: int = 0  # the engines' weights when it started (RL loop: updates pushed so far)
    # partial rollouts (rollout/partial.py): the step whose batch trained it; None: not trained
    # there (cancelled, stale), or a run without partial rollouts (its own step's batch)
    trained_step: int | None = None
    metadata: dict[str, Any] | None = None  # what a served conversation's client attached as it ended it


class TurnRunner(Protocol):
    needs_token_ids: bool
    vocab_size: int

    async def run_turn(self, req: TurnRequest) -> TurnResult: ...


def synth_ids(key: tuple[int, ...], n: int, vocab_size: int) -> list[int]:
    """Replay has token counts, real engines need ids: draw them from a key (prompt: step and
    prompt index; observations: the trajectory's seed and turn), so a replayed workload sends
    identical requests on every run. Ids below 16 are left out
    because tokenizers keep their special tokens there."""
    rng = np.random.default_rng([*key, 0x5EED])
    return rng.integers(16, vocab_size, size=n).tolist()


TurnListener = Callable[[TrajectorySpec, TurnResult], None]


async def play_turn(runner: TurnRunner, req: TurnRequest, result: TrajectoryResult,
                    on_turn: TurnListener | None) -> TurnResult | None:
    """Run one turn and record it; None when it failed, which fails its trajectory (never the rollout)."""
    try:
        res = await runner.run_turn(req)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        result.status, result.error = TrajectoryStatus.FAILED, f"turn {req.turn}: {type(e).__name__}: {e}"
        return None
    result.turns.append(res)
    if on_turn is not None:
        on_turn(result.spec, res)
    return res


class Episode(Protocol):
    def tool_call(self, turn: int) -> ToolCall | None: ...

    async def finish(self, result: TrajectoryResult) -> None: ...


@runtime_checkable
class DrivingEpisode(Protocol):
    """An episode that runs its own turns (live mode: the model's text decides them,
    agent/live_episode.py); the loop hands it the whole trajectory."""

    async def drive(self, spec: TrajectorySpec, runner: TurnRunner, now: Callable[[], float],
                    on_turn: TurnListener | None) -> TrajectoryResult: ...


async def run_trajectory(
    spec: TrajectorySpec,
    runner: TurnRunner,
    now: Callable[[], float],
    on_turn: TurnListener | None = None,
    episode: Episode | None = None,
) -> TrajectoryResult:
    if isinstance(episode, DrivingEpisode):
        return await episode.drive(spec, runner, now, on_turn)
    result = TrajectoryResult(spec=spec, start_s=now())
    ids: list[int] | None = [] if runner.needs_token_ids else None
    context = 0
    observed: int | None = None  # the last tool's observation tokens, when a real tool ran
    for k, turn in enumerate(spec.turns):
        appended = turn.appended_tokens if k == 0 or observed is None else observed
        context += appended
        if ids is not None:
            if k == 0:  # one prompt per GRPO group: members share it, and its cached prefix
                ids += synth_ids((0, spec.step, spec.prompt_index), appended, runner.vocab_size)
                result.prompt_ids = tuple(ids)
            else:
                ids += synth_ids((1, spec.seed, k), appended, runner.vocab_size)
        req = TurnRequest(
            traj_id=spec.traj_id,
            turn=k,
            family=spec.family,
            appended_tokens=appended,
            context_tokens=context,
            decode_tokens=turn.decode_tokens,
            tool_latency_s=0.0 if turn.done else turn.tool_latency_s,
            done=turn.done,
            seed=spec.seed + k,
            token_ids=tuple(ids) if ids is not None else None,
            tool_call=None if turn.done or episode is None else episode.tool_call(k),
            group=f"{spec.step}-{spec.prompt_index}",
        )
        res = await play_turn(runner, req, result, on_turn)
        if res is None:
            break
        observed = res.observation_tokens
        context += res.decode_tokens
        if ids is not None:
            ids += res.token_ids
        if turn.done:
            result.status = TrajectoryStatus.COMPLETED
            break
    if result.status == TrajectoryStatus.RUNNING:
        result.status, result.error = TrajectoryStatus.FAILED, "trajectory spec ended without a final turn"
    if episode is not None and result.status == TrajectoryStatus.COMPLETED:
        await episode.finish(result)
    result.end_s = now()
    return result
