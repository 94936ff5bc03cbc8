"""NVIDIA Dynamo's agent request trace (`dynamo.agent.trace.v1` JSONL, plain or .jsonl.gz).

    {"schema": "dynamo.agent.trace.v1", "event_type": "request_end", "event_time_unix_ms": 1100,
     "agent_context": {"session_id": "run-42", "trajectory_id": "run-42:coder"},
     "request": {"request_id": "r1", "input_tokens": 2048, "output_tokens": 96,
                 "request_received_ms": 1000, "total_time_ms": 100}}

One `request_end` record per model call (a record may come wrapped as {"event": {...}}); tool
events and other records are skipped. Calls group by `agent_context.trajectory_id` (older
releases: `program_id`), else by `session_id` (`workflow_id`), and run in order of
`request_received_ms`. `input_tokens` is the call's whole prompt (common.appended_tokens). The gap
runs from a call's end (`event_time_unix_ms`, else received + total_time_ms) to the next call's
receipt: the tool's (and the harness's) time, without the model's, taken as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prorsa.agent.importers.common import (Progress, RecordedRun, RecordedTurn, Source, TraceError, appended_tokens,
                                           dig, need_int, need_num, need_obj, traj_id)

NAME = "dynamo"
SUMMARY = "NVIDIA Dynamo agent request trace (request_end records with agent_context), .jsonl or .jsonl.gz"

_GROUP_KEYS = ("trajectory_id", "program_id", "session_id", "workflow_id")


def _unwrap(rec: object) -> object:
    return rec["event"] if isinstance(rec, dict) and isinstance(rec.get("event"), dict) else rec


def claims(head: object) -> bool:
    rec = _unwrap(head)
    return isinstance(rec, dict) and (str(rec.get("schema", "")).startswith("dynamo.") or "agent_context" in rec)


@dataclass(frozen=True)
class _Call:
    group: str  # the trajectory it belongs to
    received_ms: float
    end_ms: float
    prompt: int
    output: int
    where: str


def _call(rec: dict, where: str) -> _Call:
    ctx = need_obj(rec.get("agent_context"), where, "agent_context")
    key = next((k for k in _GROUP_KEYS if ctx.get(k) not in (None, "")), None)
    if key is None:
        raise TraceError(f"{where}: field 'agent_context.trajectory_id': missing (nor session_id): "
                         "the call belongs to no trajectory")
    need_obj(rec.get("request"), where, "request")
    received = need_num(rec, "request.request_received_ms", where)
    if rec.get("event_time_unix_ms") is not None:
        end = need_num(rec, "event_time_unix_ms", where)
    elif dig(rec, "request.total_time_ms") is not None:
        end = received + need_num(rec, "request.total_time_ms", where)
    else:
        raise TraceError(f"{where}: field 'event_time_unix_ms': missing (nor request.total_time_ms): "
                         "the call's end is unknown")
    return _Call(traj_id(ctx[key], where, f"agent_context.{key}"), received, end,
                 need_int(rec, "request.input_tokens", where), need_int(rec, "request.output_tokens", where), where)


def _run(group: str, calls: list[_Call]) -> RecordedRun:
    calls.sort(key=lambda c: c.received_ms)  # sinks write records as calls end, not as they start
    prompts, outputs = [c.prompt for c in calls], [c.output for c in calls]
    gaps = [(nxt.received_ms - c.end_ms) / 1e3 for c, nxt in zip(calls, calls[1:])] + [0.0]
    turns = tuple(RecordedTurn(a, d, g, 0) for a, d, g in zip(appended_tokens(prompts, outputs), outputs, gaps))
    return RecordedRun(group, turns, calls[0].received_ms / 1e3, calls[0].where)


def read(path: Path, progress: Progress | None = None) -> list[RecordedRun]:
    groups: dict[str, list[_Call]] = {}
    for lineno, rec in Source(path, progress).lines():
        where = f"{path}:{lineno}"
        rec = need_obj(_unwrap(rec), where)
        if rec.get("event_type", "request_end") != "request_end":
            continue  # tool_start / tool_end: the gaps between calls already hold them
        call = _call(rec, where)
        groups.setdefault(call.group, []).append(call)
    return [_run(g, calls) for g, calls in groups.items()]
