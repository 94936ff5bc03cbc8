"""A schema-driven fuzz of the endpoint: schemathesis reads the app's own OpenAPI schema (FastAPI's,
from the request models) and sends what it generates, valid and not, over HTTP to the app served
by uvicorn on a real socket (tests/serve/served_app.py), with the hub and served driver on a
scripted runner. Every operation the schema has is fuzzed (a route added later too). Whatever the
request, the answer is never a server error: the scripted runner does not fail, so a 5xx can only
be the endpoint's own."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.serve.served_app import ServedApp
from tests.serve.test_serve_endpoint import Scripted, chat, serve, tok  # noqa: F401 (tok: a fixture)

EXAMPLES = 30  # per operation: a fast test


@pytest.fixture(scope="module")
def served(tok):  # noqa: F811
    with ServedApp(tok, Scripted(tok), max_tokens=16) as s:
        yield s


KNOWN = {("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/sessions/{session}/end"),
         ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")}


def test_no_generated_request_gets_a_server_error(served):
    schema = schemathesis.openapi.from_dict(served.app.openapi())
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in ops} >= KNOWN
    for op in ops:
        seen = fuzz(op, served.url)
        assert seen, f"{op.method.upper()} {op.path}: schemathesis generated no request"


def fuzz(op, url: str) -> list[int]:
    """EXAMPLES generated requests to one operation, each checked as it is answered -> their statuses."""
    seen: list[int] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy())
    def one(case) -> None:
        r = case.call(base_url=url, timeout=60)
        seen.append(r.status_code)
        assert r.status_code < 500, f"{case.method} {case.formatted_path} {case.body!r}: {r.status_code} {r.text}"
        if r.status_code >= 400:  # OpenAI's error object on every refusal
            assert set(r.json()["error"]) >= {"message", "type", "param", "code"}, r.text

    one()
    return seen


@pytest.mark.parametrize("user", ["Ā", "a\nb", " padded "])
def test_a_user_no_header_can_carry_names_the_session_in_the_body_alone(tok, user):  # noqa: F811
    """Found by the fuzz: the session was echoed as a header it cannot be, a 500 (here a crash)."""
    async def requests(client):
        first = await client.post("/v1/chat/completions", json=chat([{"role": "user", "content": "hi"}], user=user))
        reply = first.json()["choices"][0]["message"]
        again = await client.post("/v1/chat/completions", json=chat(
            [{"role": "user", "content": "hi"}, reply, {"role": "user", "content": "more"}], user=user))
        return first, again

    (first, again), done, _ = serve(tok, requests)
    assert first.status_code == again.status_code == 200 and "x-session-id" not in first.headers
    assert [(r.task_id, len(r.turns)) for r in done] == [(user, 2)]  # one conversation, by its user
