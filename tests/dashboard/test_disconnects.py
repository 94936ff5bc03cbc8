"""A closed dashboard tab's AssertionError (Bokeh's ServerConnection without its session) is logged
at debug level, not with a traceback on the run's console; other errors are logged as before."""

from __future__ import annotations

import logging

import pytest
from bokeh.server.connection import ServerConnection

from prorsa.dashboard.disconnects import LOGGERS, quiet_disconnects


def _detached_session_error() -> AssertionError:
    conn = ServerConnection.__new__(ServerConnection)  # what a closed tab leaves: no session
    conn._session = None
    try:
        conn.session  # noqa: B018
    except AssertionError as e:
        return e
    raise AssertionError("bokeh's ServerConnection no longer asserts its session")


class _Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def seen():
    handler, root = _Seen(), logging.getLogger()
    root.addHandler(handler)
    yield handler
    root.removeHandler(handler)


@pytest.mark.parametrize("name", LOGGERS)
def test_a_closed_tab_is_kept_off_the_console(name, seen):
    quiet_disconnects()
    quiet_disconnects()  # twice: one filter
    log = logging.getLogger(name)
    err = _detached_session_error()
    log.error("Handler or its work threw an exception: %r: %r", err, None, exc_info=(type(err), err, err.__traceback__))
    assert seen.records == []  # the logger is not at debug level: nothing reaches a handler
    other = ValueError("a real fault")
    log.error("Handler or its work threw an exception", exc_info=(ValueError, other, None))
    assert [(r.levelname, r.exc_info is not None) for r in seen.records] == [("ERROR", True)]
    seen.records.clear()
    level = log.level
    log.setLevel(logging.DEBUG)
    try:
        log.error("Handler or its work threw an exception: %r", err, exc_info=(type(err), err, err.__traceback__))
    finally:
        log.setLevel(level)
    (record,) = seen.records
    assert record.levelno == logging.DEBUG and record.exc_info is None and "tab closed" in record.getMessage()
