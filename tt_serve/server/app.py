"""The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

The app starts answering at once; the engine loads in a background thread and /health says 503
until it is ready. Every error leaves as an OpenAI-style body; client input never yields a 500.
A client that disconnects (streaming or not) aborts its requests, which frees their blocks,
state slots and snapshot pins.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tt_serve.engine.async_engine import AsyncEngine, EngineSnapshot, QueueFullError
from tt_serve.sequence import RequestError, RequestOutput, SamplingParams
from tt_serve.server.metrics import Metrics
from tt_serve.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    new_id,
    now,
    usage,
)
from tt_serve.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_CHAT_MAX_TOKENS = 512
MAX_BODY_BYTES = 8 << 20


@dataclass
class ServerState:
    """What the endpoints need once loading is done."""

    model_name: str
    api_key: str | None = None
    engine: AsyncEngine | None = None
    tokenizer: Tokenizer | None = None
    max_model_len: int = 0
    load_error: str | None = None
    created: int = field(default_factory=now)

    @property
    def ready(self) -> bool:
        return self.engine is not None


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
        prompts = _encode_prompts(body.prompt, state.tokenizer)
        max_tokens = body.max_tokens if body.max_tokens is not None else 16
        jobs = _jobs(body, prompts, max_tokens, body.logprobs, engine)
        rid = new_id("cmpl")
        if body.stream:
            return _sse(
                _stream_completion(rid, body, prompts, jobs, state, metrics),
                request,
                [j.request_id for j in jobs],
                engine,
            )
        results = await _run_all(request, engine, jobs, metrics)
        return JSONResponse(_completion_body(rid, body, prompts, jobs, results, state))

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
        jobs = _jobs(body, [prompt], limit, k, engine)
        rid = new_id("chatcmpl")
        if body.stream:
            return _sse(
                _stream_chat(rid, body, prompt, jobs, state, metrics),
                request,
                [j.request_id for j in jobs],
                engine,
            )
        results = await _run_all(request, engine, jobs, metrics)
        return JSONResponse(_chat_body(rid, body, prompt, jobs, results, state))

    app.add_middleware(_BodyLimit, limit=MAX_BODY_BYTES)
    return app


# -- request plumbing --------------------------------------------------------------------------


@dataclass
class _Job:
    request_id: str
    prompt_index: int
    choice: int
    prompt: list[int]
    params: SamplingParams


def _encode_prompts(prompt: Any, tok: Tokenizer | None) -> list[list[int]]:
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        items = [prompt]
    else:
        items = list(prompt)
    if not items:
        raise APIError(400, "prompt must not be empty", param="prompt")
    out: list[list[int]] = []
    for p in items:
        if isinstance(p, str):
            if tok is None:
                raise APIError(400, "this model ships no tokenizer: send token ids", param="prompt")
            out.append(tok.encode(p))
        else:
            out.append([int(t) for t in p])
    return out


def _jobs(
    body: Any,
    prompts: list[list[int]],
    max_tokens: int,
    logprobs: int | None,
    engine: AsyncEngine,
) -> list[_Job]:
    waiting = engine.snapshot.num_waiting
    if waiting + len(prompts) * body.n > engine.max_waiting:
        raise APIError(
            503,
            f"the waiting queue is full ({engine.max_waiting} requests); retry later",
            type="server_unavailable",
            code="queue_full",
        )
    jobs = []
    for i, p in enumerate(prompts):
        for c in range(body.n):
            params = body.sampling_params(max_tokens, logprobs, seed_offset=c)
            try:
                engine.validate(p, params)
            except RequestError as exc:
                raise APIError(
                    400,
                    str(exc),
                    param="prompt" if "prompt" in str(exc) else None,
                    code="context_length_exceeded" if "context" in str(exc) else None,
                ) from exc
            jobs.append(_Job(new_id("req"), i, c, p, params))
    return jobs


async def _consume(
    engine: AsyncEngine,
    job: _Job,
    metrics: Metrics,
    on_output: Callable[[RequestOutput], Any] | None = None,
) -> RequestOutput:
    last: RequestOutput | None = None
    last_time: float | None = None
    try:
        async for out in engine.generate(job.request_id, job.prompt, job.params):
            t = time.monotonic()
            if out.new_token_ids:
                metrics.observe_token(last_time, t)
                last_time = t
            last = out
            if on_output is not None:
                await on_output(out)
    except QueueFullError as exc:
        raise APIError(503, str(exc), type="server_unavailable", code="queue_full") from exc
    except RequestError as exc:
        raise APIError(400, str(exc)) from exc
    assert last is not None
    metrics.observe_finished(last)
    if last.finish_reason == "error":
        raise APIError(500, f"generation failed: {last.error}", type="server_error")
    return last


async def _run_all(
    request: Request, engine: AsyncEngine, jobs: list[_Job], metrics: Metrics
) -> list[RequestOutput]:
    """Run jobs concurrently; a client disconnect cancels (and so aborts) all of them."""
    tasks = [asyncio.ensure_future(_consume(engine, j, metrics)) for j in jobs]
    gathered = asyncio.gather(*tasks)

    async def watch() -> None:
        while not gathered.done():
            if await request.is_disconnected():
                gathered.cancel()
                return
            await asyncio.sleep(0.1)

    watcher = asyncio.ensure_future(watch())
    try:
        return list(await gathered)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
    finally:
        watcher.cancel()


def _sse(
    gen: AsyncIterator[dict[str, Any]],
    request: Request,
    request_ids: list[str],
    engine: AsyncEngine,
) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in gen:
                yield f"data: {json.dumps(chunk)}\n\n".encode()
        except APIError as exc:
            yield f"data: {json.dumps(exc.body())}\n\n".encode()
        finally:
            # Runs on normal end, on error and when the client goes away (cancellation).
            await gen.aclose()  # type: ignore[attr-defined]
            for rid in request_ids:
                engine.abort(rid)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _merged(
    engine: AsyncEngine, jobs: list[_Job], metrics: Metrics
) -> AsyncIterator[tuple[_Job, RequestOutput]]:
    """Outputs of several concurrent jobs, as they come."""
    q: asyncio.Queue[tuple[_Job, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def run(job: _Job) -> None:
        async def put(out: RequestOutput) -> None:
            await q.put((job, out))

        try:
            await _consume(engine, job, metrics, put)
        except BaseException as exc:
            await q.put(exc)
            raise
        finally:
            await q.put(None)

    tasks = [asyncio.ensure_future(run(j)) for j in jobs]
    remaining = len(tasks)
    try:
        while remaining:
            item = await q.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- completions -------------------------------------------------------------------------------


def _token_text(tok: Tokenizer | None, t: int) -> str:
    return tok.decode([t], skip_special_tokens=False) if tok is not None else str(t)


def _completion_logprobs(
    out: RequestOutput, tok: Tokenizer | None, offset: int, start: int = 0
) -> dict[str, Any] | None:
    if out.logprobs is None:
        return None
    tokens, token_lps, tops, offsets = [], [], [], []
    pos = offset
    for t, d in zip(out.token_ids[start:], out.logprobs[start:], strict=False):
        s = _token_text(tok, t)
        tokens.append(s)
        token_lps.append(d.get(t))
        tops.append({_token_text(tok, k): v for k, v in d.items()})
        offsets.append(pos)
        pos += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": token_lps,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _out_text(out: RequestOutput) -> str:
    return out.text if out.text is not None else ""


def _completion_body(
    rid: str,
    body: CompletionRequest,
    prompts: list[list[int]],
    jobs: list[_Job],
    results: list[RequestOutput],
    state: ServerState,
) -> dict[str, Any]:
    choices = []
    tok = state.tokenizer
    for idx, (job, out) in enumerate(zip(jobs, results, strict=True)):
        prefix = ""
        if body.echo:
            prefix = tok.decode(job.prompt) if tok is not None else ""
        choices.append(
            {
                "index": idx,
                "text": prefix + _out_text(out),
                "logprobs": _completion_logprobs(out, tok, len(prefix)),
                "finish_reason": out.finish_reason,
            }
        )
    return {
        "id": rid,
        "object": "text_completion",
        "created": now(),
        "model": state.model_name,
        "choices": choices,
        "usage": _usage(prompts, jobs, results),
    }


def _usage(
    prompts: list[list[int]], jobs: list[_Job], results: list[RequestOutput]
) -> dict[str, Any]:
    cached: dict[int, int] = {}
    for job, out in zip(jobs, results, strict=True):
        cached.setdefault(job.prompt_index, out.cached_tokens)
    return usage(
        sum(len(p) for p in prompts), sum(len(o.token_ids) for o in results), sum(cached.values())
    )


async def _stream_completion(
    rid: str,
    body: CompletionRequest,
    prompts: list[list[int]],
    jobs: list[_Job],
    state: ServerState,
    metrics: Metrics,
) -> AsyncIterator[dict[str, Any]]:
    engine = state.engine
    assert engine is not None
    tok = state.tokenizer
    index = {j.request_id: i for i, j in enumerate(jobs)}
    finals: dict[str, RequestOutput] = {}
    created = now()
    if body.echo:
        for i, job in enumerate(jobs):
            text = tok.decode(job.prompt) if tok is not None else ""
            yield {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": state.model_name,
                "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": None}],
            }
    sent: dict[str, int] = {}
    async for job, out in _merged(engine, jobs, metrics):
        start = sent.get(job.request_id, 0)
        sent[job.request_id] = len(out.token_ids)
        if out.finished:
            finals[job.request_id] = out
        if not out.new_text and not out.new_token_ids and not out.finished:
            continue
        yield {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": state.model_name,
            "choices": [
                {
                    "index": index[job.request_id],
                    "text": out.new_text,
                    "logprobs": _completion_logprobs(out, tok, 0, start),
                    "finish_reason": out.finish_reason,
                }
            ],
        }
    if body.stream_options is not None and body.stream_options.include_usage:
        results = [finals[j.request_id] for j in jobs]
        yield {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": state.model_name,
            "choices": [],
            "usage": _usage(prompts, jobs, results),
        }


# -- chat --------------------------------------------------------------------------------------


def _chat_logprobs(
    out: RequestOutput, tok: Tokenizer | None, k: int, start: int = 0
) -> dict[str, Any] | None:
    if out.logprobs is None:
        return None
    content = []
    for t, d in zip(out.token_ids[start:], out.logprobs[start:], strict=False):
        s = _token_text(tok, t)
        tops = sorted(((v, kk) for kk, v in d.items()), reverse=True)[:k]
        content.append(
            {
                "token": s,
                "logprob": d.get(t),
                "bytes": list(s.encode()),
                "top_logprobs": [
                    {
                        "token": _token_text(tok, kk),
                        "logprob": v,
                        "bytes": list(_token_text(tok, kk).encode()),
                    }
                    for v, kk in tops
                ],
            }
        )
    return {"content": content}


def _chat_body(
    rid: str,
    body: ChatCompletionRequest,
    prompt: list[int],
    jobs: list[_Job],
    results: list[RequestOutput],
    state: ServerState,
) -> dict[str, Any]:
    k = body.top_logprobs or 0
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": _out_text(out)},
            "logprobs": _chat_logprobs(out, state.tokenizer, k),
            "finish_reason": out.finish_reason,
        }
        for i, out in enumerate(results)
    ]
    return {
        "id": rid,
        "object": "chat.completion",
        "created": now(),
        "model": state.model_name,
        "choices": choices,
        "usage": _usage([prompt], jobs, results),
    }


async def _stream_chat(
    rid: str,
    body: ChatCompletionRequest,
    prompt: list[int],
    jobs: list[_Job],
    state: ServerState,
    metrics: Metrics,
) -> AsyncIterator[dict[str, Any]]:
    engine = state.engine
    assert engine is not None
    created = now()
    index = {j.request_id: i for i, j in enumerate(jobs)}
    k = body.top_logprobs or 0

    def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": state.model_name,
            "choices": choices,
        }

    for i in range(len(jobs)):
        yield chunk(
            [
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )
    finals: dict[str, RequestOutput] = {}
    sent: dict[str, int] = {}
    async for job, out in _merged(engine, jobs, metrics):
        start = sent.get(job.request_id, 0)
        sent[job.request_id] = len(out.token_ids)
        if out.finished:
            finals[job.request_id] = out
        if not out.new_text and not out.new_token_ids and not out.finished:
            continue
        delta = {"content": out.new_text} if out.new_text else {}
        yield chunk(
            [
                {
                    "index": index[job.request_id],
                    "delta": delta,
                    "logprobs": _chat_logprobs(out, state.tokenizer, k, start)
                    if body.logprobs
                    else None,
                    "finish_reason": out.finish_reason,
                }
            ]
        )
    if body.stream_options is not None and body.stream_options.include_usage:
        results = [finals[j.request_id] for j in jobs]
        final = chunk([])
        final["usage"] = _usage([prompt], jobs, results)
        yield final


__all__ = ["EngineSnapshot", "ServerState", "create_app"]
