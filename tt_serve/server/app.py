"""The FastAPI app: /v1/completions, /v1/chat/completions, /v1/responses (OpenAI), /v1/messages
(Anthropic), /tokenize, /detokenize, /v1/models, /health, /metrics.

The app starts answering at once; the engine loads in a background thread and /health says 503
until it is ready. Every error leaves in the shape of the API that was called (OpenAI's
``{"error": {...}}``, or Anthropic's ``{"type": "error", ...}`` under /v1/messages); client input
never yields a 5xx other than a 503 (not ready, queue full; 529 on /v1/messages). The API key
(``Authorization: Bearer`` or ``x-api-key``) is checked by middleware, before the body is read. Routes are thin: each hands its validated body to its serving object
(``serving.py``). A client that disconnects (streaming or not) aborts its requests, which frees
their blocks, state slots and snapshot pins.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tt_serve.server.drain import Drain, DrainGate
from tt_serve.server.messages_api import ServingMessages
from tt_serve.server.messages_protocol import CountTokensRequest, MessagesRequest, shaped
from tt_serve.server.metrics import Metrics
from tt_serve.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
)
from tt_serve.server.responses_api import ServingResponses
from tt_serve.server.responses_protocol import ResponsesRequest
from tt_serve.server.serving import ServingChat, ServingCompletion
from tt_serve.server.state import ServerState
from tt_serve.server.tokenize_api import (
    DetokenizeRequest,
    TokenizeRequest,
    detokenize_body,
    tokenize_body,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 << 20

BodyT = TypeVar("BodyT", bound=BaseModel)


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
                await _send_json(send, 413, _too_large(self.limit), scope)
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
            await _send_json(send, 413, _too_large(self.limit), scope)


class _TooLarge(Exception):
    pass


def _too_large(limit: int) -> dict[str, Any]:
    return error_body(
        f"request body exceeds {limit} bytes", "invalid_request_error", None, "request_too_large"
    )


async def _send_json(
    send: Send, status: int, body: dict[str, Any], scope: Scope | None = None
) -> None:
    if scope is not None:
        status, body = shaped(scope["path"], status, body)
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


class _Auth:
    """401 for /v1 requests without the server's API key (``Authorization: Bearer KEY``, or
    Anthropic's ``x-api-key: KEY``), before the body is read."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = self.state.api_key
        if scope["type"] == "http" and key is not None and scope["path"].startswith("/v1/"):
            headers = dict(scope["headers"])
            bearer = headers.get(b"authorization", b"")
            x_key = headers.get(b"x-api-key", b"")
            ok = hmac.compare_digest(bearer, f"Bearer {key}".encode())
            if not ok and x_key:
                ok = hmac.compare_digest(x_key, key.encode())
            if not ok:
                body = error_body(
                    "missing or invalid API key", "authentication_error", None, "invalid_api_key"
                )
                await _send_json(send, 401, body, scope)
                return
        await self.app(scope, receive, send)


# -- routes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Services:
    state: ServerState
    metrics: Metrics
    completions: ServingCompletion
    chat: ServingChat
    responses: ServingResponses
    messages: ServingMessages
    drain: Drain


def _services(request: Request) -> _Services:
    services: _Services = request.app.state.services
    return services


def _counted(request: Request, api: str) -> _Services:
    """The services, the request counted under its API."""
    services = _services(request)
    services.metrics.api_requests.labels(api=api).inc()
    return services


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def with_cancellation(
    handler: Callable[[BodyT, Request], Awaitable[Response]],
) -> Callable[[BodyT, Request], Awaitable[Response]]:
    """Run a handler until it returns or its client hangs up. A hang-up cancels the handler,
    which closes its output stream and so aborts its engine requests (as vLLM's decorator)."""

    @functools.wraps(handler)
    async def wrapper(body: BodyT, request: Request) -> Response:
        work = asyncio.ensure_future(handler(body, request))
        hangup = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((work, hangup), return_when=asyncio.FIRST_COMPLETED)
        finally:
            hangup.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if work.cancelled():
            return Response(status_code=499)  # nobody is listening any more
        return work.result()

    return wrapper


router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    services = _services(request)
    state = services.state
    if services.drain.draining:  # a router's health check takes this worker out of rotation
        return JSONResponse({"status": "draining", "detail": None}, status_code=503)
    if state.ready:
        return JSONResponse({"status": "ok"})
    status = "error" if state.load_error else "loading"
    return JSONResponse({"status": status, "detail": state.load_error}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = _services(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    state = _services(request).state
    card = {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "tt-serve",
        "max_model_len": state.max_model_len,
    }
    return JSONResponse({"object": "list", "data": [card]})


# What a router asks a worker besides /health (sglang-router 0.3.2 probes these names at
# registration and for its power_of_two policy; docs/routing.md). Field names follow SGLang's.
@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request) -> JSONResponse:
    state = _services(request).state
    return JSONResponse(
        {
            "model_path": state.model_name,
            "tokenizer_path": state.model_name,
            "served_model_name": state.model_name,
            "is_generation": True,
            "max_model_len": state.max_model_len,
        }
    )


@router.get("/get_server_info")
@router.get("/server_info")
async def server_info(request: Request) -> JSONResponse:
    services = _services(request)
    state = services.state
    return JSONResponse(
        {
            "model_path": state.model_name,
            "served_model_name": state.model_name,
            "max_model_len": state.max_model_len,
            "ready": state.ready,
            "draining": services.drain.draining,
            "version": "tt-serve 0.1.0",
        }
    )


@router.get("/get_load")
async def load(request: Request) -> JSONResponse:
    """Requests in flight and queued, the load a router's power_of_two policy compares."""
    services = _services(request)
    engine = services.state.engine
    gauges = engine.gauges if engine is not None else None
    running = gauges.num_running if gauges is not None else 0
    waiting = engine.num_queued if engine is not None else 0
    return JSONResponse({"load": running + waiting, "num_running": running, "num_waiting": waiting})


@router.post("/v1/completions", response_model=None)
@with_cancellation
async def completions(body: CompletionRequest, request: Request) -> Response:
    return await _counted(request, "completions").completions.create(body)


@router.post("/v1/chat/completions", response_model=None)
@with_cancellation
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    return await _counted(request, "chat").chat.create(body)


@router.post("/v1/responses", response_model=None)
@with_cancellation
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    return await _counted(request, "responses").responses.create(body)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Response:
    return _services(request).responses.get(response_id)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    return await _services(request).responses.delete(response_id)


@router.post("/v1/messages", response_model=None)
@with_cancellation
async def create_message(body: MessagesRequest, request: Request) -> Response:
    return await _counted(request, "messages").messages.create(body)


@router.post("/v1/messages/count_tokens", response_model=None)
async def count_message_tokens(body: CountTokensRequest, request: Request) -> Response:
    return await _counted(request, "count_tokens").messages.count_tokens(body)


@router.post("/tokenize", response_model=None)
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    return tokenize_body(_counted(request, "tokenize").chat, body)


@router.post("/detokenize", response_model=None)
async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    return detokenize_body(_counted(request, "detokenize").state, body)


# -- errors ------------------------------------------------------------------------------------


def _error(
    request: Request, status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    status, body = shaped(request.url.path, status, body)
    return JSONResponse(body, status_code=status, headers=headers)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return _error(request, exc.status, exc.body(), exc.headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errs = exc.errors()
    first = errs[0] if errs else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    msg = f"{'.'.join(loc) + ': ' if loc else ''}{first.get('msg', 'invalid request')}"
    return _error(request, 400, error_body(msg, "invalid_request_error", ".".join(loc) or None))


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return _error(request, exc.status_code, error_body(str(exc.detail), kind), exc.headers)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error", exc_info=exc)
    return _error(request, 500, error_body(f"internal error: {type(exc).__name__}", "server_error"))


# -- the app -----------------------------------------------------------------------------------


def create_app(
    state: ServerState,
    loader: Callable[[ServerState], None] | None = None,
    drain: Drain | None = None,
) -> FastAPI:
    """Build the app. ``loader`` (run in a thread at startup) fills ``state.engine``; the
    engine is shut down (loop stopped, backend closed) when the app stops. ``drain`` is the
    admission switch a SIGTERM flips (``drain.py``); ``app.state.services.drain`` holds it."""
    drain = drain if drain is not None else Drain()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loading = None
        if loader is not None:
            loading = threading.Thread(
                target=_load, args=(loader, state), name="tt-serve-load", daemon=True
            )
            loading.start()
        yield
        if loading is not None and loading.is_alive():
            # Stopped while loading: let the load finish, then shut its engine down. Exiting
            # under a load thread still inside torch/ttnn aborts the process (SIGABRT).
            log.info("waiting for the model load to finish before exiting")
            await asyncio.to_thread(loading.join)
        if state.engine is not None:
            state.engine.shutdown()

    app = FastAPI(title="tt-serve", version="0.1.0", lifespan=lifespan)
    metrics = Metrics(lambda: state.engine.gauges if state.engine is not None else None)
    chat = ServingChat(state, metrics)
    app.state.services = _Services(
        state,
        metrics,
        ServingCompletion(state, metrics),
        chat,
        ServingResponses(chat),
        ServingMessages(chat),
        drain,
    )
    app.include_router(router)
    app.exception_handler(APIError)(_api_error)
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(StarletteHTTPException)(_http_error)
    app.exception_handler(Exception)(_internal_error)
    app.add_middleware(_BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(DrainGate, drain=drain)
    app.add_middleware(_Auth, state=state)  # outermost: before the body is even read
    return app


def _load(loader: Callable[[ServerState], None], state: ServerState) -> None:
    try:
        loader(state)
    except Exception as exc:  # reported by /health, logged with the traceback
        log.exception("model load failed")
        state.load_error = f"{type(exc).__name__}: {exc}"


__all__ = ["ServerState", "create_app"]
