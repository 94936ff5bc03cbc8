"""The live body: a TurnRunner that carries every turn out as keyed Dask tasks.

    DaskTurnRunner(client, router, addresses, shape, needs_token_ids, vocab_size, started_wall, options)
    turn_options(run[, restart_wait_s]) -> TurnOptions   a run's retries, scheduler, budget and sampling
    DaskTurnRunner.run_turn(turn)   route the turn, submit its task group, await the result; its
                                    legs carry the scheduler's key (control/tail.py)

Two shapes of the same task group, chosen by `runtime.turn_shape` (benchmarks/control_plane.py
measures both):
  in_task   the driver submits `turn-<traj>-<k>` to a tool worker; that task submits its own
            prefill and decode legs from inside (the design card's shape)
  driver    the driver submits prefill, decode and `turn-<traj>-<k>` (the tool) itself, chained
            by futures, so no worker thread waits on engines; the groups of turns that start
            in the same event-loop tick are sent as one graph
Either way every turn is a keyed task with traj/turn/phase annotations the scheduler plugin reads.

scheduling.migrate (driver shape): the driver also takes the decode leg's result; as the decode
ends it asks the router where the trajectory's next turn should go (Router.relocate) and, for a
move, submits `warm-<traj>-<k>` there while the tool task runs; the turn returns once both have.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace

import dask

from prorsa.agent.loop import TurnRequest, TurnResult
from prorsa.control.tail import TurnScheduler
from prorsa.engine.vllm.errors import EngineUnavailable
from prorsa.live.tasks import dask_priority, leg_graph, tool_graph, turn_annotations, turn_task, warm_submit
from prorsa.rollout.context import RunContext, make_scheduler
from prorsa.rollout.legs import warm_request
from prorsa.rollout.router import Router
from prorsa.sampling import Sampling

log = logging.getLogger(__name__)


class _Batch:
    """Task groups submitted in the same event-loop tick go to the scheduler as one graph: a
    synchronous step starts B x G trajectories at once, and one update-graph of 3N tasks costs
    the scheduler far less than 3N of one task."""

    def __init__(self, client) -> None:
        self.client = client
        self._pending: list[tuple[object, asyncio.Future]] = []

    def submit(self, graph) -> asyncio.Future:
        """-> an asyncio future resolving to the Dask future of `graph` once the batch is sent."""
        waiter = asyncio.get_running_loop().create_future()
        self._pending.append((graph, waiter))
        if len(self._pending) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        return waiter

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        try:
            futures = self.client.compute([g for g, _ in pending], optimize_graph=False)
        except Exception as e:
            for _, waiter in pending:
                if not waiter.done():
                    waiter.set_exception(e)
            return
        for (_, waiter), fut in zip(pending, futures):
            if waiter.cancelled():
                fut.release()
            else:
                waiter.set_result(fut)


RETRY_PAUSE_S = 0.5  # the first pause before a turn is retried; it doubles with each retry
RETRY_PAUSE_MAX_S = 15.0


@dataclass(frozen=True)
class TurnOptions:
    """How the run wants each turn carried out, beyond where it goes."""

    retries: int = 2  # re-runs of a failed turn
    scheduler: TurnScheduler | None = None  # None: every turn alike, first come
    restart_wait_s: float = 0.0  # how long a turn waits out engines that are restarting
    context_budget: int | None = None  # the run's, in tokens: replies are capped at what it leaves
    sampling: Sampling | None = None  # the pipeline's, for a turn that asks none of its own


def turn_options(run: RunContext, restart_wait_s: float = 0.0) -> TurnOptions:
    """A run's: its retries, scheduler, context budget and sampling."""
    return TurnOptions(run.cfg.runtime.turn_retries, make_scheduler(run), restart_wait_s, run.context_budget,
                       run.sampling)


class DaskTurnRunner:
    def __init__(self, client, router: Router, addresses: dict[str, str], shape: str, needs_token_ids: bool,
                 vocab_size: int, started_wall: float, options: TurnOptions = TurnOptions()) -> None:
        self.context_budget = options.context_budget
        self.sampling = options.sampling
        self.scheduler = options.scheduler or TurnScheduler(None)
        self.retries = options.retries
        self.restart_wait_s = options.restart_wait_s
        self.retried = 0  # turns re-run after a failure
        self.migrated = 0  # turns after which the trajectory moved while its tool ran (scheduling.migrate)
        self.client = client
        self.router = router
        self.addresses = addresses
        self.shape = shape
        self.needs_token_ids = needs_token_ids
        self.vocab_size = vocab_size
        self.started = started_wall
        self._batch = _Batch(client)

    async def run_turn(self, turn: TurnRequest) -> TurnResult:
        """A turn whose engine or worker failed is re-run from the trajectory's token history
        on freshly routed engines (the KV is rebuilt by prefill), up to `retries` times. A failure
        because a server is down (EngineUnavailable: its worker is restarting it) is not counted
        for `restart_wait_s` from the first one: the turn pauses, doubling up to RETRY_PAUSE_MAX_S,
        and goes again. Without that, a role whose only engine restarts (a vLLM server takes a
        minute or more on CPU) burnt every retry in seconds and its trajectories failed.
        Every retry pauses, so a fault that lasts a few seconds does not spend them all at once,
        and a leg cancelled on its worker (not by this run) is retried like any other failure."""
        if turn.sampling is None and self.sampling is not None:
            turn = replace(turn, sampling=self.sampling)
        # one key per turn, in the clock its decode seconds are learned in, so a retry keeps its place
        priority = self.scheduler.key(turn, time.time() - self.started)
        attempt, failures, first_down = 0, 0, None
        while True:
            try:
                result = await self._attempt(turn, attempt, priority)
                self.scheduler.ended(turn, result.decode_tokens, result.decode_s)
                return result
            except asyncio.CancelledError as e:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                error: BaseException = e
            except Exception as e:
                error = e
            down = isinstance(error, EngineUnavailable)
            if down and first_down is None:
                first_down = time.monotonic()
            waiting = down and time.monotonic() - first_down < self.restart_wait_s
            if not waiting:
                failures += 1
                if failures > self.retries:
                    if isinstance(error, asyncio.CancelledError):  # the turn failed, not its caller
                        raise RuntimeError("a leg was cancelled on its worker") from error
                    raise error
            log.warning("turn %s-%d failed (%s: %s); retrying", turn.traj_id, turn.turn, type(error).__name__, error)
            self.router.forget(turn.traj_id)
            self.retried += 1
            attempt += 1
            await asyncio.sleep(min(RETRY_PAUSE_S * 2 ** (attempt - 1), RETRY_PAUSE_MAX_S))

    async def _attempt(self, turn: TurnRequest, attempt: int, priority: float) -> TurnResult:
        route = self.router.route(turn.traj_id, appended=turn.appended_tokens if turn.turn else None,
                                   context=turn.context_tokens - turn.appended_tokens,
                                   remaining=self.scheduler.remaining(turn))
        key = f"turn-{turn.traj_id}-{turn.turn}" + (f"-r{attempt}" if attempt else "")
        warm = None
        try:
            if self.shape == "in_task":
                with dask.annotate(phase="tool", tokens=0, done=turn.done, **turn_annotations(turn),
                                   **dask_priority(priority)):
                    fut = self.client.submit(  # positional: submit takes priority= for itself
                        turn_task, turn, route, self.addresses, self.started, attempt, priority, self.context_budget,
                        key=key, resources={"env": 1}, pure=False,
                    )
            else:
                pf, df = leg_graph(turn, route, self.addresses, attempt, priority, self.context_budget)
                tool = self._batch.submit(tool_graph(turn, pf, df, key, time.time(), self.started, priority))
                decode = self._batch.submit(df) if self.scheduler.migrate and not turn.done else None
                fut = await tool  # one graph with `decode`: the same leg, the same key
                if decode is not None:
                    warm = await self._warm(turn, route, await decode, priority)
            result = await fut
            if warm is not None:
                await warm
        finally:
            self.router.finished(route)
        if turn.done:
            self.router.forget(turn.traj_id)
        return result

    async def _warm(self, turn: TurnRequest, route, decode_future, priority: float):
        """As the decode ends (the route still in flight): the warm-up's future, or None to stay."""
        dec = await decode_future
        decode_future.release()
        left = self.scheduler.left_after(turn, dec.n_tokens)
        to = None if left is None else self.router.relocate(turn.traj_id, route, turn.context_tokens + dec.n_tokens, left)
        if to is None:
            return None
        self.migrated += 1
        req = warm_request(turn, dec.n_tokens, dec.token_ids, priority)
        return warm_submit(self.client, req, turn, self.addresses[to], priority)
