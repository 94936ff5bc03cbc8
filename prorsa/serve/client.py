"""A client's side of what `prorsa serve` adds to the OpenAI API, for an agent on the `openai`
package or on httpx (the OpenAI client has no call for these):

    end_session(base_url, session, reward=, metadata=, api_key=) -> dict
                      the conversation is over: saved within about a second, with its reward and
                      metadata (POST /v1/sessions/{session}/end)
    session_headers(session) -> dict
                      the header that names a conversation (extra_headers= on every request)

`base_url` is the OpenAI client's, ending in /v1.
"""

from __future__ import annotations

from typing import Any

import httpx

from prorsa.serve.conversations import SESSION_HEADER


def session_headers(session: str) -> dict[str, str]:
    return {SESSION_HEADER: session}


def end_session(base_url: str, session: str, reward: float | None = None, metadata: dict[str, Any] | None = None,
                api_key: str | None = None, timeout: float = 30.0) -> dict:
    """The server's answer ({"session", "trajectory", "ended", "reward"}); httpx.HTTPStatusError
    when it refuses (404: the session has no open conversation)."""
    body = {k: v for k, v in (("reward", reward), ("metadata", metadata)) if v is not None}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = httpx.post(f"{base_url.rstrip('/')}/sessions/{session}/end", json=body, headers=headers, timeout=timeout)
    r.raise_for_status()
    return r.json()
