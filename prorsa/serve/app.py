"""The HTTP side: an OpenAI-compatible FastAPI app over a Hub (serve/conversations.py).

    make_app(hub, model, tokenizer, max_request_bytes) -> FastAPI
        GET  /health                 200 while the server takes requests (vLLM's probe)
        POST /v1/sessions/{id}/end   {"reward": r} optional: the session's conversation ends after
                                     the requests it sent, its trajectory saved with the reward
        GET  /v1/models              the one model the pipeline serves
        POST /v1/chat/completions    messages (+ tools) -> one turn of the session's trajectory
        POST /v1/completions         a prompt -> one turn of the session's trajectory

Every error is OpenAI's error object: a body that is not JSON or breaks the schema 400
(invalid_request_error, `param` names the field), messages the chat template cannot write 400,
a conversation past the model's context 400 (context_length_exceeded), a body past
`max_request_bytes` 413 before it is read, an unknown path 404, a server that is stopping 503, a
turn whose engines failed 500.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from prorsa.serve.conversations import SESSION_HEADER, Closed, Hub, session_of
from prorsa.serve.episode import ContextFull
from prorsa.serve.protocol import (ChatRequest, CompletionRequest, EndRequest, chat_response, completion_response,
                                   error_body)
from prorsa.serve.transcript import BadAsk


MAX_REQUEST_BYTES = 16 * 2**20  # ~4M tokens of text: far past any model's context


def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return JSONResponse(error_body("the request body is not valid JSON"), status_code=400)
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
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


def make_app(hub: Hub, model: str, tokenizer: Any, max_request_bytes: int = MAX_REQUEST_BYTES) -> FastAPI:
    app = FastAPI(title="prorsa", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(_BodyLimit, limit=max_request_bytes)

    @app.get("/health")
    async def health() -> JSONResponse:
        if hub.closed:
            return JSONResponse(error_body("the server is stopping", "server_error", code="shutting_down"), 503)
        return JSONResponse({"status": "ok"})

    async def turn(request: Request, body: ChatRequest | CompletionRequest, respond) -> JSONResponse:
        session = session_of(request.headers.get(SESSION_HEADER), body.user, hub.fresh_session)
        headers = {SESSION_HEADER: session}
        try:
            answer = await hub.ask(session, body.ask())
        except Closed as e:
            return JSONResponse(error_body(str(e), "server_error", code="shutting_down"), 503, headers)
        except ContextFull as e:
            return JSONResponse(error_body(str(e), param="messages", code="context_length_exceeded"), 400, headers)
        except BadAsk as e:
            return JSONResponse(error_body(str(e), param="messages"), 400, headers)
        except RuntimeError as e:
            return JSONResponse(error_body(f"the turn failed: {e}", "server_error"), 500, headers)
        return JSONResponse(respond(answer, model, tokenizer, body.logprobs), headers=headers)

    @app.post("/v1/sessions/{session}/end")
    async def end(session: str, body: EndRequest | None = None) -> JSONResponse:
        conv = hub.finish(session, body.reward if body is not None else None)
        if conv is None:
            return JSONResponse(error_body(f"session {session!r} has no open conversation", "not_found_error",
                                           param="session"), 404)
        return JSONResponse({"session": session, "trajectory": f"c{conv.index}", "ended": True,
                             "reward": conv.reward})

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "prorsa"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request, body: ChatRequest) -> JSONResponse:
        return await turn(request, body, chat_response)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> JSONResponse:
        return await turn(request, body, completion_response)

    return app
