"""mini-swe-agent and SWE-agent trajectory files (`*.traj.json`, `*.traj`), one or a folder of them.

    {"info": {...}, "trajectory_format": "mini-swe-agent-1.1",
     "messages": [{"role": "system", ...}, {"role": "user", ...},
                  {"role": "assistant", "content": "...", "extra": {"timestamp": 1706000000.0,
                   "response": {"created": 1705999998, "usage": {"prompt_tokens": 1500, "completion_tokens": 90}}}},
                  ...]}

Each assistant message is a model call; its usage comes from `extra.response.usage`, `extra.usage`
or `usage` (SWE-agent keeps its conversation under `history` instead of `messages`). A call's
`prompt_tokens` is the whole context sent (common.appended_tokens). The file's name (less
.traj.json) is the trajectory id.

Gaps, by what the file holds:
    SWE-agent steps' `execution_time`   the tool's own time, taken as is
    `extra.timestamp`                   when each reply arrived: a gap runs end to end, so it holds
                                        the next call's model time (--decode-tps may subtract it)
    `extra.response.created`            when each call was made: start to start, holding this
                                        call's model time (likewise)
"""

from __future__ import annotations

from pathlib import Path

from prorsa.agent.importers.common import (Progress, RecordedRun, RecordedTurn, Source, TraceError, appended_tokens,
                                           dig, need_int, need_num, need_obj)

NAME = "swe-agent"
SUMMARY = "mini-swe-agent / SWE-agent trajectory files (*.traj.json, *.traj), a file or a folder of them"

_USAGE = ("extra.response.usage", "extra.usage", "usage")
SUFFIXES = (".traj.json", ".traj")


def claims(head: object) -> bool:
    return isinstance(head, dict) and (isinstance(head.get("messages"), list) or isinstance(head.get("history"), list))


def files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))


def _calls(doc: dict, where: str) -> list[tuple[int, dict, str]]:
    key = "messages" if isinstance(doc.get("messages"), list) else "history"
    if not isinstance(doc.get(key), list):
        raise TraceError(f"{where}: field 'messages': missing (nor SWE-agent's 'history'): not a trajectory file")
    calls = [(i, m, key) for i, m in enumerate(doc[key]) if isinstance(m, dict) and m.get("role") == "assistant"]
    if not calls:
        raise TraceError(f"{where}: field '{key}': no assistant message, so no model call to replay")
    return calls


def _usage(msg: dict, at: str, where: str) -> tuple[int, int]:
    path = next((p for p in _USAGE if isinstance(dig(msg, p), dict)), None)
    if path is None:
        raise TraceError(f"{where}: field '{at}.extra.response.usage': missing: the file records no token "
                         "counts for this model call")
    return (need_int(msg, f"{path}.prompt_tokens", where, label=f"{at}.{path}.prompt_tokens"),
            need_int(msg, f"{path}.completion_tokens", where, label=f"{at}.{path}.completion_tokens"))


def _gaps(doc: dict, msgs: list[dict], calls: list[tuple[int, dict, str]], outputs: list[int],
          where: str) -> tuple[list[float], list[int], float | None]:
    """(gap after each call, the decode tokens each gap holds, the first call's time)."""
    n = len(msgs)
    steps = doc.get("trajectory")
    if isinstance(steps, list) and len(steps) == n and all(isinstance(s, dict) and "execution_time" in s for s in steps):
        return ([need_num(s, "execution_time", where, label=f"trajectory.{i}.execution_time")
                 for i, s in enumerate(steps)], [0] * n, None)
    for path, end_to_end in (("extra.timestamp", True), ("extra.response.created", False)):
        if all(dig(m, path) is not None for m in msgs):
            t = [need_num(m, path, where, label=f"{key}.{i}.{path}") for i, m, key in calls]
            held = outputs[1:] + [0] if end_to_end else outputs
            return [b - a for a, b in zip(t, t[1:])] + [0.0], held, t[0]
    return [0.0] * n, [0] * n, None  # no clock at all: the trajectory replays without tool time


def read_file(path: Path, progress: Progress | None = None) -> RecordedRun:
    where = str(path)
    doc = need_obj(Source(path, progress).document(), where)
    calls = _calls(doc, where)
    counts = [_usage(m, f"{key}.{i}", where) for i, m, key in calls]
    prompts, outputs = [p for p, _ in counts], [c for _, c in counts]
    gaps, held, start = _gaps(doc, [m for _, m, _ in calls], calls, outputs, where)
    turns = tuple(RecordedTurn(a, d, g, h)
                  for a, d, g, h in zip(appended_tokens(prompts, outputs), outputs, gaps, held))
    name = path.name
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    return RecordedRun(name, turns, start, where)


def read(path: Path, progress: Progress | None = None) -> list[RecordedRun]:
    if not path.is_dir():
        return [read_file(path, progress)]
    files = files_in(path)
    if not files:
        raise TraceError(f"{path}: no trajectory files (*.traj.json, *.traj) in the folder")
    runs: list[RecordedRun] = []
    for f in files:
        runs.append(read_file(f))
        if progress is not None:
            progress(1)
    return runs
