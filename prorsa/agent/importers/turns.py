"""Per-turn JSONL in Prorsa's own shape, as other tools write it: integer trajectory ids, fields
Prorsa does not read (a provider, a gap's kind), releases on any clock.

    {"traj": 0, "turn": 0, "appended_tokens": 1266, "decode_tokens": 114, "tool_latency_s": 2.59,
     "done": false, "start_s": 0.0, "gap_kind": "tool"}

Gaps: `tool_latency_s` is taken as start to start (it holds the model's own time, which
--decode-tps may subtract) unless the line's `gap_kind` names what was measured (a tool's own
start and end, a human's wait): then it is taken as is. Unknown fields are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prorsa.agent.importers.common import (Progress, RecordedRun, RecordedTurn, Source, TraceError, dig, need_int,
                                           need_num, need_obj, traj_id)

NAME = "turns"
SUMMARY = "per-turn JSONL (traj, turn, appended_tokens, decode_tokens, tool_latency_s, done), ids int or str"


def claims(head: object) -> bool:
    return isinstance(head, dict) and {"traj", "turn", "appended_tokens", "decode_tokens"} <= set(head)


@dataclass
class _Partial:
    where: str
    turns: list[RecordedTurn] = field(default_factory=list)
    start_s: float | None = None
    done: bool = False


def _turn(rec: dict, where: str) -> RecordedTurn:
    decode = need_int(rec, "decode_tokens", where)
    return RecordedTurn(appended_tokens=need_int(rec, "appended_tokens", where), decode_tokens=decode,
                        gap_s=need_num(rec, "tool_latency_s", where),
                        gap_decode_tokens=decode if dig(rec, "gap_kind") is None else 0)


def _add(parts: dict[str, _Partial], rec: dict, where: str) -> None:
    tid = traj_id(rec.get("traj"), where, "traj")
    part = parts.setdefault(tid, _Partial(where))
    turn = need_int(rec, "turn", where)
    if part.done:
        raise TraceError(f"{where}: field 'turn': trajectory {tid!r} has turn {turn} after its final turn (done)")
    if turn != len(part.turns):
        raise TraceError(f"{where}: field 'turn': expected turn {len(part.turns)} of trajectory {tid!r}, got {turn}")
    done = rec.get("done")
    if not isinstance(done, bool):
        raise TraceError(f"{where}: field 'done': should be true or false, got {done!r}")
    part.turns.append(_turn(rec, where))
    if rec.get("start_s") is not None:
        part.start_s = need_num(rec, "start_s", where)
    part.done, part.where = done, where


def read(path: Path, progress: Progress | None = None) -> list[RecordedRun]:
    parts: dict[str, _Partial] = {}
    for lineno, rec in Source(path, progress).lines():
        where = f"{path}:{lineno}"
        _add(parts, need_obj(rec, where), where)
    for tid, part in parts.items():
        if not part.done:
            raise TraceError(f"{part.where}: field 'done': trajectory {tid!r} ends at turn {len(part.turns) - 1} "
                             "without done=true")
    return [RecordedRun(tid, tuple(p.turns), p.start_s, p.where) for tid, p in parts.items()]
