"""Tool calls out of a reply's text, by vLLM's own parsers (the ones its --tool-call-parser names:
hermes, llama3_json, mistral, qwen3_coder, pythonic, ...), so a model speaks its own format.

    DEFAULT                              "hermes": the format the tiny model's template teaches
    ReplyParser(name, tokenizer)         one served run's parser
    ReplyParser.split(text, tools) -> (content, calls)   the text outside the calls (stripped, None
                                         when empty) and the calls; a reply without calls -> (text, ())
    Call(name, arguments)                a call; arguments as JSON text, as vLLM writes them

A streamed turn's reply is whole before its events are written (serve/streaming.py), so the same
one parse serves both forms. Some parsers look for special tokens in the tokenizer (llama3_json:
<|python_tag|>, mistral: [TOOL_CALLS]); a model without them cannot use that parser, as in vLLM.
Without vLLM installed (emulated engines only) hermes is prorsa's own Hermes parser.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prorsa.config.engines import check_tool_parser

DEFAULT = "hermes"


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # JSON text


class _Unreadable(logging.Filter):
    """vLLM's parsers log a reply they cannot read (a model's malformed call) with its traceback,
    and return it as text, as the client gets it: one debug line here."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info:
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.msg = f"{record.getMessage()} ({record.exc_info[1]!r}); the reply is text"
        record.args, record.exc_info, record.exc_text = (), None, None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def _quiet(module: str) -> None:
    logger = logging.getLogger(module)
    if not any(isinstance(f, _Unreadable) for f in logger.filters):
        logger.addFilter(_Unreadable())


class ReplyParser:
    """One parser object per tool list (a parser may read the tools' schemas, and building one
    reads the whole vocabulary), reused across requests: agents send the same tools every turn."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        """ValueError: a name vLLM does not register (engines.vllm.tool_call_parser checks it first)."""
        self.name, self.tokenizer = check_tool_parser(name), tokenizer
        self._lock = threading.Lock()  # non-streamed replies parse on the event loop, streamed ones in threads
        try:
            from vllm.tool_parsers import ToolParserManager
        except ImportError:  # hermes only (check_tool_parser): prorsa's own
            self._cls = None
        else:
            self._cls = ToolParserManager.get_tool_parser(name)
            _quiet(self._cls.__module__)
        self._for_tools = functools.lru_cache(maxsize=16)(self._build)
        if self._cls is not None:
            try:  # now, not at the first reply: a parser that cannot read this tokenizer stops the start
                self._for_tools("[]")
            except RuntimeError as e:  # vLLM's word for a special token the tokenizer lacks
                raise ValueError(f"tool-call parser {name!r} cannot work with this model's tokenizer ({e})") from e

    def _build(self, tools_json: str):
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools = json.loads(tools_json) or None
        try:
            request = ChatCompletionRequest(model="served", messages=[], tools=tools)
        except ValidationError:  # tools vLLM's schema refuses: parsed as if none were listed
            request = ChatCompletionRequest(model="served", messages=[])
        parser = self._cls(self.tokenizer, request.tools)
        return parser, request

    def split(self, text: str, tools: Sequence[dict] = ()) -> tuple[str | None, tuple[Call, ...]]:
        if self._cls is None:
            return _own_hermes(text)
        with self._lock:
            parser, request = self._for_tools(json.dumps(list(tools), sort_keys=True))
            try:
                found = parser.extract_tool_calls(text, request)
            except Exception:  # a parser is model-specific code: a reply it chokes on stays text
                return text, ()
        if not found.tools_called or not found.tool_calls:
            return text, ()
        calls = tuple(Call(c.function.name, c.function.arguments) for c in found.tool_calls)
        return (found.content or "").strip() or None, calls


def _own_hermes(text: str) -> tuple[str | None, tuple[Call, ...]]:
    from prorsa.agent.tools.parser import ToolCallParser

    parsed = ToolCallParser(formats=("hermes",)).parse(text)
    if not parsed.calls:
        return text, ()
    return parsed.content or None, tuple(Call(c.name, json.dumps(dict(c.arguments))) for c in parsed.calls)
