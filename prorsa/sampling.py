"""The one sampling record: how a turn's tokens are drawn, from the agent's request to the engine's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """How a turn's tokens are drawn (vLLM's sampling parameters): the pipeline's `sampling:`, or
    what a served request asks. Engines that write no tokens (the emulated one) ignore it."""

    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: every token
    min_p: float = 0.0  # tokens below min_p x the likeliest token's probability are left out
    presence_penalty: float = 0.0  # OpenAI's: against tokens already in the reply
    frequency_penalty: float = 0.0  # OpenAI's: by how often a token is in the reply
    repetition_penalty: float = 1.0  # vLLM's: against tokens in the prompt and the reply
    # not a draw setting but what the engine reports of it: the likeliest alternatives to each
    # generated token, with their logprobs (a served request's top_logprobs)
    top_logprobs: int = 0
    stop: tuple[str, ...] = ()  # strings that end the reply (not included in it)
    seed: int | None = None  # a served request's own; else each turn's (TurnRequest.seed)
