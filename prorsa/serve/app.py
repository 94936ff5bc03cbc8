"""The HTTP side: an OpenAI-compatible FastAPI app over a Hub (serve/conversations.py).

    make_app(hub, model, tokenizer, guards, rl, parser, max_context) -> FastAPI   guards: Guards, what it refuses
        GET  /health                 200 while the server takes requests (vLLM's probe)
        POST /v1/sessions/{id}/end   {"reward": r} optional: the session's conversation ends after
                                     the requests it sent, its trajectory saved with the reward
        GET  /v1/models              the one model the pipeline serves
        POST /v1/chat/completions    messages (+ tools) -> one turn of the session's trajectory
        POST /v1/completions         a prompt (text or token ids) -> one turn of the session's trajectory
        POST /v1/rl/pause            new turns wait; answered once the turns in flight have ended
        POST /v1/rl/resume           waiting turns go on
        POST /v1/rl/update_weights   {"model_path": folder or .safetensors file, "weight_version": v}
                                     optional: every engine loads it, turns held meanwhile; later
                                     turns (responses and saved turns) carry the new version
        GET  /v1/rl/weight_version   the version new turns run on, whether paused, the turns held

Both take `stream` (server-sent events, serve/streaming.py), `n` (n branches of the conversation,
serve/episode.py) and vLLM's `return_token_ids`; every response carries `weight_version`.

Every error is OpenAI's error object: a body that is not JSON or breaks the schema 400
(invalid_request_error, `param` names the field), messages the chat template cannot write 400,
a conversation past the model's context 400 (context_length_exceeded), a body past
`max_request_bytes` 413 before it is read, a missing or wrong key (when `api_key` is set; /health
stays open) 401, an unknown path 404, no reply within `request_timeout_s` 504, a server that is
stopping 503, a turn whose engines failed 500. The /v1/rl/ paths (serve/rl.py) want the key too;
a weight file that is not there 400, engines that fail to load it 500. A paused server's requests
wait (their request_timeout_s runs).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from prorsa.api.weights import WeightsError
from prorsa.serve.conversations import SESSION_HEADER, Closed, Hub, session_of
from prorsa.serve.episode import ContextFull
from prorsa.serve.protocol import (ChatRequest, CompletionRequest, EndRequest, UpdateWeightsRequest, chat_response,
                                   completion_response, error_body)
from prorsa.serve.rl import RlControl, RlError
from prorsa.serve.streaming import chat_events, completion_events
from prorsa.serve.tool_calls import DEFAULT, ReplyParser
from prorsa.serve.transcript import BadAsk


MAX_REQUEST_BYTES = 16 * 2**20  # ~4M tokens of text: far past any model's context
_HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")  # visible ASCII, inner spaces


def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return JSONResponse(error_body("the request body is not valid JSON"), status_code=400)
    if "json" not in request.headers.get("content-type", ""):  # curl -d's default form encoding
        return JSONResponse(error_body("the request body must be JSON, sent with Content-Type: application/json "
                                       f"(got {request.headers.get('content-type') or 'none'})"), status_code=400)
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or (first.get("ctx") or {}).get("loc")  # a whole-body check names its field itself
    msg = first.get("msg", "invalid request")
    if first.get("type") == "missing":
        msg = f"'{param}' is a required property"
    elif param:
        msg = f"{param}: {msg}"
    return JSONResponse(error_body(msg, param=param), status_code=400)


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}", kind), exc.status_code)


class _BodyLimit:
    """ASGI middleware: a request body past `limit` bytes is answered 413 without being read on
    (parsed, it would hold the event loop and the memory of every other conversation)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send)
        seen, over, started = 0, False, False

        async def counted():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # a body sent without its length: cut where it passes the limit
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def sending(message) -> None:
            nonlocal started
            if not over:
                started = True
                await send(message)

        await self.app(scope, counted, sending)
        if over and not started:
            await self._refuse(send)

    async def _refuse(self, send) -> None:
        body = json.dumps(error_body(f"the request body is over {self.limit} bytes (prorsa serve --max-request-mb)",
                                     code="request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _ApiKey:
    """ASGI middleware: with a key set, every path but /health wants `Authorization: Bearer <key>`
    (what the openai client sends as api_key); anything else is OpenAI's 401."""

    def __init__(self, app, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key):
            return await self.app(scope, receive, send)
        body = json.dumps(error_body("a missing or wrong API key: send Authorization: Bearer <key> "
                                     "(prorsa serve --api-key, PRORSA_API_KEY)", code="invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


@dataclass(frozen=True)
class Guards:
    """What the HTTP layer refuses before a request reaches a conversation (prorsa serve's options)."""

    max_request_bytes: int = MAX_REQUEST_BYTES  # a larger body: 413 before it is read
    api_key: str | None = None  # set: every path but /health wants it as a bearer token
    request_timeout_s: float | None = None  # a request not answered by then: 504


def make_app(hub: Hub, model: str, tokenizer: Any, guards: Guards = Guards(), rl: RlControl | None = None,
             parser: ReplyParser | None = None, max_context: int | None = None) -> FastAPI:
    """`rl`: the served run's RL gate (None: no /v1/rl/ paths); `parser`: how replies become
    tool_calls (serve/tool_calls.py; None: hermes); `max_context`: the engines' context in tokens,
    for a check of a request's length before it is tokenized."""
    app = FastAPI(title="prorsa", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(_BodyLimit, limit=guards.max_request_bytes)
    if guards.api_key:  # outermost: a stranger's request is refused before its body is read
        app.add_middleware(_ApiKey, key=guards.api_key)
    parser = parser or ReplyParser(DEFAULT, tokenizer)
    turn = _Turns(hub, model, tokenizer, guards.request_timeout_s, max_context)

    @app.get("/health")
    async def health() -> JSONResponse:
        if hub.closed:
            return JSONResponse(error_body("the server is stopping", "server_error", code="shutting_down"), 503)
        return JSONResponse({"status": "ok"})

    @app.post("/v1/sessions/{session}/end")
    async def end(session: str, body: EndRequest | None = None) -> JSONResponse:
        conv = hub.finish(session, *((body.reward, body.metadata) if body is not None else ()))
        if conv is None:
            return JSONResponse(error_body(f"session {session!r} has no open conversation", "not_found_error",
                                           param="session"), 404)
        return JSONResponse({"session": session, "trajectory": f"c{conv.index}", "ended": True,
                             "reward": conv.reward})

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "prorsa"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request, body: ChatRequest) -> Response:
        return await turn(request, body, partial(chat_response, parser=parser), partial(chat_events, parser=parser))

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        return await turn(request, body, completion_response, completion_events)

    if rl is not None:
        _rl_routes(app, rl)
    return app


class _Turns:
    """A chat or completion request as one turn of its session's conversation: refused when it
    cannot fit the model, else the hub's answer, as JSON or as server-sent events."""

    def __init__(self, hub: Hub, model: str, tokenizer: Any, timeout_s: float | None, max_context: int | None):
        self.hub, self.model, self.tokenizer = hub, model, tokenizer
        self.timeout_s, self.max_context = timeout_s, max_context
        self.vocab = len(tokenizer)
        # no token spells more characters than the vocabulary's longest: text past max_context times
        # that cannot fit, whatever it tokenizes to, and is refused before a tokenizer spends seconds on it
        self.max_chars = None if max_context is None else max_context * max(map(len, tokenizer.get_vocab()))

    async def __call__(self, request: Request, body: ChatRequest | CompletionRequest, respond, events) -> Response:
        session = session_of(request.headers.get(SESSION_HEADER), body.user, self.hub.fresh_session)
        # a `user` an HTTP header cannot carry (non-ASCII, control characters) is not echoed: the
        # client names its session in the body, and the server would fail writing the header
        headers = {SESSION_HEADER: session} if _HEADER_VALUE.fullmatch(session) else {}
        ask = body.ask()
        refused = self._refusal(ask)
        if refused is None:
            answers, refused = await self._answers(session, ask)
        if refused is not None:
            return JSONResponse(*refused, headers)
        if body.stream:
            return StreamingResponse(events(answers, self.model, self.tokenizer, body), media_type="text/event-stream",
                                     headers=headers)
        return JSONResponse(respond(answers, self.model, self.tokenizer, body), headers=headers)

    def _refusal(self, ask) -> tuple[dict, int] | None:
        """(error body, status) of a request no engine needs to see; None: it may go on."""
        if self.max_chars is not None and ask.chars() > self.max_chars:
            return error_body(f"the request holds {ask.chars()} characters, more than the model's "
                              f"{self.max_context} tokens of context can take",
                              param="messages" if ask.chat else "prompt", code="context_length_exceeded"), 400
        if ask.prompt_ids is not None and max(ask.prompt_ids) >= self.vocab:
            return error_body(f"prompt: token id {max(ask.prompt_ids)} is past the model's vocabulary "
                              f"({self.vocab} ids)", param="prompt"), 400
        return None

    async def _answers(self, session: str, ask) -> tuple[list | None, tuple[dict, int] | None]:
        """(the hub's answers, None), or (None, (error body, status)) of a turn that got none."""
        try:
            return await asyncio.wait_for(self.hub.ask(session, ask), self.timeout_s), None
        except asyncio.TimeoutError:
            return None, (error_body(f"no reply within {self.timeout_s:g} s (prorsa serve --request-timeout-s); "
                                     "the conversation ends with this turn", "timeout_error",
                                     code="request_timeout"), 504)
        except Closed as e:
            return None, (error_body(str(e), "server_error", code="shutting_down"), 503)
        except ContextFull as e:
            return None, (error_body(str(e), param="messages", code="context_length_exceeded"), 400)
        except BadAsk as e:
            return None, (error_body(str(e), param="messages"), 400)
        except RuntimeError as e:
            return None, (error_body(f"the turn failed: {e}", "server_error"), 500)


def _rl_routes(app: FastAPI, rl: RlControl) -> None:
    def state() -> dict:
        return {"weight_version": rl.weight_version, "paused": rl.paused, "waiting": rl.waiting}

    @app.post("/v1/rl/pause")
    async def pause() -> dict:
        await rl.pause()
        return state()

    @app.post("/v1/rl/resume")
    async def resume() -> dict:
        rl.resume()
        return state()

    @app.post("/v1/rl/update_weights")
    async def update_weights(body: UpdateWeightsRequest) -> JSONResponse:
        try:
            await rl.update(body.model_path, body.weight_version)
        except WeightsError as e:
            return JSONResponse(error_body(f"model_path: {e}", param="model_path"), 400)
        except RlError as e:
            return JSONResponse(error_body(str(e), "server_error", code="weights_not_loaded"), 500)
        return JSONResponse({"success": True, "message": f"loaded {body.model_path}"} | state())

    @app.get("/v1/rl/weight_version")
    async def weight_version() -> dict:
        return state()
