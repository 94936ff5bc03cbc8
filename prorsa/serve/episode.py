"""Served conversations as trajectories: each request a turn, the gap between requests its tool time.

    ServedEpisode(conv, hub, transcript, ...).drive(spec, runner, now, on_turn) -> TrajectoryResult
                                 a DrivingEpisode (agent/loop.py): takes the conversation's requests
                                 one by one and plays each as a turn on the runner's engines
    Served(family, seed, max_context, max_tokens, sampling, weight_version)   what every conversation
                                 is held to
    ServeDriver(hub, tokenizer, served, ...)   a driver for roll_out (rollout/assemble.py): one trajectory
                                 per conversation, from the first request to the hub's close or the
                                 conversation's idle end; awaited like run_sync, until the hub closes;
                                 its turns pass the RlControl gate (serve/rl.py) and carry its version

A turn, as the trajectory keeps it:

    context = prompt | reply_0 | added_1 | reply_1 | added_2 | ...
    turn k  = append added_k (turn 0: the prompt) -> prefill -> decode reply_k to EOS or max_tokens

added_k is the text request k adds after reply_{k-1} (serve/transcript.py); it is stored as turn
k-1's observation, with the seconds between the end of turn k-1 and request k as its tool time:
what an agent's tools (and the agent) took is what the lifecycle forecaster learns as tool latency.
The trajectory ends `completed` with no reward (an outside trainer scores it).

A request with n > 1 draws n replies from the same context: the branch it continues forks into n
trajectories (`c4`, `c4-1`, `c4-2`, ...: each the turns so far plus its own reply, one group). The
client's next request goes on with the branch whose reply it echoes (chat) or whose text or ids
its prompt starts with (completions); the branches it left are saved then, as they are.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from collections.abc import Awaitable
from typing import Any, Callable

from prorsa.agent.loop import (TrajectoryResult, TrajectoryStatus, TurnListener, TurnRequest, TurnResult, TurnRunner,
                               play_turn)
from prorsa.agent.trace import TrajectorySpec, TurnSpec
from prorsa.rollout.drivers import Hooks, VersionedRunner
from prorsa.sampling import Sampling
from prorsa.serve.conversations import Answer, Closed, Conversation, Hub, Pending
from prorsa.serve.rl import RlControl
from prorsa.serve.tool_calls import DEFAULT, ReplyParser
from prorsa.serve.transcript import Ask, BadAsk, Transcript


class ContextFull(ValueError):
    """The request leaves no room to generate in the model's context."""


@dataclass
class Branch:
    """One line of a conversation: its trajectory, the text it holds and its ids. A request with
    n > 1 forks the branch it continues into n; the client's next request picks one to go on with."""

    result: TrajectoryResult
    transcript: Transcript
    ids: list[int] = field(default_factory=list)
    context: int = 0

    def fork(self, root: str, number: int) -> Branch:
        """A copy of this branch as trajectory `root`-`number`, the number-th sample of its group."""
        spec = replace(self.result.spec, traj_id=f"{root}-{number}", group_index=number)
        result = replace(self.result, spec=spec, turns=list(self.result.turns))
        return Branch(result, copy.copy(self.transcript), list(self.ids), self.context)


@dataclass(frozen=True)
class _Asked:
    """One request as turn k of every branch it draws on."""

    k: int
    spec: TrajectorySpec  # the conversation's first branch
    ask: Ask
    sampling: Sampling  # the served run's, with the request's own fields
    appended: int  # tokens the request adds to the context
    room: int  # tokens left in the model's context after them
    with_ids: bool  # the engines want the context's token ids


@dataclass
class ServedEpisode:
    conv: Conversation
    hub: Hub
    transcript: Transcript
    bounds: Served
    rl: RlControl
    on_branch: Callable[[TrajectoryResult], None] = lambda result: None  # a branch the client left
    branches: list[Branch] = field(default_factory=list)  # as far as they have run
    pending: Pending | None = None  # the request being answered

    async def drive(self, spec: TrajectorySpec, runner: TurnRunner, now: Callable[[], float],
                    on_turn: TurnListener | None) -> TrajectoryResult:
        """-> the branch the conversation ended on; every other branch went to on_branch when left."""
        branches = self.branches = [Branch(TrajectoryResult(spec=spec, start_s=now(), task_id=self.conv.session),
                                           self.transcript)]
        forks = itertools.count(1)
        while (pending := await self._next()) is not None:
            if pending.answer.done():  # its client stopped waiting before it began
                continue
            try:
                picked = await _off_loop(self._pick, branches, pending.ask)
            except BadAsk as e:  # refused; the conversation goes on as it was
                self.hub.answered(pending, e)
                continue
            if picked is None:
                self.hub.end(self.conv, pending)  # the session began another conversation
                break
            branch, added, added_ids = picked
            self._leave(branches, keep=branch, now=now)
            branches = self.branches = [branch]
            result, k = branch.result, len(branch.result.turns)
            room = self.bounds.max_context - branch.context - len(added_ids)
            if room < 1:
                self.hub.answered(pending, ContextFull(
                    f"the conversation holds {branch.context + len(added_ids)} tokens; the model's context is "
                    f"{self.bounds.max_context}"))
                break
            if k == 0:
                result.prompt_ids = tuple(added_ids)
            else:  # what the client did since the last reply: its observation and tool time
                last = result.turns[-1]
                result.turns[-1] = replace(last, observation=added, observation_ids=tuple(added_ids),
                                           observation_tokens=len(added_ids),
                                           tool_s=max(0.0, pending.arrived_s - last.end_s))
            branch.ids += added_ids
            branch.context += len(added_ids)
            ask = pending.ask
            branches += [branch.fork(spec.traj_id, next(forks)) for _ in range(ask.n - 1)]
            sampling = replace(self.bounds.sampling, **dict(ask.sampling))
            asked = _Asked(k, spec, ask, sampling, len(added_ids), room, runner.needs_token_ids)
            requests = [self._request(b, j, asked) for j, b in enumerate(branches)]
            async with self.rl.turn():  # paused by a trainer: the request waits here, its arrival kept
                played = await asyncio.gather(*(play_turn(runner, req, b.result, on_turn)
                                                for req, b in zip(requests, branches)))
            if any(res is None for res in played):
                self.hub.answered(pending, RuntimeError(next(b.result.error for b, res in zip(branches, played)
                                                             if res is None)))
                break
            answers = [self._answer(b, res) for b, res in zip(branches, played)]
            if pending.answer.done():  # timed out: the client never saw these replies, so nothing continues them
                break
            self.hub.answered(pending, answers)
        return self._close(now)

    async def _next(self) -> Pending | None:
        self.pending = await self.conv.next()
        return self.pending

    def cut_off(self, now: Callable[[], float]) -> TrajectoryResult:
        """The server stopped mid-way (ServeDriver.CUT_OFF_S): the request in flight is refused,
        the turns that ran are the trajectory."""
        if self.pending is not None:
            self.hub.answered(self.pending, Closed("the server stopped before this turn finished"))
        return self._close(now)

    def _close(self, now: Callable[[], float]) -> TrajectoryResult:
        for b in self.branches:
            if b.result.status == TrajectoryStatus.RUNNING:
                b.result.status = TrajectoryStatus.COMPLETED
            if self.conv.reward is not None:  # the client scored the conversation: every line it left open
                b.result.reward = self.conv.reward
            b.result.metadata = self.conv.metadata
        self._leave(self.branches, keep=self.branches[0], now=now)
        return self._ended(self.branches[0].result, now)

    def _request(self, b: Branch, j: int, asked: _Asked) -> TurnRequest:
        """Branch b's turn of the request, its j-th sample."""
        k, spec, ask, sampling = asked.k, asked.spec, asked.ask, asked.sampling
        if j and sampling.seed is not None:  # n seeded samples: n different draws, as vLLM gives
            sampling = replace(sampling, seed=sampling.seed + j)
        return TurnRequest(b.result.spec.traj_id, k, spec.family, asked.appended, b.context,
                           min(ask.max_tokens or self.bounds.max_tokens, asked.room), 0.0, False,
                           spec.seed + k + 7919 * j, tuple(b.ids) if asked.with_ids else None,
                           to_eos=not ask.ignore_eos, group=spec.traj_id, sampling=sampling)

    def _pick(self, branches: list[Branch], ask: Ask) -> tuple[Branch, str, list[int]] | None:
        """The branch the request continues, the text it adds and its ids; None when it continues none."""
        if not branches[0].transcript.opened:
            b = branches[0]
            added = b.transcript.open(ask)
            return b, added, list(ask.prompt_ids) if ask.kind == "ids" else b.transcript.encode(added)
        for b in branches:
            if ask.kind == "ids":
                ids = b.transcript.follow_ids(ask, b.ids)
                if ids is not None:
                    return b, b.transcript.tokenizer.decode(ids, skip_special_tokens=False), ids
                continue
            if ask.chat and len(branches) > 1 and not b.transcript.echoes(ask):
                continue
            added = b.transcript.follow(ask)
            if added is not None:
                return b, added, b.transcript.encode(added)
        return None

    def _leave(self, branches: list[Branch], keep: Branch, now: Callable[[], float]) -> None:
        for b in branches:
            if b is not keep:
                if b.result.status == TrajectoryStatus.RUNNING:
                    b.result.status = TrajectoryStatus.COMPLETED
                self.on_branch(self._ended(b.result, now))

    def _answer(self, b: Branch, res: TurnResult) -> Answer:
        prompt_ids, prompt_tokens = tuple(b.ids), b.context
        b.ids += res.token_ids
        b.context += res.decode_tokens
        text, ended = b.transcript.reply_text(res.token_ids)
        b.transcript.replied(text, ended)
        return Answer(b.result.spec.traj_id, res.turn, text, ended, res.token_ids, res.decode_tokens, res.logprobs,
                      prompt_tokens, res.prefill_engine, res.decode_engine, prompt_ids, res.policy_version,
                      res.top_logprobs)

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
    weight_version: int = 0  # the served model's policy version (its policy.json), when no trainer updates it


class ServeDriver:
    """Called by roll_out like run_async; the workload and its options are the pipeline's, unused:
    the clients decide which trajectories run. Each result goes to on_done as it ends and is not
    kept here (a server may run for days): the list returned is empty."""

    # under the WIND_DOWN_S a stop grants the rollout (live/interrupt.py), so that a served run
    # ends by itself, and writes out every conversation
    CUT_OFF_S = 3.0

    def __init__(self, hub: Hub, tokenizer: Any, bounds: Served,
                 on_ready: Callable[[], Awaitable[None]] | None = None,
                 on_end: Callable[[], Awaitable[None]] | None = None, rl: RlControl | None = None,
                 parser: ReplyParser | None = None) -> None:
        self.hub, self.tokenizer, self.bounds = hub, tokenizer, bounds
        self.parser = parser or ReplyParser(DEFAULT, tokenizer)  # the tool calls of the replies clients echo
        self.rl = rl or RlControl(bounds.weight_version)  # a trainer's pause, resume and weight updates
        self.on_ready = on_ready  # awaited once the engines are up: start listening
        self.on_end = on_end  # awaited once every conversation has ended: stop listening

    async def __call__(self, workload, cfg, runner: TurnRunner, now: Callable[[], float],
                       hooks: Hooks) -> list[TrajectoryResult]:
        on_done, on_turn = hooks.on_done, hooks.on_turn
        # every turn tagged with the weights it ran on: the outside trainer's updates, else the served model's own
        version = hooks.version or (lambda: self.rl.weight_version)
        self.rl.load = hooks.load_weights
        runner = VersionedRunner(runner, version)
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
        def save(result: TrajectoryResult) -> None:
            if result.turns:  # a conversation closed before its first turn ran is no trajectory
                result.policy_version = result.turns[0].policy_version
                on_done(result)

        episode = ServedEpisode(conv, self.hub, Transcript(self.tokenizer, self.parser), self.bounds, self.rl, on_branch=save)
        try:
            result = await episode.drive(served_spec(conv.index, self.bounds.family, self.bounds.seed), runner, now,
                                         on_turn)
        except asyncio.CancelledError:  # cut off by a stop: the turns that ran are saved
            if not episode.branches:
                raise
            result = episode.cut_off(now)
        finally:
            self.hub.end(conv)  # no request of its session is left waiting on it
        save(result)

