"""OpenAI response bodies and SSE chunk streams for completions and chat completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from tt_serve.engine.async_engine import AsyncEngine
from tt_serve.sequence import RequestOutput
from tt_serve.server.jobs import Job, merged
from tt_serve.server.metrics import Metrics
from tt_serve.server.protocol import ChatCompletionRequest, CompletionRequest, now, usage
from tt_serve.server.state import ServerState
from tt_serve.tokenizer import Tokenizer


async def _deltas(
    engine: AsyncEngine, jobs: list[Job], metrics: Metrics, finals: dict[str, RequestOutput]
) -> AsyncIterator[tuple[Job, RequestOutput, int]]:
    """Outputs worth a chunk (new text, new tokens or the end), with the index of the first
    token not sent before; finished outputs are also kept in ``finals`` for the usage chunk."""
    sent: dict[str, int] = {}
    async for job, out in merged(engine, jobs, metrics):
        start = sent.get(job.request_id, 0)
        sent[job.request_id] = len(out.token_ids)
        if out.finished:
            finals[job.request_id] = out
        if out.new_text or out.new_token_ids or out.finished:
            yield job, out, start


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


def completion_body(
    rid: str,
    body: CompletionRequest,
    prompts: list[list[int]],
    jobs: list[Job],
    results: list[RequestOutput],
    state: ServerState,
) -> dict[str, Any]:
    choices = []
    tok = state.tokenizer
    for idx, (job, out) in enumerate(zip(jobs, results, strict=True)):
        prefix = ""
        if body.echo:
            prefix = tok.decode(job.prompt) if tok is not None else ""
        choice: dict[str, Any] = {
            "index": idx,
            "text": prefix + _out_text(out),
            "logprobs": _completion_logprobs(out, tok, len(prefix)),
            "finish_reason": out.finish_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = list(out.token_ids)
            choice["prompt_token_ids"] = list(job.prompt)
        choices.append(choice)
    return {
        "id": rid,
        "object": "text_completion",
        "created": now(),
        "model": state.model_name,
        "choices": choices,
        "usage": _usage(prompts, jobs, results),
    }


def _usage(
    prompts: list[list[int]], jobs: list[Job], results: list[RequestOutput]
) -> dict[str, Any]:
    cached: dict[int, int] = {}
    for job, out in zip(jobs, results, strict=True):
        cached.setdefault(job.prompt_index, out.cached_tokens)
    return usage(
        sum(len(p) for p in prompts), sum(len(o.token_ids) for o in results), sum(cached.values())
    )


async def stream_completion(
    rid: str,
    body: CompletionRequest,
    prompts: list[list[int]],
    jobs: list[Job],
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
    async for job, out, start in _deltas(engine, jobs, metrics, finals):
        choice: dict[str, Any] = {
            "index": index[job.request_id],
            "text": out.new_text,
            "logprobs": _completion_logprobs(out, tok, 0, start),
            "finish_reason": out.finish_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = list(out.token_ids[start:])
        yield {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": state.model_name,
            "choices": [choice],
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


def chat_body(
    rid: str,
    body: ChatCompletionRequest,
    prompt: list[int],
    jobs: list[Job],
    results: list[RequestOutput],
    state: ServerState,
) -> dict[str, Any]:
    k = body.top_logprobs or 0
    choices: list[dict[str, Any]] = [
        {
            "index": i,
            "message": {"role": "assistant", "content": _out_text(out)},
            "logprobs": _chat_logprobs(out, state.tokenizer, k),
            "finish_reason": out.finish_reason,
        }
        for i, out in enumerate(results)
    ]
    if body.return_token_ids:
        for c, out in zip(choices, results, strict=True):
            c["token_ids"] = list(out.token_ids)
            c["prompt_token_ids"] = list(prompt)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": now(),
        "model": state.model_name,
        "choices": choices,
        "usage": _usage([prompt], jobs, results),
    }


async def stream_chat(
    rid: str,
    body: ChatCompletionRequest,
    prompt: list[int],
    jobs: list[Job],
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
    async for job, out, start in _deltas(engine, jobs, metrics, finals):
        delta = {"content": out.new_text} if out.new_text else {}
        choice: dict[str, Any] = {
            "index": index[job.request_id],
            "delta": delta,
            "logprobs": _chat_logprobs(out, state.tokenizer, k, start) if body.logprobs else None,
            "finish_reason": out.finish_reason,
        }
        if body.return_token_ids:
            choice["token_ids"] = list(out.token_ids[start:])
        yield chunk([choice])
    if body.stream_options is not None and body.stream_options.include_usage:
        results = [finals[j.request_id] for j in jobs]
        final = chunk([])
        final["usage"] = _usage([prompt], jobs, results)
        yield final
