"""Find tool calls in generated text. Never raises: what cannot be read becomes a ParseError.

    ToolCallParser(formats=("hermes", "json"), ...)   which conventions to look for, in order
    ToolCallParser.parse(text) -> ParsedCalls(calls, errors, content)

Formats:
    hermes   <tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>  (Hermes,
             Qwen 2.5/3 chat templates); the body may also be a list of such objects or sit in a
             ```json fence; an open tag without its close tag is a partial call (an error)
    json     a bare JSON object (or list of them) anywhere in the text with a name and an
             arguments object, also in the OpenAI shape {"function": {"name", "arguments"}};
             text that starts like one ({"name": ...) but does not decode is an error

The first format that finds anything (a call or an error) wins, so text in the hermes convention
is not read a second time as bare JSON. `arguments` given as a JSON string (the OpenAI wire
form) is decoded. `content` is the text with every call removed: the model's own words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from prorsa.agent.tools.base import ToolCall

SNIPPET = 200  # characters of the offending text kept in a ParseError
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_CALL_START = re.compile(r'\{\s*"(?:name|function)"\s*:')
_JSON_START = re.compile(r"[\[{]")


@dataclass(frozen=True)
class ParseError:
    message: str  # what is wrong, for the model and the logs
    snippet: str  # the offending text, cut to SNIPPET characters


@dataclass(frozen=True)
class ParsedCalls:
    calls: tuple[ToolCall, ...]
    errors: tuple[ParseError, ...]
    content: str  # the text outside the calls, stripped


@dataclass(frozen=True)
class ToolCallParser:
    formats: tuple[str, ...] = ("hermes", "json")
    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"
    argument_keys: tuple[str, ...] = ("arguments", "parameters")
    max_calls: int = 8  # calls past this many are dropped with an error

    def __post_init__(self):
        unknown = set(self.formats) - {"hermes", "json"}
        if unknown or not self.formats:
            raise ValueError(f"tool-call formats must be among ['hermes', 'json'], got {list(self.formats)}")

    def parse(self, text: str) -> ParsedCalls:
        for fmt in self.formats:
            calls, errors, spans = (self._hermes if fmt == "hermes" else self._json)(text)
            if calls or errors:
                if len(calls) > self.max_calls:
                    errors.append(ParseError(f"{len(calls)} tool calls; only the first "
                                             f"{self.max_calls} are run", ""))
                    calls = calls[: self.max_calls]
                return ParsedCalls(tuple(calls), tuple(errors), _outside(text, spans))
        return ParsedCalls((), (), text.strip())

    def _hermes(self, text: str):
        calls, errors, spans = [], [], []
        pos = 0
        while (start := text.find(self.open_tag, pos)) >= 0:
            body_at = start + len(self.open_tag)
            end = text.find(self.close_tag, body_at)
            if end < 0:
                errors.append(ParseError(f"{self.open_tag} without {self.close_tag} (partial call)",
                                         text[start:start + SNIPPET]))
                spans.append((start, len(text)))
                break
            body = text[body_at:end].strip()
            fenced = _FENCE.match(body)
            try:
                obj = json.loads(fenced.group(1) if fenced else body)
            except json.JSONDecodeError as e:
                errors.append(ParseError(f"tool call is not valid JSON: {e.msg} at char {e.pos}",
                                         body[:SNIPPET]))
            else:
                self._collect(obj, body, calls, errors)
            pos = end + len(self.close_tag)
            spans.append((start, pos))
        return calls, errors, spans

    def _json(self, text: str):
        calls, errors, spans = [], [], []
        decoder = json.JSONDecoder()
        pos = 0
        while (m := _JSON_START.search(text, pos)) is not None:
            start = m.start()
            try:
                obj, end = decoder.raw_decode(text, start)
            except json.JSONDecodeError as e:
                if _CALL_START.match(text, start):
                    errors.append(ParseError(f"function-call JSON does not decode: {e.msg}",
                                             text[start:start + SNIPPET]))
                    spans.append((start, len(text)))
                    break
                pos = start + 1
                continue
            before = len(calls) + len(errors)
            if self._looks_like_call(obj):
                self._collect(obj, text[start:end], calls, errors)
            if len(calls) + len(errors) > before:
                spans.append((start, end))
            pos = end
        return calls, errors, spans

    def _collect(self, obj: Any, raw: str, calls: list, errors: list) -> None:
        for item in obj if isinstance(obj, list) else [obj]:
            call = self._to_call(item)
            if isinstance(call, ToolCall):
                calls.append(call)
            else:
                errors.append(ParseError(call, raw[:SNIPPET]))

    def _looks_like_call(self, obj: Any) -> bool:
        # Bare JSON in prose is a call only with a name and an arguments key (or the OpenAI shape).
        items = obj if isinstance(obj, list) and obj else [obj]
        return all(isinstance(i, dict) and (isinstance(i.get("function"), dict) or (
            "name" in i and any(k in i for k in self.argument_keys))) for i in items)

    def _to_call(self, obj: Any) -> ToolCall | str:
        if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
            obj = {**obj["function"], "id": obj.get("id", "")}
        if not isinstance(obj, dict):
            return f"a tool call must be a JSON object, got {type(obj).__name__}"
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return 'a tool call needs a non-empty string "name"'
        key = next((k for k in self.argument_keys if k in obj), None)
        args = obj.get(key, {}) if key else {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                return f"arguments of {name!r} are a string that is not JSON: {e.msg}"
        if not isinstance(args, dict):
            return f"arguments of {name!r} must be an object, got {type(args).__name__}"
        return ToolCall(name.strip(), args, str(obj.get("id") or ""))


def _outside(text: str, spans: list[tuple[int, int]]) -> str:
    out, pos = [], 0
    for start, end in sorted(spans):
        out.append(text[pos:start])
        pos = max(pos, end)
    out.append(text[pos:])
    return "".join(out).strip()
