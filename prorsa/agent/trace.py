"""Trajectory records (TurnSpec, TrajectorySpec) and their JSONL trace form.

A TrajectorySpec is the workload's promise of what one trajectory will do: how many tokens each
turn appends and decodes, and how long each tool call takes. Synthetic families (families.py,
shaped by workload.py) and recorded traces (this module) produce the same records, so the agent
loop never knows which one it replays.

Operations:
    read_trace(path)                 parse and validate a JSONL trace -> [TrajectorySpec]; TraceError
    write_trace(path, trajectories)  write them back in the same format (read(write(x)) == x)
    turns_as_ran(turns)              (appended, decoded, tool_s) per turn of a finished trajectory
                                     -> its TurnSpecs (the last done, with no tool after it)
    workload_means(trajectories)     their means per trajectory: what a prior or a policy plans with

The format is one JSON object per line, one line per turn:

    {"traj": "s0-p3-g1", "turn": 0, "appended_tokens": 812, "decode_tokens": 301,
     "tool_latency_s": 0.42, "done": false, "family": "swe", "seed": 123, "step": 0,
     "prompt": 3, "group": 1, "start_s": 12.5}

`family`, `seed`, `step`, `prompt`, `group` and `start_s` are optional and per trajectory: written
on turn 0 only, accepted on any line (they must then agree). Missing ones default to family "trace"
(or the reader's default), step 0, prompt = order of first appearance, group 0, a seed hashed
from the trajectory id and no release time. `start_s` is the trajectory's release: it starts no
earlier than this many seconds after the run (async) or its step (sync) began, in the seconds
its tool latencies are given in (drivers.py). Lines of different trajectories may interleave (a live run writes turns as
they finish); within a trajectory turns must run 0, 1, 2, ... and end with exactly one done.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


@dataclass(frozen=True)
class TurnSpec:
    appended_tokens: int  # tokens appended before this turn's decode: the prompt (turn 0) or
    #                       the previous tool's observation
    decode_tokens: int  # tokens the model generates this turn
    tool_latency_s: float  # the tool call after this turn's decode (0 when the trajectory ends here)
    done: bool  # the trajectory ends after this turn's decode


@dataclass(frozen=True)
class TrajectorySpec:
    traj_id: str  # unique in a run, e.g. "s0-p3-g1" (step, prompt, group member) or "a17" (async)
    family: str  # task family (a FAMILIES key) or "trace"; the forecaster learns per family
    prompt_index: int  # sync: prompt within the step; async: global prompt counter
    group_index: int  # member of the GRPO group sharing the prompt, 0..G-1
    step: int  # sync: training step; async: 0 (the trainer assigns policy versions at run time)
    turns: tuple[TurnSpec, ...]  # at least one; only the last is done
    seed: int  # for token-id synthesis and sampling (uint32 range)
    # released this many seconds after the run (async) or its step (sync) began; None: at once
    start_s: float | None = None

    def __post_init__(self) -> None:
        # Catch a malformed record where it is built, not turns later inside an engine.
        if not self.turns:
            raise ValueError(f"trajectory {self.traj_id!r} has no turns")
        if not self.turns[-1].done or any(t.done for t in self.turns[:-1]):
            raise ValueError(f"trajectory {self.traj_id!r}: exactly the last turn must be done")
        if self.start_s is not None and not 0 <= self.start_s < float("inf"):
            raise ValueError(f"trajectory {self.traj_id!r}: start_s must be a finite number >= 0, got {self.start_s!r}")

    @property
    def context_tokens(self) -> int:
        """Tokens in the context at the end: every appended and every decoded token."""
        return sum(t.appended_tokens + t.decode_tokens for t in self.turns)


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message is one line naming file, line and field."""


_INT32 = 2**31 - 1
MAX_TOOL_S = 7 * 86400.0
MAX_START_S = 30 * 86400.0  # no rollout runs a month: a larger release is a unit mistake (ms)


class _Line(BaseModel):
    # strict: "12" or 12.0 for a token count is a producer bug worth reporting, not coercing.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    # Upper bounds: trajectories.parquet stores counts and indices as int32, so a larger value
    # would fail the run at its very end; a latency past MAX_TOOL_S is a unit mistake.
    traj: str  # recorded agent logs often number their runs: an integer is read as its decimal text

    @field_validator("traj", mode="before")
    @classmethod
    def _as_text(cls, v):
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if not isinstance(v, str) or not v:
            raise ValueError("should be a non-empty string or an integer id")
        return v
    turn: int = Field(ge=0, le=_INT32)
    appended_tokens: int = Field(ge=0, le=_INT32)  # 0 allowed after turn 0: a tool with empty output
    decode_tokens: int = Field(ge=1, le=_INT32)  # an engine cannot generate zero tokens
    tool_latency_s: float = Field(ge=0, le=MAX_TOOL_S)
    done: bool
    family: str | None = Field(None, min_length=1)
    seed: int | None = Field(None, ge=0, lt=2**32)
    step: int | None = Field(None, ge=0, le=_INT32)
    prompt: int | None = Field(None, ge=0, le=_INT32)
    group: int | None = Field(None, ge=0, le=_INT32)
    start_s: float | None = Field(None, ge=0, le=MAX_START_S)


_PER_TRAJECTORY = ("family", "seed", "step", "prompt", "group", "start_s")


@dataclass
class _Partial:
    """A trajectory being assembled while reading; `last_line` points errors at the right place."""

    turns: list[TurnSpec]
    meta: dict[str, Any]  # the per-trajectory fields seen so far
    last_line: int
    done: bool = False


def _pydantic_message(err: ValidationError) -> str:
    e = err.errors()[0]
    field = ".".join(str(p) for p in e["loc"])
    if e["type"] == "json_invalid":
        # Each line is parsed alone, so the parser's "line 1" would mislead; keep the column.
        detail = e["msg"].removeprefix("Invalid JSON: ").replace(" at line 1 column", " at column")
        return f"bad JSON: {detail}"
    if e["type"] == "model_type":
        return "bad line: expected a JSON object"
    if e["type"] == "missing":
        return f"field '{field}': missing"
    if e["type"] == "extra_forbidden":
        known = ", ".join(_Line.model_fields)
        return f"field '{field}': unknown field (expected {known})"
    return f"field '{field}': {e['msg'].replace('Input should', 'should')}, got {e.get('input')!r}"


def _check_turn(src: str, lineno: int, line: _Line, part: _Partial | None) -> None:
    where = f"{src}:{lineno}"
    if part is not None and part.done:
        raise TraceError(
            f"{where}: field 'turn': trajectory {line.traj!r} has turn {line.turn} after its "
            f"final turn {len(part.turns) - 1} (done)"
        )
    expected = 0 if part is None else len(part.turns)
    if line.turn != expected:
        raise TraceError(
            f"{where}: field 'turn': expected turn {expected} of trajectory {line.traj!r}, "
            f"got {line.turn} (turns out of order or missing)"
        )
    if line.turn == 0 and line.appended_tokens < 1:
        raise TraceError(f"{where}: field 'appended_tokens': turn 0 needs a prompt of >= 1 token, got 0")
    if line.done and line.tool_latency_s != 0:
        raise TraceError(
            f"{where}: field 'tool_latency_s': must be 0 on the final turn (done), "
            f"got {line.tool_latency_s!r}"
        )
    for key in _PER_TRAJECTORY:
        value = getattr(line, key)
        if part is not None and value is not None and part.meta.get(key, value) != value:
            raise TraceError(
                f"{where}: field '{key}': {value!r} disagrees with {part.meta[key]!r} given "
                f"earlier for trajectory {line.traj!r}"
            )


def read_trace(path: str | Path, default_family: str = "trace") -> list[TrajectorySpec]:
    """Parse and validate a JSONL trace; trajectories in order of first appearance.

    Raises TraceError naming file, line number and field for the first problem found.
    """
    src = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{src}: cannot read trace: {exc}") from None
    parts: dict[str, _Partial] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue  # blank lines (a trailing newline, hand-edited files) carry nothing
        try:
            line = _Line.model_validate_json(raw)
        except ValidationError as exc:
            raise TraceError(f"{src}:{lineno}: {_pydantic_message(exc)}") from None
        part = parts.get(line.traj)
        _check_turn(src, lineno, line, part)
        if part is None:
            part = parts[line.traj] = _Partial(turns=[], meta={}, last_line=lineno)
        part.turns.append(TurnSpec(line.appended_tokens, line.decode_tokens, line.tool_latency_s, line.done))
        part.meta.update({k: getattr(line, k) for k in _PER_TRAJECTORY if getattr(line, k) is not None})
        part.last_line, part.done = lineno, line.done
    for traj, part in parts.items():
        if not part.done:
            raise TraceError(
                f"{src}:{part.last_line}: field 'done': trajectory {traj!r} ends at turn "
                f"{len(part.turns) - 1} without done=true"
            )
    return [_assemble(traj, i, part, default_family) for i, (traj, part) in enumerate(parts.items())]


def _assemble(traj: str, order: int, part: _Partial, default_family: str) -> TrajectorySpec:
    m = part.meta
    return TrajectorySpec(
        traj_id=traj,
        family=m.get("family", default_family),
        prompt_index=m.get("prompt", order),
        group_index=m.get("group", 0),
        step=m.get("step", 0),
        turns=tuple(part.turns),
        # crc32: stable across processes and Python versions, unlike hash(str).
        seed=m.get("seed", zlib.crc32(traj.encode())),
        start_s=m.get("start_s"),
    )


def trace_lines(spec: TrajectorySpec) -> list[dict[str, object]]:
    """The trace lines of one trajectory, as dicts (turn 0 carries the per-trajectory fields)."""
    lines: list[dict[str, object]] = []
    for k, t in enumerate(spec.turns):
        line: dict[str, object] = {
            "traj": spec.traj_id,
            "turn": k,
            "appended_tokens": t.appended_tokens,
            "decode_tokens": t.decode_tokens,
            "tool_latency_s": float(t.tool_latency_s),
            "done": t.done,
        }
        if k == 0:
            line.update(family=spec.family, seed=spec.seed, step=spec.step,
                        prompt=spec.prompt_index, group=spec.group_index)
            if spec.start_s is not None:
                line["start_s"] = float(spec.start_s)
        lines.append(line)
    return lines


def write_trace(path: str | Path, trajectories: Iterable[TrajectorySpec]) -> None:
    """Write trajectories as a JSONL trace, atomically (a crash never leaves half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for spec in trajectories:
            for line in trace_lines(spec):
                # json writes floats with repr(): the shortest string that reads back exactly.
                f.write(json.dumps(line) + "\n")
    tmp.replace(path)


def turns_as_ran(turns: Sequence[tuple[int, int, float]]) -> tuple[TurnSpec, ...]:
    last = len(turns) - 1
    return tuple(TurnSpec(a, d, 0.0 if k == last else tool_s, k == last) for k, (a, d, tool_s) in enumerate(turns))


def workload_means(trajectories: Sequence[TrajectorySpec]) -> dict[str, float]:
    """The first turn's append, a later turn's append, a turn's decode, a tool call's seconds (as
    the specs give them) and turns per trajectory, each a mean (0 where there is none)."""
    turns = [t for s in trajectories for t in s.turns]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    return {"prompt_tokens": mean([s.turns[0].appended_tokens for s in trajectories]),
            "observation_tokens": mean([t.appended_tokens for s in trajectories for t in s.turns[1:]]),
            "decode_tokens": mean([t.decode_tokens for t in turns]),
            "tool_s": mean([t.tool_latency_s for t in turns if not t.done]),
            "turns": len(turns) / len(trajectories) if trajectories else 0.0}
