"""The HTTP exchange with a vLLM 0.32 OpenAI server: request bodies in, typed replies out.

    completion_body(ids, ...)   a /v1/completions body: token ids as the prompt
    priority_ms(priority)       a request's admission key (float seconds) as vLLM's int priority
    parse_completion(resp)      a Reply from the response JSON
    gauge(text, name)           one gauge from the Prometheus text of /metrics

Where things are in a /v1/completions response (vLLM 0.32, flags as server.py sets them):

    choices[0].token_ids                      generated ids          (request: return_token_ids)
    choices[0].logprobs.token_logprobs        their logprobs         (request: logprobs=0)
    choices[0].logprobs.top_logprobs          per token {"token_id:N": logprob}, the N likeliest and
                                              the sampled one (request: logprobs=N,
                                              return_tokens_as_token_ids)
    usage.prompt_tokens_details.cached_tokens local prefix-cache hits (--enable-prompt-tokens-details;
                                              KV pulled over NIXL is not counted here)
    kv_transfer_params                        prefill leg: the handle a decode engine needs
                                              (remote_engine_id, remote_block_ids, remote_host,
                                              remote_port, remote_request_id, ...)
    metrics.queue_time_ms / time_to_first_token_ms / generation_time_ms
                                              per-request timings (--enable-per-request-metrics)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from prorsa.sampling import Sampling

SERVED_NAME = "prorsa"  # the model name every engine serves and every request names


@dataclass(frozen=True)
class Reply:
    """What one /v1/completions response says, timings in seconds."""

    token_ids: tuple[int, ...]  # generated
    logprobs: tuple[float, ...]  # of the generated tokens
    prompt_tokens: int
    cached_tokens: int  # served from this engine's prefix cache
    kv: dict[str, Any] | None  # kv_transfer_params
    finish_reason: str
    queue_s: float  # queued in the engine before first scheduled
    first_token_s: float  # scheduled to first token: prefill, or KV pull + last prompt token
    decode_s: float  # first to last token
    wall_s: float  # the HTTP round trip
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per token: (id, logprob), likeliest first


GREEDY = Sampling(temperature=0.0)  # measurements and tests: the same tokens every time


def completion_body(
    token_ids: Sequence[int] | None,
    max_tokens: int | None,
    sampling: Sampling = GREEDY,
    seed: int | None = None,
    ignore_eos: bool = True,
    logprobs: bool = True,
    priority: float = 0.0,
) -> dict[str, Any]:
    """`priority`: the request's admission key in seconds (lower sooner, engine/base.py), sent as
    vLLM's int `priority` in milliseconds, only when non-zero: a server must run the priority
    scheduling policy (server.py) for it to count, and 0 leaves a default (fcfs) server's body as
    it always was. `max_tokens` None: as many as the server's context leaves (vLLM's rule).
    `sampling`: top_p, top_k and stop are sent only where they differ from vLLM's defaults."""
    if token_ids is None:
        raise ValueError("vLLM engines need token ids (Engine.needs_token_ids is True)")
    body: dict[str, Any] = {
        "model": SERVED_NAME,
        "prompt": list(token_ids),  # a flat list of ints is one tokenised prompt
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "ignore_eos": ignore_eos,
        "return_token_ids": True,
    }
    if sampling.top_p != 1.0:
        body["top_p"] = sampling.top_p
    if sampling.top_k != -1:
        body["top_k"] = sampling.top_k
    for name, default in _SAMPLING_DEFAULTS.items():
        if (value := getattr(sampling, name)) != default:
            body[name] = value
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if logprobs:  # 0 alternatives: just the sampled token's logprob
        body["logprobs"] = sampling.top_logprobs
        if sampling.top_logprobs:  # alternatives named by id, not by a decoded piece of text
            body["return_tokens_as_token_ids"] = True
    if seed is not None:
        body["seed"] = seed
    if ms := priority_ms(priority):
        body["priority"] = ms
    return body


# vLLM's defaults of the sampling fields sent only when a pipeline or request sets another value
_SAMPLING_DEFAULTS = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


def priority_ms(priority: float) -> int:
    """vLLM's priority is an int, lower scheduled sooner, ties by arrival: ours in milliseconds."""
    return round(priority * 1000)


def parse_completion(resp: dict[str, Any], wall_s: float) -> Reply:
    choice = resp["choices"][0]
    usage = resp.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    lp = choice.get("logprobs") or {}
    metrics = resp.get("metrics") or {}

    def seconds(key: str) -> float:
        return (metrics.get(key) or 0.0) / 1000.0

    return Reply(
        token_ids=tuple(choice.get("token_ids") or ()),
        logprobs=tuple(float(x) for x in lp.get("token_logprobs") or () if x is not None),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        kv=resp.get("kv_transfer_params"),
        finish_reason=choice.get("finish_reason") or "length",
        queue_s=seconds("queue_time_ms"),
        first_token_s=seconds("time_to_first_token_ms") if metrics else wall_s,
        decode_s=seconds("generation_time_ms"),
        wall_s=wall_s,
        top_logprobs=_alternatives(lp.get("top_logprobs")),
    )


def _alternatives(per_token: list[dict[str, float] | None] | None) -> tuple:
    """vLLM's {"token_id:N": logprob} per token (the likeliest and the sampled one) as (id, logprob)
    pairs, likeliest first. Keys of decoded text (a request that asked for no alternatives: vLLM
    still lists the sampled token, by its text) give none."""
    if not per_token or any(not k.startswith(_BY_ID) for step in per_token for k in (step or {})):
        return ()
    return tuple(tuple(sorted(((int(k[len(_BY_ID):]), float(v)) for k, v in (step or {}).items()),
                              key=lambda kv: -kv[1])) for step in per_token)


_BY_ID = "token_id:"  # vLLM's name of a token with return_tokens_as_token_ids


def gauge(text: str, name: str) -> float:
    """A Prometheus gauge summed over its label sets (one engine core: one line)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))
