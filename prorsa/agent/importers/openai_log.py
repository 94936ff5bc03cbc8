"""OpenAI chat logs: one chat completion a line, with its usage, as a proxy or client logs them.

    {"id": "chatcmpl-1", "object": "chat.completion", "created": 1717000000,
     "usage": {"prompt_tokens": 1820, "completion_tokens": 95}, "session_id": "task-3"}

A line is a response, or {"request": {...}, "response": {...}}; usage may also be the Responses
API's `input_tokens` / `output_tokens`. Lines group into conversations by the first of
`session_id`, `conversation_id`, `trajectory_id`, `metadata.session_id` or the request's `user`
(a log with none of them is one conversation), in file order. `prompt_tokens` is the whole
context sent (common.appended_tokens). `created` is when a call was made, so a gap runs start to
start and holds the model's own time (--decode-tps may subtract it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prorsa.agent.importers.common import (Progress, RecordedRun, RecordedTurn, Source, TraceError, appended_tokens,
                                           dig, need_int, need_num, need_obj, traj_id)

NAME = "openai"
SUMMARY = "OpenAI chat completion logs with usage (prompt_tokens, completion_tokens, created), JSONL"

_KEYS = ("session_id", "conversation_id", "trajectory_id", "metadata.session_id", "request.user",
         "request.metadata.session_id")


def _response(rec: dict) -> object:
    return rec["response"] if isinstance(rec.get("response"), dict) else rec


def claims(head: object) -> bool:
    return isinstance(head, dict) and isinstance(_response(head), dict) and "usage" in _response(head)


@dataclass(frozen=True)
class _Call:
    prompt: int
    output: int
    created: float | None
    where: str


def _call(rec: dict, where: str) -> _Call:
    resp = need_obj(_response(rec), where, "response")
    usage = need_obj(resp.get("usage"), where, "usage")
    prefix = "response." if resp is not rec else ""
    chat = "prompt_tokens" in usage or "input_tokens" not in usage
    prompt = need_int(usage, "prompt_tokens" if chat else "input_tokens", where,
                      label=f"{prefix}usage.{'prompt_tokens' if chat else 'input_tokens'}")
    output = need_int(usage, "completion_tokens" if chat else "output_tokens", where,
                      label=f"{prefix}usage.{'completion_tokens' if chat else 'output_tokens'}")
    created = None if resp.get("created") is None else need_num(resp, "created", where, label=f"{prefix}created")
    return _Call(prompt, output, created, where)


def _run(key: str, calls: list[_Call]) -> RecordedRun:
    stamps = [c.created for c in calls]
    timed = all(s is not None for s in stamps)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])] if timed else [0.0] * (len(calls) - 1)
    prompts, outputs = [c.prompt for c in calls], [c.output for c in calls]
    turns = tuple(RecordedTurn(a, d, g, d)
                  for a, d, g in zip(appended_tokens(prompts, outputs), outputs, [*gaps, 0.0]))
    return RecordedRun(key, turns, stamps[0] if timed else None, calls[0].where)


def read(path: Path, progress: Progress | None = None) -> list[RecordedRun]:
    groups: dict[str, list[_Call]] = {}
    for lineno, rec in Source(path, progress).lines():
        where = f"{path}:{lineno}"
        rec = need_obj(rec, where)
        key = next((k for k in _KEYS if dig(rec, k) not in (None, "")), None)
        group = "0" if key is None else traj_id(dig(rec, key), where, key)
        groups.setdefault(group, []).append(_call(rec, where))
    if not groups:
        raise TraceError(f"{path}: no chat completions in the log")
    return [_run(k, calls) for k, calls in groups.items()]
