"""The live body: a TurnRunner that carries every turn out as keyed Dask tasks.

    DaskTurnRunner.run_turn(turn)   route the turn, submit its task group, await the result

Two shapes of the same task group, chosen by `runtime.turn_shape` (benchmarks/control_plane.py
measures both):
  in_task   the driver submits `turn-<traj>-<k>` to a tool worker; that task submits its own
            prefill and decode legs from inside (the design card's shape)
  driver    the driver submits prefill, decode and `turn-<traj>-<k>` (the tool) itself, chained
            by futures, so no worker thread waits on engines
Either way every turn is a keyed task with traj/turn/phase annotations the scheduler plugin reads.
"""

from __future__ import annotations

import asyncio
import logging
import time

import dask

from prorsa.agent.loop import TurnRequest, TurnResult
from prorsa.rollout.router import Router
from prorsa.rollout.tasks import submit_legs, tool_task, turn_task

log = logging.getLogger(__name__)


class DaskTurnRunner:
    def __init__(
        self,
        client,
        router: Router,
        addresses: dict[str, str],
        shape: str,
        needs_token_ids: bool,
        vocab_size: int,
        started_wall: float,
        retries: int = 2,
    ) -> None:
        self.retries = retries
        self.retried = 0  # turns re-run after a failure
        self.client = client
        self.router = router
        self.addresses = addresses
        self.shape = shape
        self.needs_token_ids = needs_token_ids
        self.vocab_size = vocab_size
        self.started = started_wall

    async def run_turn(self, turn: TurnRequest) -> TurnResult:
        """A turn whose engine or worker failed is re-run from the trajectory's token history
        on freshly routed engines (the KV is rebuilt by prefill), up to `retries` times."""
        for attempt in range(self.retries + 1):
            try:
                return await self._attempt(turn, attempt)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if attempt == self.retries:
                    raise
                log.warning("turn %s-%d failed (%s: %s); retrying", turn.traj_id, turn.turn, type(e).__name__, e)
                self.router.forget(turn.traj_id)
                self.retried += 1
        raise AssertionError("unreachable")

    async def _attempt(self, turn: TurnRequest, attempt: int) -> TurnResult:
        route = self.router.route(turn.traj_id)
        annot = dict(traj=turn.traj_id, turn=turn.turn, phase="turn", context=turn.context_tokens)
        key = f"turn-{turn.traj_id}-{turn.turn}" + (f"-r{attempt}" if attempt else "")
        try:
            if self.shape == "in_task":
                with dask.annotate(tokens=turn.appended_tokens + turn.decode_tokens, **annot):
                    fut = self.client.submit(
                        turn_task, turn, route, self.addresses, self.started, attempt,
                        key=key, resources={"env": 1}, pure=False,
                    )
            else:
                submitted = time.time()
                pf, df = submit_legs(self.client, turn, route, self.addresses, attempt)
                with dask.annotate(tokens=0, **{**annot, "phase": "tool"}):
                    fut = self.client.submit(
                        tool_task, turn, pf, df, submitted, self.started,
                        key=key, resources={"env": 1}, pure=False,
                    )
            result = await fut
        finally:
            self.router.finished(route)
        if turn.done:
            self.router.forget(turn.traj_id)
        return result
