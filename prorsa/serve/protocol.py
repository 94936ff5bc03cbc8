"""The OpenAI wire format, as much of it as the endpoint speaks.

    ChatRequest, CompletionRequest        the request bodies (pydantic); sampling (temperature, top_p,
                                          top_k, seed, stop) goes to the engines, checked as OpenAI
                                          bounds it; a completion's prompt may be token ids; what the
                                          endpoint cannot do (a forced tool call, a response format,
                                          penalties, best_of, ...) is refused by name, not ignored
    ChatRequest.ask() / CompletionRequest.ask() -> Ask   what the conversation needs of a request
    chat_response(answers, model, tokenizer, req, parser) the response bodies: a choice per answer,
    completion_response(answers, model, tokenizer, req)   `weight_version`, and with vLLM's
                                          `return_token_ids` the prompt's and each choice's token ids
                                          (the streamed form: serve/streaming.py)
    error_body(message, type, param, code)   OpenAI's error object

A reply that holds tool calls in the format of the pipeline's engines.vllm.tool_call_parser (vLLM's
parser of that name, serve/tool_calls.py; hermes by default, as the tiny model's template teaches)
comes back as `tool_calls`, the text outside the calls as `content`; the trajectory keeps the
model's tokens either way.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from prorsa.serve.conversations import Answer
from prorsa.serve.tool_calls import ReplyParser
from prorsa.serve.transcript import Ask


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


MAX_N = 16  # choices in one request: each is a whole turn on the engines
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs

# OpenAI and vLLM fields the endpoint does not honour, and the value that asks nothing of it: any
# other value is refused by name rather than dropped
_UNSUPPORTED = {"echo": False, "best_of": 1, "suffix": None, "logit_bias": None, "functions": None,
                "function_call": None, "prediction": None, "audio": None, "parallel_tool_calls": True,
                "min_tokens": 0, "prompt_logprobs": None}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None  # any name: the pipeline serves one model
    ignore_eos: bool = False  # vLLM's extension: exactly max_tokens (a replayed workload's lengths)
    user: str | None = None  # the session, unless the X-Session-Id header names one
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_N)  # n replies from the same context, each a branch (serve/episode.py)
    return_token_ids: bool = False  # vLLM's extension: the prompt's and each reply's token ids
    # sampling; None: the pipeline's `sampling:` (OpenAI's bounds; top_k is vLLM's extension)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=2)  # vLLM's extension
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _refused(self):
        for name, harmless in _UNSUPPORTED.items():
            given = (self.model_extra or {}).get(name, harmless)
            if given != harmless and given not in (None, {}, []):
                raise PydanticCustomError("unsupported", "{name} is not supported; leave it out",
                                          {"name": name, "loc": name})
        if self.stream_options is not None and not self.stream:
            raise PydanticCustomError("unsupported", "stream_options is only allowed with stream=true",
                                      {"loc": "stream_options"})
        return self

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
        given = {"top_logprobs": self.alternatives() or None,
                 "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed,
                 "stop": tuple(self.stop) if self.stop is not None else None, "min_p": self.min_p,
                 "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                 "repetition_penalty": self.repetition_penalty}
        return tuple((k, v) for k, v in given.items() if v is not None)

    def alternatives(self) -> int:
        """How many likeliest tokens to report beside each generated one (0: none)."""
        return 0

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    # "auto": the model may call one of `tools`; "none": the tools are not offered this turn
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # needs logprobs, as OpenAI's

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise PydanticCustomError("unsupported", "top_logprobs needs logprobs=true", {"loc": "top_logprobs"})
        return self

    def alternatives(self) -> int:
        return self.top_logprobs or 0

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
                   ignore_eos=self.ignore_eos, sampling=self.sampling(), n=self.n)


class CompletionRequest(_Request):
    # text, or token ids as vLLM takes them (an RL client's exact context); one prompt per request
    prompt: str | list[str] | list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]]
    max_tokens: int = Field(16, ge=1)  # OpenAI's default
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # the likeliest tokens reported per token

    def alternatives(self) -> int:
        return self.logprobs or 0

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("give one prompt (a conversation is one trajectory)")
            v = v[0]
        if not v:
            raise ValueError("the prompt is empty")
        return v

    def ask(self) -> Ask:
        ids = tuple(self.prompt) if isinstance(self.prompt, list) else None
        return Ask(prompt=None if ids else self.prompt, prompt_ids=ids, max_tokens=self.max_tokens,
                   ignore_eos=self.ignore_eos, sampling=self.sampling(), n=self.n)


class EndRequest(BaseModel):
    """POST /v1/sessions/{id}/end: the conversation is over, scored by the client (or not)."""

    model_config = ConfigDict(extra="forbid")

    reward: float | None = Field(None, allow_inf_nan=False)
    metadata: dict[str, Any] | None = None  # kept with the trajectory (trajectories.parquet `metadata`, JSON)


class UpdateWeightsRequest(BaseModel):
    """POST /v1/rl/update_weights, named as SGLang's update_weights_from_disk (slime, Dynamo's clients)."""

    model_config = ConfigDict(extra="forbid")

    model_path: str = Field(min_length=1)  # a model folder or a .safetensors file the engines can read
    weight_version: int | None = Field(None, ge=0)  # None: one past the served version


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(answers: list[Answer]) -> dict:
    """The prompt once (the n choices share it), every choice's tokens."""
    prompt, n = answers[0].prompt_tokens, sum(a.completion_tokens for a in answers)
    return {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}


def finish_reason(a: Answer, calls: list) -> str:
    return "tool_calls" if calls else "stop" if a.ended else "length"


def tool_calls(a: Answer, parser: ReplyParser, req: ChatRequest) -> tuple[list[dict], str | None]:
    content, calls = parser.split(a.text, req.tools or ())
    # ids of our own, not the parser's random ones: a trajectory's calls are named alike on every replay
    return [{"id": f"call-{a.traj_id}-{a.turn}-{i}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)], content


def token_texts(tokenizer: Any, ids: tuple[int, ...]) -> list[str]:
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def _top(tokenizer: Any, a: Answer, k: int, n: int) -> list[tuple[str, float]]:
    """Token k's n likeliest alternatives, as text (vLLM's also holds the sampled one past the n)."""
    alternatives = a.top_logprobs[k][:n] if k < len(a.top_logprobs) else ()
    return list(zip(token_texts(tokenizer, tuple(i for i, _ in alternatives)), (x for _, x in alternatives)))


def chat_logprobs(tokenizer: Any, a: Answer, n: int = 0) -> dict:
    return {"content": [{"token": t, "logprob": x, "bytes": list(t.encode()),
                         "top_logprobs": [{"token": u, "logprob": y, "bytes": list(u.encode())}
                                          for u, y in _top(tokenizer, a, k, n)]}
                        for k, (t, x) in enumerate(zip(token_texts(tokenizer, a.token_ids), a.logprobs))]}


def chat_response(answers: list[Answer], model: str, tokenizer: Any, req: ChatRequest, parser: ReplyParser) -> dict:
    choices = []
    for i, a in enumerate(answers):
        calls, content = tool_calls(a, parser, req)
        message = {"role": "assistant", "content": content} | ({"tool_calls": calls} if calls else {})
        lp = chat_logprobs(tokenizer, a, req.alternatives()) if req.logprobs else None
        choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish_reason(a, calls)}
                       | ({"token_ids": list(a.token_ids)} if req.return_token_ids else {}))
    first = answers[0]
    return ({"id": f"chatcmpl-{first.traj_id}-{first.turn}", "object": "chat.completion", "created": int(time.time()),
             "model": model, "choices": choices, "usage": usage(answers), "weight_version": first.weight_version}
            | ({"prompt_token_ids": list(first.prompt_ids)} if req.return_token_ids else {}))


def completion_logprobs(tokenizer: Any, a: Answer, n: int = 0) -> dict:
    out = {"tokens": token_texts(tokenizer, a.token_ids), "token_logprobs": list(a.logprobs)}
    if n:
        out["top_logprobs"] = [dict(_top(tokenizer, a, k, n)) for k in range(len(a.token_ids))]
    return out


def completion_response(answers: list[Answer], model: str, tokenizer: Any, req: CompletionRequest) -> dict:
    choices = [{"index": i, "text": a.text, "finish_reason": finish_reason(a, []),
                "logprobs": completion_logprobs(tokenizer, a, req.alternatives()) if req.logprobs is not None else None}
               | ({"prompt_token_ids": list(a.prompt_ids), "token_ids": list(a.token_ids)} if req.return_token_ids
                  else {})
               for i, a in enumerate(answers)]
    first = answers[0]
    return {"id": f"cmpl-{first.traj_id}-{first.turn}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage(answers), "weight_version": first.weight_version}
