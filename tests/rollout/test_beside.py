"""The loops beside a rollout (rollout/assemble.py beside): every one stopped and its end read, and
the error a rollout ends on is the one told, not a loop's that failed as the run came down."""

from __future__ import annotations

import asyncio
import gc

import pytest

from prorsa.rollout.assemble import Body, beside


class _Loop:
    """A control loop whose run() fails at once: the live one did so as its Dask client closed."""

    async def run(self) -> None:
        raise AttributeError("'NoneType' object has no attribute 'run_function'")


def _body() -> Body:
    async def sample(t: float) -> None:
        return None

    async def background() -> None:
        await asyncio.sleep(3600)

    return Body(runner=None, controller=_Loop(), now=lambda: 0.0, clock_unit=1.0, sample=sample,
                sample_interval_s=0.01, background=[background])


def _unretrieved(coro) -> tuple[BaseException | None, list[dict]]:
    """What `coro` raised, and what asyncio's loop reported as never retrieved while it ran."""
    reported: list[dict] = []
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _, ctx: reported.append(ctx))
    try:
        loop.run_until_complete(coro)
        raised = None
    except BaseException as e:  # noqa: BLE001
        raised = e
    finally:
        loop.close()
    gc.collect()  # a task's unread end is reported when the task is freed
    return raised, reported


def test_a_rollout_ending_on_its_own_error_tells_that_one_and_reads_every_loops_end():
    async def rollout():
        async with beside(_body()):
            await asyncio.sleep(0.05)  # the control loop has failed by now
            raise OSError(28, "No space left on device")

    raised, reported = _unretrieved(rollout())
    assert isinstance(raised, OSError) and raised.errno == 28
    assert not [r for r in reported if "never retrieved" in str(r.get("message", ""))], reported


def test_a_rollout_that_ended_well_is_told_of_a_loop_that_failed():
    async def rollout():
        async with beside(_body()):
            await asyncio.sleep(0.05)

    raised, _ = _unretrieved(rollout())
    assert isinstance(raised, AttributeError)


@pytest.mark.parametrize("stop", [None, lambda: None])
def test_every_loop_is_stopped_as_the_block_ends(stop):
    tasks: list[asyncio.Task] = []

    async def rollout():
        async with beside(_body(), on_stop=stop):
            tasks.extend(t for t in asyncio.all_tasks() if t is not asyncio.current_task())
            raise KeyError("the rollout's own")

    raised, _ = _unretrieved(rollout())
    assert isinstance(raised, KeyError)
    assert tasks and all(t.done() for t in tasks)
