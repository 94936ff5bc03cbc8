"""A tool made from a plain Python function (sync or async), run in the caller's process.

    FunctionTool(fn, name=None, description=None, parameters=None)

The name defaults to the function's, the description to the first line of its docstring, the
schema to one derived from its signature (annotated str/int/float/bool/list/dict parameters;
those without a default are required). A function reports failure by raising: that becomes an
ERROR observation. A sync function runs in a thread of its own, so a slow one does not stall the
event loop; a thread cannot be killed, so one that ignores its timeout keeps its thread until it
returns (use CommandSpec or the python tool for code that may hang). That thread is a daemon
outside any executor: a loop's executor is joined when the loop closes (asyncio.run) and at
interpreter exit, so a hung call in one would hang the tool task past its timeout, and the
process at exit.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
import typing
from collections.abc import Callable, Mapping
from typing import Any

from prorsa.agent.tools.base import ToolResult, ToolStatus

_SCHEMA_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean",
                 list: "array", dict: "object"}


def schema_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of `fn`'s keyword arguments, from its signature."""
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        hint = typing.get_origin(hints.get(p.name)) or hints.get(p.name)
        props[p.name] = {"type": _SCHEMA_TYPES[hint]} if hint in _SCHEMA_TYPES else {}
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "object", "properties": props, "required": required}


class FunctionTool:
    def __init__(self, fn: Callable[..., Any], *, name: str | None = None,
                 description: str | None = None, parameters: Mapping[str, Any] | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "tool_name", None) or fn.__name__
        doc = inspect.getdoc(fn) or ""
        self.description = description or (doc.splitlines()[0] if doc else self.name)
        self.parameters = parameters or getattr(fn, "parameters", None) or schema_of(fn)

    async def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> ToolResult:
        start = time.perf_counter()
        if inspect.iscoroutinefunction(self.fn):
            run = self.fn(**arguments)
        else:
            run = _in_daemon_thread(self.fn, arguments, self.name)
        try:
            value = await (asyncio.wait_for(run, timeout_s) if timeout_s is not None else run)
        except asyncio.TimeoutError:
            return ToolResult(f"Error: {self.name} timed out after {timeout_s:g} s",
                              ToolStatus.TIMEOUT, time.perf_counter() - start, "wall timeout")
        except Exception as e:  # noqa: BLE001 - raising is how a function tool reports failure
            return ToolResult(f"Error: {type(e).__name__}: {e}", ToolStatus.ERROR,
                              time.perf_counter() - start, f"raised {type(e).__name__}")
        if isinstance(value, ToolResult):
            return value
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return ToolResult(text, ToolStatus.OK, time.perf_counter() - start)


def _in_daemon_thread(fn: Callable[..., Any], arguments: Mapping[str, Any], name: str) -> asyncio.Future:
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # timed out and cancelled meanwhile
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            value, error = fn(**arguments), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            value, error = None, e
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the loop is closed: nobody waits for this call any more
            pass

    threading.Thread(target=target, name=f"tool-{name}", daemon=True).start()
    return future
