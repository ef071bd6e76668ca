"""Request plumbing between the endpoints and the async engine.

One HTTP request becomes one job per (prompt, choice). Jobs are validated (400) and checked
against the queue limit (503) before anything is queued; streams of several jobs are merged;
a client that goes away cancels every job of its request, which aborts them in the engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from tt_serve.engine.async_engine import AsyncEngine, QueueFullError
from tt_serve.sequence import RequestError, RequestOutput, SamplingParams
from tt_serve.server.metrics import Metrics
from tt_serve.server.protocol import APIError, new_id
from tt_serve.tokenizer import Tokenizer


@dataclass
class Job:
    request_id: str
    prompt_index: int
    choice: int
    prompt: list[int]
    params: SamplingParams


def encode_prompts(prompt: Any, tok: Tokenizer | None) -> list[list[int]]:
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


def make_jobs(
    body: Any,
    prompts: list[list[int]],
    max_tokens: int,
    logprobs: int | None,
    engine: AsyncEngine,
) -> list[Job]:
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
            jobs.append(Job(new_id("req"), i, c, p, params))
    return jobs


async def consume(
    engine: AsyncEngine,
    job: Job,
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


async def run_all(
    request: Request, engine: AsyncEngine, jobs: list[Job], metrics: Metrics
) -> list[RequestOutput]:
    """Run jobs concurrently; a client disconnect cancels (and so aborts) all of them."""
    tasks = [asyncio.ensure_future(consume(engine, j, metrics)) for j in jobs]
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


def sse(
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


async def merged(
    engine: AsyncEngine, jobs: list[Job], metrics: Metrics
) -> AsyncIterator[tuple[Job, RequestOutput]]:
    """Outputs of several concurrent jobs, as they come."""
    q: asyncio.Queue[tuple[Job, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def run(job: Job) -> None:
        async def put(out: RequestOutput) -> None:
            await q.put((job, out))

        try:
            await consume(engine, job, metrics, put)
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
