"""What every importer shares: the records a reader yields, field checks with one-line errors, and
the step from recorded model calls to TrajectorySpecs.

    RecordedTurn / RecordedRun       one model call / one trajectory, as a reader found them
    ImportOptions                    how gaps, releases and the family label are treated
    appended_tokens(prompts, completions)  per call, the tokens it appended to the context
    to_specs(runs, options) -> [TrajectorySpec]   validated, releases made relative (TraceError)
    Source(path)                     a file's lines or JSON document, gzip or not, with progress
    need_int / need_num / need_obj / dig    a field or one TraceError naming file, line and field

A reader raises TraceError (agent/trace.py): one line, the file, the line or record, the field.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

from prorsa.agent.trace import MAX_START_S, MAX_TOOL_S, TraceError, TrajectorySpec, TurnSpec

_INT32 = 2**31 - 1
Progress = Callable[[int], None]  # advance by this many units (bytes of a file, files of a folder)


@dataclass(frozen=True)
class RecordedTurn:
    appended_tokens: int  # tokens this call added to the context (turn 0: its whole prompt)
    decode_tokens: int  # completion tokens of this call
    gap_s: float  # after this call, until the next one (0 after the last), as the source measures it
    # the completion tokens whose model time the gap holds: this call's when it runs start to
    # start, the next call's when end to end, 0 when it is the tool's own time
    gap_decode_tokens: int


@dataclass(frozen=True)
class RecordedRun:
    traj_id: str  # the source's id (an int id becomes its decimal string)
    turns: tuple[RecordedTurn, ...]  # in call order; at least one
    start_s: float | None  # its first call, in the source's seconds (any epoch); None: unknown
    where: str  # file (and line) it came from, for errors about the run as a whole


@dataclass(frozen=True)
class ImportOptions:
    family: str = "trace"  # the label the forecaster learns under
    # > 0: subtract decode_tokens / decode_tps (the model's own time, estimated) from every gap
    # that holds it; 0: take gaps as they are
    decode_tps: float = 0.0
    # auto: relative releases when they span under MAX_START_S, else none (clocks that far apart
    # are unrelated recordings); recorded: insist on them; none: every trajectory starts at once
    releases: Literal["auto", "recorded", "none"] = "auto"


def appended_tokens(prompts: Sequence[int], completions: Sequence[int]) -> list[int]:
    """Per call, this prompt less what the previous call's context already held (its prompt and
    its completion). A drop below that is a context reset or truncation: the call starts afresh,
    so all of its prompt is new to prefill, never a negative count."""
    out: list[int] = []
    held = 0
    for prompt, completion in zip(prompts, completions):
        out.append(prompt - held if prompt >= held else prompt)
        held = prompt + completion
    return out


def _tool_s(turn: RecordedTurn, options: ImportOptions) -> float:
    gap = max(0.0, turn.gap_s)  # calls that overlap (clock skew, parallel agents) leave no gap
    if options.decode_tps > 0:
        gap = max(0.0, gap - turn.gap_decode_tokens / options.decode_tps)
    return gap


def _spec(run: RecordedRun, index: int, options: ImportOptions, start_s: float | None) -> TrajectorySpec:
    last = len(run.turns) - 1
    turns: list[TurnSpec] = []
    for k, t in enumerate(run.turns):
        where = f"{run.where}: trajectory {run.traj_id!r} call {k}"
        if k == 0 and t.appended_tokens < 1:
            raise TraceError(f"{where}: the first call's prompt has no tokens")
        if max(t.appended_tokens, t.decode_tokens) > _INT32:
            raise TraceError(f"{where}: a token count past 2**31-1 ({max(t.appended_tokens, t.decode_tokens)})")
        tool = 0.0 if k == last else _tool_s(t, options)
        if tool > MAX_TOOL_S:
            raise TraceError(f"{where}: a gap of {tool:.0f} s to the next call is past {MAX_TOOL_S:.0f} s "
                             "(a unit mistake, or a session resumed days later)")
        # an engine generates at least one token (the end of its turn), so a call reported with
        # no completion tokens still decodes one
        turns.append(TurnSpec(t.appended_tokens, max(1, t.decode_tokens), tool, k == last))
    return TrajectorySpec(traj_id=run.traj_id, family=options.family, prompt_index=index, group_index=0, step=0,
                          turns=tuple(turns), seed=zlib.crc32(run.traj_id.encode()), start_s=start_s)


def _releases(runs: Sequence[RecordedRun], options: ImportOptions) -> list[float | None]:
    starts = [r.start_s for r in runs]
    if options.releases == "none" or any(s is None for s in starts):
        return [None] * len(runs)
    first = min(s for s in starts if s is not None)
    rel = [s - first for s in starts if s is not None]
    if max(rel) > MAX_START_S:
        if options.releases == "auto":
            return [None] * len(runs)
        raise TraceError(f"{runs[rel.index(max(rel))].where}: releases span {max(rel) / 86400:.0f} days, past "
                         f"{MAX_START_S / 86400:.0f}: unrelated clocks (use --releases none)")
    return list(rel)


def to_specs(runs: Sequence[RecordedRun], options: ImportOptions) -> list[TrajectorySpec]:
    """The runs as trajectories, in the order given; prompt_index follows that order."""
    if not runs:
        raise TraceError("no trajectories found")
    seen: dict[str, str] = {}
    for r in runs:
        if r.traj_id in seen:
            raise TraceError(f"{r.where}: trajectory id {r.traj_id!r} also at {seen[r.traj_id]}")
        seen[r.traj_id] = r.where
    return [_spec(r, i, options, s) for i, (r, s) in enumerate(zip(runs, _releases(runs, options)))]


# --- reading ------------------------------------------------------------------------------------

class Source:
    """One input file: gzip by its magic bytes (Dynamo writes .jsonl.gz), else plain UTF-8."""

    def __init__(self, path: Path, progress: Progress | None = None) -> None:
        self.path = path
        self.progress = progress

    def _open(self):
        try:
            with self.path.open("rb") as f:
                magic = f.read(2)
            if magic == b"\x1f\x8b":
                return gzip.open(self.path, "rt", encoding="utf-8")
            return self.path.open("r", encoding="utf-8")
        except OSError as exc:
            raise TraceError(f"{self.path}: cannot read: {exc.strerror or exc}") from None

    def lines(self) -> Iterator[tuple[int, Any]]:
        """(line number, parsed JSON) per non-blank line."""
        with self._open() as f:
            lineno = 0
            try:
                for lineno, raw in enumerate(f, start=1):
                    if self.progress is not None:
                        self.progress(len(raw))
                    if raw.strip():
                        yield lineno, _parse(raw, f"{self.path}:{lineno}")
            except (UnicodeDecodeError, EOFError, OSError) as exc:
                raise TraceError(f"{self.path}:{lineno + 1}: cannot read: {exc}") from None

    def document(self) -> Any:
        """The whole file as one JSON value."""
        with self._open() as f:
            try:
                text = f.read()
            except (UnicodeDecodeError, EOFError, OSError) as exc:
                raise TraceError(f"{self.path}: cannot read: {exc}") from None
        if self.progress is not None:
            self.progress(len(text))
        return _parse(text, str(self.path))


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: bad JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                         if "\n" in text.strip() else f"{where}: bad JSON: {exc.msg} at column {exc.colno}") from None


def dig(obj: Any, path: str) -> Any:
    """obj["a"]["b"] for "a.b"; None where any step is missing or not an object."""
    for key in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def need_obj(obj: Any, where: str, field: str = "") -> dict:
    if not isinstance(obj, dict):
        what = f"field '{field}': " if field else "bad record: "
        raise TraceError(f"{where}: {what}expected a JSON object, got {type(obj).__name__}")
    return obj


def need_int(obj: Any, path: str, where: str, *, minimum: int = 0, label: str | None = None) -> int:
    """obj's integer at `path`; errors name the field as `label` (its place in the record) when given."""
    value = dig(obj, path)
    path = label or path
    if value is None:
        raise TraceError(f"{where}: field '{path}': missing")
    # True is an int to Python; a count written as "12" or 12.5 is a producer bug worth naming
    if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, float) and value.is_integer()):
        raise TraceError(f"{where}: field '{path}': should be an integer, got {value!r}")
    if value < minimum:
        raise TraceError(f"{where}: field '{path}': should be >= {minimum}, got {value!r}")
    return int(value)


def need_num(obj: Any, path: str, where: str, *, label: str | None = None) -> float:
    value = dig(obj, path)
    path = label or path
    if value is None:
        raise TraceError(f"{where}: field '{path}': missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(f"{where}: field '{path}': should be a finite number, got {value!r}")
    return float(value)


def traj_id(value: Any, where: str, field: str) -> str:
    """Recorded ids are often ints; both become strings, anything else is an error."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise TraceError(f"{where}: field '{field}': should be a string or an integer id, got {value!r}")
    return str(value)
