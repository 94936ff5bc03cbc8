"""A browser tab closed on the dashboard is not an error of the run.

    quiet_disconnects()   in the scheduler's process: the traceback of a closed tab goes to the
                          debug level of the logger that reported it (idempotent)

When a tab closes, Bokeh detaches its connection's session; work for that tab still under way (a
message being handled, the close itself when it runs twice) then reads `connection.session`,
which asserts the session is there (bokeh 3.9, bokeh/server/connection.py). Bokeh, tornado or
asyncio logs the AssertionError with its traceback at error level, on the run's console, once per
closed tab. Nothing is lost: the tab is gone. Every other error is left as it is.
"""

from __future__ import annotations

import logging
import os

# where the traceback of a disconnect is logged: Bokeh's websocket handler, or the event loop's
# reporters when it escapes a callback (a logger's filters see only records made at that logger)
LOGGERS = ("bokeh.server.views.ws", "tornado.application", "asyncio")
_SOURCE = os.path.join("bokeh", "server", "connection.py")


def is_disconnect(exc: BaseException | None) -> bool:
    """An AssertionError raised in Bokeh's ServerConnection: a session already detached."""
    if not isinstance(exc, AssertionError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.endswith(_SOURCE)


class _Disconnect(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not is_disconnect(record.exc_info[1] if record.exc_info else None):
            return True
        # handlers see a record's own level only, whatever the loggers above it are set to
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = "a dashboard tab closed while Bokeh still had work for it", ()
        record.exc_info, record.exc_text = None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_disconnects() -> None:
    for name in LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _Disconnect) for f in log.filters):
            log.addFilter(_Disconnect())
