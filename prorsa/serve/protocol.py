"""The OpenAI wire format, as much of it as the endpoint speaks.

    ChatRequest, CompletionRequest        the request bodies (pydantic); sampling (temperature, top_p,
                                          top_k, seed, stop) goes to the engines, checked as OpenAI
                                          bounds it; what the endpoint cannot do (n > 1, streaming, a
                                          forced tool call, a response format) is refused, not ignored
    ChatRequest.ask() / CompletionRequest.ask() -> Ask   what the conversation needs of a request
    chat_response(answer, model, tokenizer, logprobs)         the response bodies (the tokenizer
    completion_response(answer, model, tokenizer, logprobs)   writes each token of the logprobs)
    error_body(message, type, param, code)   OpenAI's error object

A reply that holds `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes format
the tiny model's template teaches) comes back as `tool_calls`, the text outside the calls as
`content`; the trajectory keeps the model's tokens either way.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prorsa.agent.tools.parser import ToolCallParser
from prorsa.serve.conversations import Answer
from prorsa.serve.transcript import Ask

_PARSER = ToolCallParser(formats=("hermes",))


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v):
        """Content parts: only text reaches a text model; joined as one string."""
        if isinstance(v, list):
            if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in v):
                raise ValueError("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported")
            return "".join(p["text"] for p in v)
        return v


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None  # any name: the pipeline serves one model
    ignore_eos: bool = False  # vLLM's extension: exactly max_tokens (a replayed workload's lengths)
    user: str | None = None  # the session, unless the X-Session-Id header names one
    stream: bool = False
    n: int = 1
    # sampling; None: the pipeline's `sampling:` (OpenAI's bounds; top_k is vLLM's extension)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else v
        if stops is not None and (len(stops) > 4 or not all(stops)):
            raise ValueError("give up to 4 non-empty stop strings")
        return stops

    @field_validator("response_format")
    @classmethod
    def _text_only(cls, v):
        if v is not None and v.get("type") != "text":
            raise ValueError(f"response_format {v.get('type')!r} is not supported; the reply is text")
        return v

    def sampling(self) -> tuple[tuple[str, Any], ...]:
        """The sampling fields this request sets, for the turn's engine (prorsa/sampling.py)."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed,
                 "stop": tuple(self.stop) if self.stop is not None else None}
        return tuple((k, v) for k, v in given.items() if v is not None)

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, v: bool) -> bool:
        if v:
            raise ValueError("streaming is not supported; send stream=false")
        return v

    @field_validator("n")
    @classmethod
    def _one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported: a conversation is one trajectory")
        return v


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    # "auto": the model may call one of `tools`; "none": the tools are not offered this turn
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False

    @field_validator("tool_choice")
    @classmethod
    def _no_forced_call(cls, v):
        if isinstance(v, dict) or v not in (None, "auto", "none"):
            shown = "a forced tool call" if isinstance(v, dict) else f"tool_choice {v!r}"
            raise ValueError(f"{shown} is not supported; give 'auto' or 'none'")
        return v

    def ask(self) -> Ask:
        messages = tuple(m.model_dump(exclude_none=True) for m in self.messages)
        tools = () if self.tool_choice == "none" else tuple(self.tools or ())
        return Ask(messages=messages, tools=tools, max_tokens=self.max_completion_tokens or self.max_tokens,
                   ignore_eos=self.ignore_eos, sampling=self.sampling())


class CompletionRequest(_Request):
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=1)  # OpenAI's default
    logprobs: int | None = Field(None, ge=0)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("give one prompt (a conversation is one trajectory)")
            v = v[0]
        if not v:
            raise ValueError("the prompt is empty")
        return v

    def ask(self) -> Ask:
        return Ask(prompt=self.prompt, max_tokens=self.max_tokens, ignore_eos=self.ignore_eos,
                   sampling=self.sampling())


class EndRequest(BaseModel):
    """POST /v1/sessions/{id}/end: the conversation is over, scored by the client (or not)."""

    model_config = ConfigDict(extra="forbid")

    reward: float | None = Field(None, allow_inf_nan=False)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _usage(a: Answer) -> dict:
    n = a.completion_tokens
    return {"prompt_tokens": a.prompt_tokens, "completion_tokens": n, "total_tokens": a.prompt_tokens + n}


def _finish(a: Answer) -> str:
    return "stop" if a.ended else "length"


def _tool_calls(a: Answer) -> tuple[list[dict], str | None]:
    parsed = _PARSER.parse(a.text)
    if not parsed.calls:
        return [], a.text
    calls = [{"id": c.call_id or f"call-{a.traj_id}-{a.turn}-{i}", "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}}
             for i, c in enumerate(parsed.calls)]
    return calls, parsed.content or None


def _token_text(tokenizer: Any, ids: tuple[int, ...]) -> list[str]:
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def chat_response(a: Answer, model: str, tokenizer: Any, logprobs: bool) -> dict:
    calls, content = _tool_calls(a)
    message = {"role": "assistant", "content": content} | ({"tool_calls": calls} if calls else {})
    lp = None
    if logprobs:
        lp = {"content": [{"token": t, "logprob": x, "bytes": list(t.encode()), "top_logprobs": []}
                          for t, x in zip(_token_text(tokenizer, a.token_ids), a.logprobs)]}
    return {"id": f"chatcmpl-{a.traj_id}-{a.turn}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message, "logprobs": lp,
                                         "finish_reason": "tool_calls" if calls else _finish(a)}],
            "usage": _usage(a)}


def completion_response(a: Answer, model: str, tokenizer: Any, logprobs: int | None) -> dict:
    lp = None
    if logprobs is not None:
        lp = {"tokens": _token_text(tokenizer, a.token_ids), "token_logprobs": list(a.logprobs)}
    return {"id": f"cmpl-{a.traj_id}-{a.turn}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "text": a.text, "logprobs": lp, "finish_reason": _finish(a)}],
            "usage": _usage(a)}
