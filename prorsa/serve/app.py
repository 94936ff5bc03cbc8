"""The HTTP side: an OpenAI-compatible FastAPI app over a Hub (serve/conversations.py).

    make_app(hub, model, tokenizer) -> FastAPI
        GET  /v1/models              the one model the pipeline serves
        POST /v1/chat/completions    messages (+ tools) -> one turn of the session's trajectory
        POST /v1/completions         a prompt -> one turn of the session's trajectory

Every error is OpenAI's error object: a body that is not JSON or breaks the schema 400
(invalid_request_error, `param` names the field), messages the chat template cannot write 400,
a conversation past the model's context 400 (context_length_exceeded), a server that is stopping
503, a turn whose engines failed 500.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from prorsa.serve.conversations import SESSION_HEADER, Closed, Hub, session_of
from prorsa.serve.episode import ContextFull
from prorsa.serve.protocol import ChatRequest, CompletionRequest, chat_response, completion_response, error_body
from prorsa.serve.transcript import BadAsk


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


def make_app(hub: Hub, model: str, tokenizer: Any) -> FastAPI:
    app = FastAPI(title="prorsa", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(RequestValidationError, _invalid)

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
