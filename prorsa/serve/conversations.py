"""Sessions to conversations: which trajectory a request belongs to, and the queue between them.

    Hub(idle_s[, clock])                   every open conversation, keyed by session id
    await Hub.ask(session, ask) -> [Answer]   the endpoint's side: queue a request on its session's
                                           conversation (a new one when the session has none) and
                                           wait for the model's turn (ask.n replies); raises Closed
                                           when stopping; cancelled (a timeout), the conversation
                                           ends after that turn, as its client never saw the reply
    await Hub.arrival() -> Conversation | None   the driver's side: the next new conversation; None
                                           once the hub is closed
    Hub.close()                            stop: open conversations end after their turn in flight,
                                           requests still queued are refused
    await Conversation.next() -> Pending | None  the episode's side: the conversation's next request;
                                           None when it ended (closed, or idle past idle_s)
    Hub.finish(session, reward) -> Conversation | None   the client says its conversation is over
                                           (after the requests it queued), with the trajectory's
                                           reward; None when the session has none open
    Hub.end(conversation[, pending])       the conversation's trajectory is over (it failed, it
                                           filled the context, or `pending` does not continue it):
                                           requests its session sent meanwhile start a new one

A session is the `X-Session-Id` header, else the request's `user` field, else a fresh id the
response returns in its `X-Session-Id` header. Requests of one session are taken one after the
other. Plain asyncio: no dask, no HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prorsa.serve.transcript import Ask

SESSION_HEADER = "X-Session-Id"


class Closed(Exception):
    """The server is stopping: no new turns."""


@dataclass(frozen=True)
class Answer:
    """The model's turn for one request (one of its n choices)."""

    traj_id: str  # the branch's trajectory
    turn: int
    text: str  # the reply as the client gets it (special tokens kept)
    ended: bool  # the model ended it with its EOS (else it ran out of tokens)
    token_ids: tuple[int, ...]  # empty from an engine that works from counts (emulated)
    completion_tokens: int
    logprobs: tuple[float, ...]
    prompt_tokens: int  # the context the reply was generated from
    prefill_engine: str
    decode_engine: str
    prompt_ids: tuple[int, ...] = ()  # that context's ids
    weight_version: int = 0  # the policy version of the engines that wrote it
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per token: (id, logprob), when asked


@dataclass
class Pending:
    ask: Ask
    arrived_s: float  # the hub's clock
    answer: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class Conversation:
    session: str
    index: int  # the order conversations opened in: the trajectory's id
    idle_s: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    ended: bool = False
    finished: bool = False  # the client ended it (Hub.finish): no later request continues it
    reward: float | None = None  # what the client scored it, when it ended it
    metadata: dict[str, Any] | None = None  # and what else it attached then

    async def next(self) -> Pending | None:
        try:
            item = await asyncio.wait_for(self.queue.get(), self.idle_s)
        except asyncio.TimeoutError:  # the client went away: the trajectory ends here
            item = None
        if item is None:
            self.ended = True
        return item


def session_of(header: str | None, user: str | None, fresh: Callable[[], str]) -> str:
    return header or user or fresh()


class Hub:
    def __init__(self, idle_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self.clock = clock
        self.closed = False
        self._open: dict[str, Conversation] = {}
        self._arrivals: asyncio.Queue = asyncio.Queue()
        self._count = itertools.count()
        self._sessions = itertools.count()

    def fresh_session(self) -> str:
        return f"session-{next(self._sessions)}"

    async def ask(self, session: str, ask: Ask) -> list[Answer]:
        if self.closed:
            raise Closed("the server is stopping")
        pending = Pending(ask, self.clock())
        conv = self._open.get(session)
        if conv is None or conv.ended or conv.finished:  # ended: idle past idle_s, not yet told to the hub
            conv = self._start(session)
        conv.queue.put_nowait(pending)
        return await pending.answer

    def _start(self, session: str) -> Conversation:
        conv = Conversation(session, next(self._count), self.idle_s)
        self._open[session] = conv
        self._arrivals.put_nowait(conv)
        return conv

    def finish(self, session: str, reward: float | None = None,
               metadata: dict[str, Any] | None = None) -> Conversation | None:
        conv = self._open.get(session)
        if conv is None or conv.ended or conv.finished:
            return None
        conv.finished, conv.reward, conv.metadata = True, reward, metadata
        conv.queue.put_nowait(None)  # after what the session queued: those turns are still its own
        return conv

    def end(self, conv: Conversation, pending: Pending | None = None) -> None:
        """`conv`'s trajectory is over; `pending` (a request that did not continue it) and whatever
        its session queued meanwhile go to a new conversation of the session."""
        conv.ended = True
        if self._open.get(conv.session) is conv:  # a long-lived server keeps only the open ones
            del self._open[conv.session]
        left = [] if pending is None else [pending]
        while not conv.queue.empty():
            if (item := conv.queue.get_nowait()) is not None:
                left.append(item)
        if not left:
            return
        if self.closed:
            for item in left:
                self.answered(item, Closed("the server is stopping"))
            return
        fresh = self._start(conv.session)
        for item in left:
            fresh.queue.put_nowait(item)

    async def arrival(self) -> Conversation | None:
        return await self._arrivals.get()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for conv in self._open.values():
            while not conv.queue.empty():  # queued, never started: refused
                item = conv.queue.get_nowait()
                if item is not None and not item.answer.done():
                    item.answer.set_exception(Closed("the server is stopping"))
            conv.queue.put_nowait(None)
        self._arrivals.put_nowait(None)

    def answered(self, pending: Pending, answer: list[Answer] | BaseException) -> None:
        if pending.answer.done():
            return
        if isinstance(answer, BaseException):
            pending.answer.set_exception(answer)
        else:
            pending.answer.set_result(answer)
