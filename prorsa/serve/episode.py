"""Served conversations as trajectories: each request a turn, the gap between requests its tool time.

    ServedEpisode(conv, hub, transcript, ...).drive(spec, runner, now, on_turn) -> TrajectoryResult
                                 a DrivingEpisode (agent/loop.py): takes the conversation's requests
                                 one by one and plays each as a turn on the runner's engines
    Served(family, seed, max_context, max_tokens, sampling)   what every conversation is held to
    ServeDriver(hub, tokenizer, served, ...)   a driver for roll_out (rollout/assemble.py): one trajectory
                                 per conversation, from the first request to the hub's close or the
                                 conversation's idle end; awaited like run_sync, until the hub closes

A turn, as the trajectory keeps it:

    context = prompt | reply_0 | added_1 | reply_1 | added_2 | ...
    turn k  = append added_k (turn 0: the prompt) -> prefill -> decode reply_k to EOS or max_tokens

added_k is the text request k adds after reply_{k-1} (serve/transcript.py); it is stored as turn
k-1's observation, with the seconds between the end of turn k-1 and request k as its tool time:
what an agent's tools (and the agent) took is what the lifecycle forecaster learns as tool latency.
The trajectory ends `completed` with no reward (an outside trainer scores it).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from collections.abc import Awaitable
from typing import Any, Callable

from prorsa.agent.loop import (TrajectoryResult, TrajectoryStatus, TurnListener, TurnRequest, TurnResult, TurnRunner,
                               play_turn)
from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.rollout.drivers import Hooks
from prorsa.sampling import Sampling
from prorsa.serve.conversations import Answer, Closed, Conversation, Hub, Pending
from prorsa.serve.transcript import Ask, BadAsk, Transcript


class ContextFull(ValueError):
    """The request leaves no room to generate in the model's context."""


@dataclass
class ServedEpisode:
    conv: Conversation
    hub: Hub
    transcript: Transcript
    bounds: Served
    result: TrajectoryResult | None = None  # as far as it has run
    pending: Pending | None = None  # the request being answered

    async def drive(self, spec: TrajectorySpec, runner: TurnRunner, now: Callable[[], float],
                    on_turn: TurnListener | None) -> TrajectoryResult:
        result = self.result = TrajectoryResult(spec=spec, start_s=now(), task_id=self.conv.session)
        ids: list[int] = []
        context = 0
        while (pending := await self._next()) is not None:
            k = len(result.turns)
            try:
                added, added_ids = await _off_loop(self._read, pending.ask, k == 0)
            except BadAsk as e:  # refused; the conversation goes on as it was
                self.hub.answered(pending, e)
                continue
            if added is None:
                self.hub.end(self.conv, pending)  # the session began another conversation
                break
            room = self.bounds.max_context - context - len(added_ids)
            if room < 1:
                self.hub.answered(pending, ContextFull(
                    f"the conversation holds {context + len(added_ids)} tokens; the model's context is "
                    f"{self.bounds.max_context}"))
                break
            if k == 0:
                result.prompt_ids = tuple(added_ids)
            else:  # what the client did since the last reply: its observation and tool time
                last = result.turns[-1]
                result.turns[-1] = replace(last, observation=added, observation_ids=tuple(added_ids),
                                           observation_tokens=len(added_ids),
                                           tool_s=max(0.0, pending.arrived_s - last.end_s))
            ids += added_ids
            context += len(added_ids)
            req = TurnRequest(spec.traj_id, k, spec.family, len(added_ids), context,
                              min(pending.ask.max_tokens or self.bounds.max_tokens, room), 0.0, False, spec.seed + k,
                              tuple(ids) if runner.needs_token_ids else None, to_eos=not pending.ask.ignore_eos,
                              group=spec.traj_id, sampling=replace(self.bounds.sampling, **dict(pending.ask.sampling)))
            res = await play_turn(runner, req, result, on_turn)
            if res is None:
                self.hub.answered(pending, RuntimeError(result.error))
                return self._ended(result, now)
            ids += res.token_ids
            context += res.decode_tokens
            self.hub.answered(pending, self._answer(spec, res, context - res.decode_tokens))
        if result.status == TrajectoryStatus.RUNNING:
            result.status = TrajectoryStatus.COMPLETED
        if self.conv.reward is not None:
            result.reward = self.conv.reward
        return self._ended(result, now)

    async def _next(self) -> Pending | None:
        self.pending = await self.conv.next()
        return self.pending

    def cut_off(self, now: Callable[[], float]) -> TrajectoryResult:
        """The server stopped mid-way (ServeDriver.CUT_OFF_S): the request in flight is refused,
        the turns that ran are the trajectory."""
        if self.pending is not None:
            self.hub.answered(self.pending, Closed("the server stopped before this turn finished"))
        if self.result.status == "running":
            self.result.status = "completed"
        return self._ended(self.result, now)

    def _read(self, ask: Ask, first: bool) -> tuple[str | None, list[int]]:
        """The text a request adds (templated) and its ids; (None, []) when it starts another conversation."""
        added = self.transcript.open(ask) if first else self.transcript.follow(ask)
        return (added, self.transcript.encode(added)) if added is not None else (None, [])

    def _answer(self, spec: TrajectorySpec, res: TurnResult, prompt_tokens: int) -> Answer:
        text, ended = self.transcript.reply_text(res.token_ids)
        self.transcript.replied(text, ended)
        return Answer(spec.traj_id, res.turn, text, ended, res.token_ids, res.decode_tokens, res.logprobs, prompt_tokens,
                      res.prefill_engine, res.decode_engine)

    @staticmethod
    def _ended(result: TrajectoryResult, now: Callable[[], float]) -> TrajectoryResult:
        result.end_s = now()
        return result


def served_spec(index: int, family: str, seed: int) -> TrajectorySpec:
    """A conversation's trajectory: its turns are whatever the client asks, so the spec's single
    turn is a placeholder the driving episode never reads."""
    return TrajectorySpec(f"c{index}", family, prompt_index=index, group_index=0, step=0,
                          turns=(TurnSpec(0, 0, 0.0, True),), seed=(seed + index) % 2**32)


# Templating and tokenizing a request take seconds for a long one: they run off the event loop, so
# other conversations and the progress go on; in one thread, as a tokenizer is not made to be
# called from several at once
_TOKENIZING = ThreadPoolExecutor(1, thread_name_prefix="prorsa-tokenize")


async def _off_loop(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZING, fn, *args)


@dataclass(frozen=True)
class Served:
    """What every served conversation is held to, from the pipeline."""

    family: str  # the trajectories' family label
    seed: int
    max_context: int  # the engines' context length
    max_tokens: int  # the most a reply may generate when a request sets no max_tokens
    sampling: Sampling = Sampling()  # the pipeline's; a request's own fields replace its


class ServeDriver:
    """Called by roll_out like run_async; the workload and its options are the pipeline's, unused:
    the clients decide which trajectories run. Each result goes to on_done as it ends and is not
    kept here (a server may run for days): the list returned is empty."""

    # under the WIND_DOWN_S a stop grants the rollout (live/interrupt.py), so that a served run
    # ends by itself, and writes out every conversation
    CUT_OFF_S = 3.0

    def __init__(self, hub: Hub, tokenizer: Any, bounds: Served,
                 on_ready: Callable[[], Awaitable[None]] | None = None,
                 on_end: Callable[[], Awaitable[None]] | None = None) -> None:
        self.hub, self.tokenizer, self.bounds = hub, tokenizer, bounds
        self.on_ready = on_ready  # awaited once the engines are up: start listening
        self.on_end = on_end  # awaited once every conversation has ended: stop listening

    async def __call__(self, workload, cfg, runner: TurnRunner, now: Callable[[], float],
                       hooks: Hooks) -> list[TrajectoryResult]:
        on_done, on_turn = hooks.on_done, hooks.on_turn
        self.hub.clock = now  # requests' arrival times on the turns' clock: the gaps are tool times
        if self.on_ready is not None:
            await self.on_ready()
        running: set[asyncio.Task] = set()
        try:
            while (conv := await self.hub.arrival()) is not None:
                running.add(asyncio.create_task(self._one(conv, runner, now, on_done, on_turn)))
                running = {t for t in running if not t.done()}
            # the hub closed (a stop): turns in flight get CUT_OFF_S, then end where they are
            if running:
                await asyncio.wait(running, timeout=self.CUT_OFF_S)
            for t in running:
                t.cancel()
            await asyncio.gather(*running)
        finally:
            for t in running:
                t.cancel()
            if self.on_end is not None:
                await self.on_end()
        return []

    async def _one(self, conv: Conversation, runner, now, on_done, on_turn) -> None:
        episode = ServedEpisode(conv, self.hub, Transcript(self.tokenizer), self.bounds)
        try:
            result = await episode.drive(served_spec(conv.index, self.bounds.family, self.bounds.seed), runner, now,
                                         on_turn)
        except asyncio.CancelledError:  # cut off by a stop: the turns that ran are saved
            if episode.result is None:
                raise
            result = episode.cut_off(now)
        finally:
            self.hub.end(conv)  # no request of its session is left waiting on it
        if result.turns:  # a conversation closed before its first turn ran is no trajectory
            on_done(result)

