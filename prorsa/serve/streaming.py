"""A turn's answers as server-sent events in OpenAI's chunk format (`stream: true`).

    chat_events(answers, model, tokenizer, req, parser) -> Iterator[str]   chat.completion.chunk events
    completion_events(answers, model, tokenizer, req) -> Iterator[str]  text_completion events

Each choice: a chunk per generated token (its text, and its logprob and id when asked), its tool
calls as one delta each (id, name and whole arguments), a last chunk with the finish reason; then,
with `stream_options.include_usage`, a chunk with the usage and no choices; then `data: [DONE]`.
The turn runs as one task on the engines, so the events follow its end: the stream has the form
clients parse, not earlier tokens. The turn is recorded as a non-streamed one is; only the wire
form differs. Generators, not coroutines: Starlette runs them in a thread, off the event loop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from prorsa.serve.conversations import Answer
from prorsa.serve.protocol import (ChatRequest, CompletionRequest, chat_logprobs, completion_logprobs, finish_reason,
                                   tool_calls, usage)
from prorsa.serve.tool_calls import ReplyParser

DONE = "data: [DONE]\n\n"


def _event(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def text_pieces(tokenizer: Any, ids: tuple[int, ...], text: str) -> list[str]:
    """One piece of `text` per token id, joined exactly `text`. A token that ends inside a UTF-8
    character gives "" until one completes it; decoding restarts after every whole piece, so the
    work stays linear in the reply."""
    pieces, base = [], 0
    for k in range(len(ids)):
        cur = tokenizer.decode(list(ids[base:k + 1]), skip_special_tokens=False)
        if cur.endswith("\ufffd"):
            pieces.append("")
            continue
        pieces.append(cur)
        base = k + 1
    if "".join(pieces) != text:  # a tokenizer whose pieces do not join (a leading-space rule): all at once
        pieces = [text] + [""] * (len(ids) - 1) if ids else []
    return pieces


def _pieces(tokenizer: Any, a: Answer) -> list[str]:
    """A piece per generated id (an EOS that ended the reply adds ""); an engine that returns no ids
    (emulated): the whole text as one piece."""
    if not a.token_ids:
        return [a.text]
    n = len(a.token_ids) - 1 if a.ended else len(a.token_ids)
    return text_pieces(tokenizer, a.token_ids[:n], a.text) + [""] * (len(a.token_ids) - n)


def chat_events(answers: list[Answer], model: str, tokenizer: Any, req: ChatRequest,
                parser: ReplyParser) -> Iterator[str]:
    first = answers[0]
    head = {"id": f"chatcmpl-{first.traj_id}-{first.turn}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model, "weight_version": first.weight_version}
    extra_usage = {"usage": None} if req.include_usage else {}

    def chunk(index: int, delta: dict, finish: str | None = None, **more) -> str:
        return _event(head | extra_usage | {"choices": [{"index": index, "delta": delta, "logprobs": None,
                                                         "finish_reason": finish} | more]})

    for i, a in enumerate(answers):
        opening = {"prompt_token_ids": list(a.prompt_ids)} if req.return_token_ids and i == 0 else {}
        yield _event(head | extra_usage | opening | {"choices": [{"index": i, "delta": {"role": "assistant",
                                                                                          "content": ""},
                                                                 "logprobs": None, "finish_reason": None}]})
        calls, content = tool_calls(a, parser, req)
        lps = chat_logprobs(tokenizer, a, req.alternatives())["content"] if req.logprobs else None
        if calls:  # the calls are whole only at the end of the text: the tokens in one chunk, then each call
            more = ({"logprobs": {"content": lps}} if lps is not None else {}) | (
                {"token_ids": list(a.token_ids)} if req.return_token_ids else {})
            yield chunk(i, {"content": content or ""}, **more)
            for j, call in enumerate(calls):
                yield chunk(i, {"tool_calls": [{"index": j} | call]})
        else:
            for k, piece in enumerate(_pieces(tokenizer, a)):
                more = ({"logprobs": {"content": lps[k:k + 1]}} if lps is not None else {}) | (
                    {"token_ids": [a.token_ids[k]]} if req.return_token_ids else {})
                yield chunk(i, {"content": piece}, **more)
        yield chunk(i, {}, finish_reason(a, calls))
    if req.include_usage:
        yield _event(head | {"choices": [], "usage": usage(answers)})
    yield DONE


def completion_events(answers: list[Answer], model: str, tokenizer: Any, req: CompletionRequest) -> Iterator[str]:
    first = answers[0]
    head = {"id": f"cmpl-{first.traj_id}-{first.turn}", "object": "text_completion", "created": int(time.time()),
            "model": model, "weight_version": first.weight_version}
    extra_usage = {"usage": None} if req.include_usage else {}
    for i, a in enumerate(answers):
        lps = completion_logprobs(tokenizer, a, req.alternatives()) if req.logprobs is not None else None
        for k, piece in enumerate(_pieces(tokenizer, a)):
            choice = {"index": i, "text": piece, "finish_reason": None,
                      "logprobs": {key: v[k:k + 1] for key, v in lps.items()} if lps is not None else None}
            if req.return_token_ids:
                choice |= ({"prompt_token_ids": list(a.prompt_ids)} if k == 0 else {}) | {
                    "token_ids": list(a.token_ids[k:k + 1])}
            yield _event(head | extra_usage | {"choices": [choice]})
        yield _event(head | extra_usage | {"choices": [{"index": i, "text": "", "logprobs": None,
                                                        "finish_reason": finish_reason(a, [])}]})
    if req.include_usage:
        yield _event(head | {"choices": [], "usage": usage(answers)})
    yield DONE
