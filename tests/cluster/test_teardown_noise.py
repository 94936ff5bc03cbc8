"""The scheduler's errors from work cancelled while a run or sweep unwinds are dropped then, and only then."""

import logging

from prorsa.cluster.launch import _teardown_noise_filtered


def _passes(message: str) -> bool:
    record = logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1, message, (), None)
    return logging.getLogger("distributed.scheduler").filter(record)


def test_teardown_errors_are_dropped_only_once_the_work_is_done():
    gather = "Couldn't gather keys: {'sim-abc': 'forgotten'}"
    broadcast = "broadcast to tcp://127.0.0.1:1 failed: CommClosedError"
    with _teardown_noise_filtered() as noise:
        assert _passes(gather) and _passes(broadcast)  # mid-run they may be real faults
        noise.armed = True
        assert not _passes(gather) and not _passes(broadcast)
        assert _passes("Worker tcp://127.0.0.1:1 failed to heartbeat")
    assert _passes(gather)  # the filter leaves with the cluster


def test_the_cancel_race_in_distributed_sync_is_dropped_and_other_callback_errors_are_not():
    def record(exc: BaseException, where: str) -> logging.LogRecord:
        message = f"Exception in callback functools.partial(<function {where} at 0x1>)"
        return logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, message, (), (type(exc), exc, None))

    log = logging.getLogger("tornado.application")
    race = record(NameError("cannot access free variable 'future'"), "sync.<locals>.cancel")
    with _teardown_noise_filtered():
        assert not log.filter(race)
        assert log.filter(record(NameError("x"), "Worker.heartbeat"))
        assert log.filter(record(ValueError("x"), "sync.<locals>.cancel"))
    assert log.filter(race)  # only while a cluster is open
