"""The tool contract: what the agent loop may call, and what every call gives back.

    Tool.name, .description     how the model and the pipeline name the tool
    Tool.parameters             JSON schema (an object schema) of the call's arguments
    await Tool.call(args, timeout_s=...)  run once -> ToolResult; implementations should not raise
    await call_tool(tool, args, timeout_s=...)  the safe entry point for callers: checks the
                                arguments, enforces the timeout and turns any exception into a
                                ToolResult, so a tool never fails a rollout
    ToolCall(name, arguments)   one call as parsed from model output or taken from a dataset
    ToolResult(observation, status, elapsed_s)   what comes back; `status` is a ToolStatus

Statuses: OK (ran and succeeded), ERROR (ran and reported a failure, or bad arguments), TIMEOUT
(wall or CPU limit), CRASH (the tool or its process died: a signal, an exception inside the tool),
TRUNCATED (ran, but its output was cut to the observation limit).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

# A tool that honours its own timeout gets this long past it before call_tool gives up on it.
TIMEOUT_GRACE_S = 1.0


class ToolStatus(str, Enum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    CRASH = "crash"
    TRUNCATED = "truncated"


@dataclass(frozen=True)
class ToolResult:
    observation: str  # the text appended to the model's context
    status: ToolStatus
    elapsed_s: float  # wall time of the call, start to result
    detail: str = ""  # for logs, not the model: exit code, signal, which limit was hit

    def to_dict(self) -> dict[str, Any]:
        return {"observation": self.observation, "status": self.status.value,
                "elapsed_s": self.elapsed_s, "detail": self.detail}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)  # JSON-like values only
    call_id: str = ""  # the model's id for the call, when it gave one

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": dict(self.arguments), "call_id": self.call_id}


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    parameters: Mapping[str, Any]

    async def call(self, arguments: Mapping[str, Any], *, timeout_s: float | None = None) -> ToolResult:
        ...


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
               "object": Mapping, "array": (list, tuple), "null": type(None)}


def check_arguments(schema: Mapping[str, Any], arguments: Any) -> str | None:
    """The first problem with `arguments` against an object schema, or None.

    Only what a model gets wrong in practice: not an object, a missing required key, an unknown key
    when additionalProperties is false, a top-level value of the wrong JSON type.
    """
    if not isinstance(arguments, Mapping):
        return f"arguments must be an object, got {type(arguments).__name__}"
    props = schema.get("properties", {})
    for key in schema.get("required", ()):
        if key not in arguments:
            return f"missing argument {key!r}"
    for key, value in arguments.items():
        if key not in props:
            if schema.get("additionalProperties", True) is False:
                return f"unknown argument {key!r} (expected one of {sorted(props)})"
            continue
        expected = props[key].get("type")
        if isinstance(expected, str) and expected in _JSON_TYPES:
            ok = isinstance(value, _JSON_TYPES[expected])
            if expected in ("integer", "number") and isinstance(value, bool):
                ok = False
            if not ok:
                return f"argument {key!r} must be {expected}, got {type(value).__name__}"
    return None


async def call_tool(tool: Tool, arguments: Any, *, timeout_s: float | None = None) -> ToolResult:
    """Call `tool` once; never raises (except cancellation of the caller)."""
    start = time.perf_counter()

    def done(observation: str, status: ToolStatus, detail: str = "") -> ToolResult:
        return ToolResult(observation, status, time.perf_counter() - start, detail)

    problem = check_arguments(tool.parameters, arguments)
    if problem is not None:
        return done(f"Error: {problem}", ToolStatus.ERROR, "bad arguments")
    try:
        call = tool.call(arguments, timeout_s=timeout_s)
        if timeout_s is None:
            return await call
        return await asyncio.wait_for(call, timeout_s + TIMEOUT_GRACE_S)
    except asyncio.TimeoutError:
        return done(f"Error: {tool.name} timed out after {timeout_s:g} s", ToolStatus.TIMEOUT,
                    "wall timeout (caller)")
    except Exception as e:  # noqa: BLE001 - a broken tool is an observation, not a failed rollout
        return done(f"Error: {tool.name} failed: {type(e).__name__}: {e}", ToolStatus.CRASH,
                    f"exception in tool: {type(e).__name__}")
