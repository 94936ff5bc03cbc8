"""LLMServingSim's agentic JSONL: one session a line, its model calls in `sub_requests`.

    {"session_id": "s0", "arrival_time_ns": 0,
     "sub_requests": [{"input_toks": 1200, "output_toks": 80, "tool_duration_ns": 2500000000}, ...]}

`input_toks` is a call's whole prompt, so the appended tokens are its growth over the previous
call's prompt and output (common.appended_tokens). `tool_duration_ns` is the wait after a call
completes before the next is sent: the tool's own time, taken as is. A line without
`sub_requests` is a flat request, a trajectory of one call. A missing session_id is the line number.
"""

from __future__ import annotations

from pathlib import Path

from prorsa.agent.importers.common import (Progress, RecordedRun, RecordedTurn, Source, TraceError, appended_tokens,
                                           need_int, need_obj, traj_id)

NAME = "llmservingsim"
SUMMARY = "LLMServingSim agentic JSONL (sessions of sub_requests: input_toks, output_toks, tool_duration_ns)"


def claims(head: object) -> bool:
    return isinstance(head, dict) and ("sub_requests" in head or "input_toks" in head)


def _session(rec: dict, lineno: int, where: str) -> RecordedRun:
    calls = rec.get("sub_requests", [rec])
    if not isinstance(calls, list) or not calls:
        raise TraceError(f"{where}: field 'sub_requests': should be a non-empty list, got {calls!r}")
    prompts, outputs, gaps = [], [], []
    for i, call in enumerate(calls):
        at = f"sub_requests.{i}." if "sub_requests" in rec else ""
        need_obj(call, where, at.rstrip("."))
        prompts.append(need_int(call, "input_toks", where, label=f"{at}input_toks"))
        outputs.append(need_int(call, "output_toks", where, label=f"{at}output_toks"))
        gap_ns = need_int(call, "tool_duration_ns", where, label=f"{at}tool_duration_ns") if "tool_duration_ns" in call else 0
        gaps.append(gap_ns / 1e9)
    turns = tuple(RecordedTurn(a, d, g, 0) for a, d, g in zip(appended_tokens(prompts, outputs), outputs, gaps))
    start = rec.get("arrival_time_ns")
    tid = traj_id(rec.get("session_id", lineno), where, "session_id")
    return RecordedRun(tid, turns, None if start is None else need_int(rec, "arrival_time_ns", where) / 1e9, where)


def read(path: Path, progress: Progress | None = None) -> list[RecordedRun]:
    runs = []
    for lineno, rec in Source(path, progress).lines():
        where = f"{path}:{lineno}"
        runs.append(_session(need_obj(rec, where), lineno, where))
    return runs
