"""A served conversation as the model reads it: text in, token ids kept, the model's own tokens untouched.

    Ask                              one request: chat messages (with tools) or a completion prompt
    Transcript(tokenizer, parser)    one conversation's text so far (parser: serve/tool_calls.py's,
                                     reading the tool calls of the replies it echoes)
    Transcript.open(ask) -> str      the first request: the whole prompt text (chat template applied);
                                     BadAsk (here and in follow) when the template cannot write it
    Transcript.follow(ask, reply) -> str | None
                                     a later request: the text it appends after the model's last reply
                                     (the tool results, the next user turn, the cue for the next
                                     assistant turn); None when it does not continue this conversation
    Transcript.follow_ids(ask, context) -> list[int] | None   a token-id prompt: the ids past
                                     `context` (the conversation's ids so far); None when it does
                                     not start with them
    Transcript.echoes(ask) -> bool   the request's echoed assistant message is this transcript's
                                     last reply (picks the branch an n > 1 request's client went on with)
    Transcript.reply_text(ids) -> (text, ended)   the model's reply as the client gets it

Why text deltas and not re-tokenizing the whole chat: the model's tokens must stay what it
generated (their logprobs are what a trainer needs), and a BPE tokenizer need not write a decoded
reply back to the same ids. So a conversation's ids are the first prompt's, then each reply's
ids as generated, then the ids of the text the next request adds, tokenized alone. The text a
request adds is read off the chat template: the template's rendering of the new messages past the
echoed assistant reply, plus what the template writes after an assistant message's content (its
end-of-turn mark), less the model's EOS when it ended its reply with it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prorsa.serve.tool_calls import ReplyParser

_MARK = "\x00REPLY\x00"


class BadAsk(ValueError):
    """The chat template cannot write the request's messages."""


@dataclass(frozen=True)
class Ask:
    """One request, as the endpoint validated it."""

    messages: tuple[dict[str, Any], ...] = ()  # chat: the whole conversation so far, as the client sends it
    tools: tuple[dict[str, Any], ...] = ()  # chat: the tool schemas the template lists
    prompt: str | None = None  # completions: the whole text so far
    prompt_ids: tuple[int, ...] | None = None  # completions: the whole context so far as token ids
    max_tokens: int | None = None  # None: as many as the context leaves room for (capped by the server)
    ignore_eos: bool = False  # vLLM's extension: decode max_tokens whatever the model writes
    sampling: tuple[tuple[str, Any], ...] = ()  # the sampling fields the request sets (prorsa/sampling.py)
    n: int = 1  # replies drawn from the same context, each its own branch of the conversation

    @property
    def chat(self) -> bool:
        return self.prompt is None and self.prompt_ids is None

    def chars(self) -> int:
        """The text it holds, counted without a tokenizer (the messages' content, the prompt)."""
        return len(self.prompt or "") + sum(len(str(m.get("content") or "")) for m in self.messages)

    @property
    def kind(self) -> str:
        return "chat" if self.chat else "text" if self.prompt is not None else "ids"


@dataclass
class Transcript:
    tokenizer: Any
    parser: ReplyParser
    _last: Ask | None = None
    _reply: str = ""  # the last reply's text as the client got it
    _ended: bool = False  # the last reply ended with the model's EOS

    @property
    def opened(self) -> bool:
        """Whether a first request has set this conversation's prompt."""
        return self._last is not None

    @property
    def eos_text(self) -> str:
        return self.tokenizer.eos_token or ""

    def _render(self, messages: Sequence[dict], tools: Sequence[dict], cue: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(list(messages), tools=list(tools) or None, tokenize=False,
                                                      add_generation_prompt=cue)
        except Exception as e:  # a template is user code: whatever it raises is the request's fault
            raise BadAsk(f"the model's chat template cannot write these messages ({type(e).__name__}: {e})") from e

    def open(self, ask: Ask) -> str:
        if ask.kind == "ids":
            self._last = ask
            return self.tokenizer.decode(list(ask.prompt_ids), skip_special_tokens=False)
        text = self._render(ask.messages, ask.tools, cue=True) if ask.chat else ask.prompt
        self._last = ask
        return text

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def reply_text(self, ids: Sequence[int]) -> tuple[str, bool]:
        """Special tokens are kept: the client echoes them, and the next request's text then continues
        exactly what the model saw."""
        ids = list(ids)
        ended = bool(ids) and ids[-1] == self.tokenizer.eos_token_id
        return self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False), ended

    def replied(self, text: str, ended: bool) -> None:
        self._reply, self._ended = text, ended

    def follow_ids(self, ask: Ask, context: Sequence[int]) -> list[int] | None:
        last = self._last
        if last is None or last.kind != "ids" or ask.kind != "ids":
            return None
        ids, n = ask.prompt_ids, len(context)
        if len(ids) <= n or list(ids[:n]) != list(context):
            return None
        self._last = ask
        return list(ids[n:])

    def echoes(self, ask: Ask) -> bool:
        """Whether the assistant message after the last request's messages is the last reply as the
        client got it (content, and tool calls by name and arguments; call ids are the client's to keep)."""
        last = self._last
        if last is None or not ask.chat or not last.chat or len(ask.messages) <= len(last.messages):
            return False
        echoed = ask.messages[len(last.messages)]
        content, calls = self.parser.split(self._reply, last.tools)
        given = [((c.get("function") or {}).get("name"), _arguments((c.get("function") or {}).get("arguments")))
                 for c in echoed.get("tool_calls") or ()]
        return ((echoed.get("content") or None) == (content or None)
                and given == [(c.name, _arguments(c.arguments)) for c in calls])

    def follow(self, ask: Ask) -> str | None:
        last = self._last
        if last is None or ask.kind != last.kind or ask.kind == "ids":
            return None
        added = self._follow_chat(last, ask) if ask.chat else self._follow_prompt(last, ask)
        if added is not None:
            self._last = ask
        return added

    def _follow_prompt(self, last: Ask, ask: Ask) -> str | None:
        seen = last.prompt + self._reply
        return ask.prompt[len(seen):] if ask.prompt.startswith(seen) and len(ask.prompt) > len(seen) else None

    def _follow_chat(self, last: Ask, ask: Ask) -> str | None:
        n = len(last.messages)
        if (ask.tools != last.tools or len(ask.messages) < n + 2 or ask.messages[:n] != last.messages
                or ask.messages[n].get("role") != "assistant"):
            return None
        # what the template writes after a reply's content: the end-of-turn mark
        marked = self._render([*last.messages, {"role": "assistant", "content": _MARK}], ask.tools, cue=False)
        close = marked.partition(_MARK)[2]
        if self._ended and self.eos_text and close.startswith(self.eos_text):
            close = close[len(self.eos_text):]  # the model wrote it already
        upto = self._render(ask.messages[:n + 1], ask.tools, cue=False)
        full = self._render(ask.messages, ask.tools, cue=True)
        if not full.startswith(upto):
            return None
        return close + full[len(upto):]


def _arguments(given: Any) -> Any:
    if isinstance(given, str):
        try:
            return json.loads(given)
        except ValueError:
            return given
    return given
