"""The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

The app starts answering at once; the engine loads in a background thread and /health says 503
until it is ready. Every error leaves as an OpenAI-style body; client input never yields a 500.
A client that disconnects (streaming or not) aborts its requests, which frees their blocks,
state slots and snapshot pins.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tt_serve.engine.async_engine import AsyncEngine
from tt_serve.server.jobs import encode_prompts, make_jobs, run_all, sse
from tt_serve.server.metrics import Metrics
from tt_serve.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    new_id,
)
from tt_serve.server.responses import chat_body, completion_body, stream_chat, stream_completion
from tt_serve.server.state import ServerState

log = logging.getLogger(__name__)

DEFAULT_CHAT_MAX_TOKENS = 512
MAX_BODY_BYTES = 8 << 20


class _BodyLimit:
    """413 for bodies over the limit, by Content-Length or while streaming in."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers", []):
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                await _send_json(send, 413, _too_large(self.limit))
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _send_json(send, 413, _too_large(self.limit))


class _TooLarge(Exception):
    pass


def _too_large(limit: int) -> dict[str, Any]:
    return error_body(
        f"request body exceeds {limit} bytes", "invalid_request_error", None, "request_too_large"
    )


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def create_app(state: ServerState, loader: Callable[[ServerState], None] | None = None) -> FastAPI:
    """Build the app. ``loader`` (run in a thread at startup) fills ``state.engine``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        thread = None
        if loader is not None:

            def load() -> None:
                try:
                    loader(state)
                except Exception as exc:  # reported by /health, logged with the traceback
                    log.exception("model load failed")
                    state.load_error = f"{type(exc).__name__}: {exc}"

            thread = threading.Thread(target=load, name="tt-serve-load", daemon=True)
            thread.start()
        yield
        if state.engine is not None:
            state.engine.shutdown()

    app = FastAPI(title="tt-serve", version="0.1.0", lifespan=lifespan)
    metrics = Metrics(lambda: state.engine.snapshot if state.engine is not None else None)
    app.state.tt = state
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        msg = f"{'.'.join(loc) + ': ' if loc else ''}{first.get('msg', 'invalid request')}"
        return JSONResponse(
            error_body(msg, "invalid_request_error", ".".join(loc) or None), status_code=400
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return JSONResponse(
            error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500
        )

    def authorize(request: Request) -> None:
        if state.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {state.api_key}":
            raise APIError(
                401,
                "missing or invalid API key",
                type="authentication_error",
                code="invalid_api_key",
            )

    def engine_or_503() -> AsyncEngine:
        if state.engine is None:
            why = state.load_error or "the model is still loading"
            raise APIError(503, f"server not ready: {why}", type="server_unavailable")
        return state.engine

    def check_model(name: str | None) -> None:
        if name and name != state.model_name:
            raise APIError(
                404,
                f"model {name!r} does not exist; this server serves {state.model_name!r}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.ready:
            return JSONResponse({"status": "ok"})
        status = "error" if state.load_error else "loading"
        return JSONResponse({"status": status, "detail": state.load_error}, status_code=503)

    @app.get("/metrics")
    async def prom() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        authorize(request)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": state.model_name,
                        "object": "model",
                        "created": state.created,
                        "owned_by": "tt-serve",
                        "max_model_len": state.max_model_len,
                    }
                ],
            }
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        authorize(request)
        check_model(body.model)
        engine = engine_or_503()
        if body.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if body.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        if body.best_of is not None and body.best_of != body.n:
            raise APIError(400, "best_of must equal n (no server-side reranking)", param="best_of")
        if body.echo and body.logprobs is not None:
            # Cached prompt positions are never computed, so prompt logprobs cannot exist.
            raise APIError(
                400,
                "echo with logprobs is not supported (prompt logprobs are not "
                "computed for cached prefixes)",
                param="echo",
            )
        prompts = encode_prompts(body.prompt, state.tokenizer)
        max_tokens = body.max_tokens if body.max_tokens is not None else 16
        jobs = make_jobs(body, prompts, max_tokens, body.logprobs, engine)
        rid = new_id("cmpl")
        if body.stream:
            return sse(
                stream_completion(rid, body, prompts, jobs, state, metrics),
                request,
                [j.request_id for j in jobs],
                engine,
            )
        results = await run_all(request, engine, jobs, metrics)
        return JSONResponse(completion_body(rid, body, prompts, jobs, results, state))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        authorize(request)
        check_model(body.model)
        engine = engine_or_503()
        if body.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        if body.tools:
            raise APIError(400, "tools are not supported", param="tools")
        if body.response_format and body.response_format.get("type", "text") != "text":
            raise APIError(
                400, "only response_format type 'text' is supported", param="response_format"
            )
        tok = state.tokenizer
        if tok is None:
            raise APIError(400, "this model ships no tokenizer, so chat is unavailable")
        try:
            text = tok.apply_chat_template(
                [m.model_dump(exclude_none=True) for m in body.messages],
                add_generation_prompt=body.add_generation_prompt,
            )
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from exc
        prompt = tok.encode(text)
        limit = body.max_completion_tokens or body.max_tokens
        if limit is None:
            limit = max(1, min(DEFAULT_CHAT_MAX_TOKENS, state.max_model_len - len(prompt)))
        k = (body.top_logprobs or 0) if body.logprobs else None
        jobs = make_jobs(body, [prompt], limit, k, engine)
        rid = new_id("chatcmpl")
        if body.stream:
            return sse(
                stream_chat(rid, body, prompt, jobs, state, metrics),
                request,
                [j.request_id for j in jobs],
                engine,
            )
        results = await run_all(request, engine, jobs, metrics)
        return JSONResponse(chat_body(rid, body, prompt, jobs, results, state))

    app.add_middleware(_BodyLimit, limit=MAX_BODY_BYTES)
    return app


__all__ = ["ServerState", "create_app"]
