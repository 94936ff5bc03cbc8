"""How a turn is retried: engines that are down (a server restarting) are waited out for a while
without spending the turn's retries; any other failure spends one."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from prorsa.agent.loop import TurnRequest, TurnResult
from prorsa.engine.vllm.errors import EngineError, EngineUnavailable
from prorsa.live import runtime
from prorsa.live.runtime import DaskTurnRunner, TurnOptions

TURN = TurnRequest("t0", 0, "swe", 10, 10, 4, 0.0, True, 0)
DONE = TurnResult("t0", 0, "", "engine-0", 10, 0, 4)


class _Router:
    def __init__(self) -> None:
        self.forgotten = 0

    def forget(self, traj_id: str) -> None:
        self.forgotten += 1


def _runner(failures: list[Exception], retries: int, restart_wait_s: float) -> tuple[DaskTurnRunner, list[int]]:
    runner = DaskTurnRunner(None, _Router(), {}, "driver", False, 0, 0.0,
                            TurnOptions(retries, restart_wait_s=restart_wait_s))
    attempts: list[int] = []

    async def attempt(turn, n, priority):
        attempts.append(n)
        if failures:
            raise failures.pop(0)
        return DONE

    runner._attempt = attempt
    return runner, attempts


@pytest.fixture(autouse=True)
def _short_pauses(monkeypatch):
    monkeypatch.setattr(runtime, "RETRY_PAUSE_S", 0.001)
    monkeypatch.setattr(runtime, "RETRY_PAUSE_MAX_S", 0.004)


def test_engines_that_are_down_are_waited_out_without_spending_retries():
    runner, attempts = _runner([EngineUnavailable("refused")] * 6, retries=1, restart_wait_s=60.0)
    assert asyncio.run(runner.run_turn(TURN)) is DONE
    assert attempts == list(range(7)) and runner.retried == 6 and runner.router.forgotten == 6


def test_without_a_restart_wait_every_failure_spends_a_retry():
    runner, attempts = _runner([EngineUnavailable("refused")] * 6, retries=2, restart_wait_s=0.0)
    with pytest.raises(EngineUnavailable):
        asyncio.run(runner.run_turn(TURN))
    assert attempts == [0, 1, 2]


def test_past_the_restart_wait_a_down_engine_spends_retries_again(monkeypatch):
    # On a clock that moves only by the pauses taken (a real one, on a loaded host, moves on
    # between attempts too, and how many fit in the wait would be the host's load)
    clock, pauses = [0.0], []

    async def sleep(s):
        pauses.append(s)
        clock[0] += s

    monkeypatch.setattr(runtime, "time", SimpleNamespace(time=time.time, monotonic=lambda: clock[0]))
    monkeypatch.setattr(runtime.asyncio, "sleep", sleep)
    runner, attempts = _runner([EngineUnavailable("refused")] * 50, retries=1, restart_wait_s=0.02)
    with pytest.raises(EngineUnavailable):
        asyncio.run(runner.run_turn(TURN))
    # failures at 0, 1, 3, 7, 11, 15 and 19 ms are waited out (pauses doubling to 4 ms); those at
    # 23 and 27 ms, past the 20 ms wait, are counted: one retry, then the turn fails
    assert pauses == [0.001, 0.002] + [0.004] * 6
    assert attempts == list(range(9)) and runner.retried == 8


def test_other_failures_spend_retries_while_engines_are_waited_out():
    runner, attempts = _runner([EngineUnavailable("x"), EngineError("HTTP 500"), EngineUnavailable("x"),
                                EngineError("HTTP 500")], retries=1, restart_wait_s=60.0)
    with pytest.raises(EngineError, match="500"):
        asyncio.run(runner.run_turn(TURN))
    assert attempts == [0, 1, 2, 3]


def test_a_leg_cancelled_on_its_worker_is_retried_and_at_last_fails_the_turn_not_its_caller():
    runner, attempts = _runner([asyncio.CancelledError()], retries=1, restart_wait_s=60.0)
    assert asyncio.run(runner.run_turn(TURN)) is DONE and attempts == [0, 1]
    runner, attempts = _runner([asyncio.CancelledError()] * 2, retries=1, restart_wait_s=60.0)
    with pytest.raises(RuntimeError, match="cancelled on its worker"):
        asyncio.run(runner.run_turn(TURN))
    assert attempts == [0, 1]


def test_every_retry_pauses_so_a_fault_of_a_few_seconds_does_not_spend_them_all(monkeypatch):
    pauses: list[float] = []

    async def sleep(s):
        pauses.append(s)

    monkeypatch.setattr(runtime.asyncio, "sleep", sleep)
    runner, attempts = _runner([EngineError("HTTP 500")] * 2 + [EngineUnavailable("x")], retries=2,
                               restart_wait_s=60.0)
    assert asyncio.run(runner.run_turn(TURN)) is DONE
    assert pauses == [0.001, 0.002, 0.004]  # doubling, up to RETRY_PAUSE_MAX_S, counted or not
