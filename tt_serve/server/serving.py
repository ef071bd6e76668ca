"""One serving object per generation endpoint: completions and chat completions.

``OpenAIServing.create`` is the path of every generation request once the API key has been
checked (middleware) and the body validated (pydantic, strict): model name and readiness, the
endpoint's prompts, jobs submitted with their queue slots (400 or 503 here, before any header
is sent), then one JSON body or an SSE stream. Each endpoint only says how to build its prompts
and its choices.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tt_serve.engine.async_engine import AsyncEngine, OutputStream
from tt_serve.sequence import FinishReason, RequestOutput
from tt_serve.server import responses as r
from tt_serve.server.jobs import Job, encode_prompts, make_jobs, submit
from tt_serve.server.metrics import Metrics
from tt_serve.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingRequest,
    new_id,
    now,
    unavailable,
)
from tt_serve.server.state import ServerState

DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 512

BodyT = TypeVar("BodyT", bound=SamplingRequest)


@dataclass(frozen=True)
class Prompts:
    token_ids: list[list[int]]
    max_tokens: int
    logprobs: int | None  # top logprobs per token, None for none


class EventStream(StreamingResponse):
    """SSE of JSON chunks, then ``[DONE]``. However the response ends (finished, failed, client
    gone, or never started), the engine requests behind it are aborted."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any]], outputs: OutputStream) -> None:
        super().__init__(
            _events(chunks), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self._outputs = outputs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._outputs.close()


async def _events(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n".encode()
    except APIError as exc:  # headers are gone: the error travels in the stream
        yield f"data: {json.dumps(exc.body())}\n\n".encode()
    yield b"data: [DONE]\n\n"


class OpenAIServing(ABC, Generic[BodyT]):
    id_prefix: ClassVar[str]
    body_object: ClassVar[str]
    chunk_object: ClassVar[str]

    def __init__(self, state: ServerState, metrics: Metrics) -> None:
        self.state = state
        self.metrics = metrics

    async def create(self, body: BodyT) -> Response:
        engine = self._engine(body.model)
        prompts = self.prompts(body)
        jobs = make_jobs(body, prompts.token_ids, prompts.max_tokens, prompts.logprobs)
        outputs = submit(engine, jobs)
        rid, created, model = new_id(self.id_prefix), now(), self.state.model_name
        if body.stream:
            env = r.Envelope(rid, self.chunk_object, created, model)
            return EventStream(self._chunks(body, env, prompts, jobs, outputs), outputs)
        with outputs:
            finals = {o.request_id: o async for o in self._observed(outputs) if o.finished}
        results = [finals[j.request.request_id] for j in jobs]
        choices = [
            self.choice(body, i, j, o) for i, (j, o) in enumerate(zip(jobs, results, strict=True))
        ]
        env = r.Envelope(rid, self.body_object, created, model)
        return JSONResponse(env.wrap(choices, _usage(prompts, jobs, results)))

    # -- what each endpoint says -------------------------------------------------------------

    @abstractmethod
    def prompts(self, body: BodyT) -> Prompts:
        """Refuse what the endpoint does not support (400), then tokenize."""

    @abstractmethod
    def choice(self, body: BodyT, index: int, job: Job, out: RequestOutput) -> r.Choice:
        """A whole choice from a finished output."""

    @abstractmethod
    def delta(self, body: BodyT, index: int, out: RequestOutput) -> r.Choice:
        """A stream chunk's choice from one output's new tokens and text."""

    def opening(self, body: BodyT, jobs: list[Job]) -> list[r.Choice]:
        """Chunks sent before any output, one choice each."""
        return []

    # -- shared ------------------------------------------------------------------------------

    def _engine(self, model: str | None) -> AsyncEngine:
        if model and model != self.state.model_name:
            raise APIError(
                404,
                f"model {model!r} does not exist; this server serves {self.state.model_name!r}",
                type="not_found_error",
                param="model",
                code="model_not_found",
            )
        if self.state.engine is None:
            why = self.state.load_error or "the model is still loading"
            raise unavailable(f"server not ready: {why}")
        return self.state.engine

    async def _observed(self, outputs: OutputStream) -> AsyncIterator[RequestOutput]:
        last_token_time: dict[str, float] = {}
        async for out in outputs:
            self.metrics.observe(out, last_token_time)
            if out.finish_reason == FinishReason.ERROR:
                raise APIError(500, f"generation failed: {out.error}", type="server_error")
            yield out

    async def _chunks(
        self,
        body: BodyT,
        env: r.Envelope,
        prompts: Prompts,
        jobs: list[Job],
        outputs: OutputStream,
    ) -> AsyncIterator[dict[str, Any]]:
        for choice in self.opening(body, jobs):
            yield env.wrap([choice])
        index = {j.request.request_id: i for i, j in enumerate(jobs)}
        finals: dict[str, RequestOutput] = {}
        async for out in self._observed(outputs):
            if out.finished:
                finals[out.request_id] = out
            yield env.wrap([self.delta(body, index[out.request_id], out)])
        if body.stream_options is not None and body.stream_options.include_usage:
            results = [finals[j.request.request_id] for j in jobs]
            yield env.wrap([], _usage(prompts, jobs, results))


def _usage(prompts: Prompts, jobs: list[Job], results: list[RequestOutput]) -> dict[str, Any]:
    return r.usage_of(prompts.token_ids, [j.prompt_index for j in jobs], results)


class ServingCompletion(OpenAIServing[CompletionRequest]):
    id_prefix = "cmpl"
    body_object = "text_completion"
    chunk_object = "text_completion"

    def prompts(self, body: CompletionRequest) -> Prompts:
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
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        return Prompts(encode_prompts(body.prompt, self.state.tokenizer), max_tokens, body.logprobs)

    def _echo(self, body: CompletionRequest, job: Job) -> str:
        tok = self.state.tokenizer
        return tok.decode(job.request.prompt) if body.echo and tok is not None else ""

    def choice(self, body: CompletionRequest, index: int, job: Job, out: RequestOutput) -> r.Choice:
        return r.completion_choice(
            index, out, self.state.tokenizer, self._echo(body, job), body.return_token_ids
        )

    def delta(self, body: CompletionRequest, index: int, out: RequestOutput) -> r.Choice:
        return r.completion_delta(index, out, self.state.tokenizer, body.return_token_ids)

    def opening(self, body: CompletionRequest, jobs: list[Job]) -> list[r.Choice]:
        if not body.echo:
            return []
        return [
            {"index": i, "text": self._echo(body, j), "logprobs": None, "finish_reason": None}
            for i, j in enumerate(jobs)
        ]


class ServingChat(OpenAIServing[ChatCompletionRequest]):
    id_prefix = "chatcmpl"
    body_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def prompts(self, body: ChatCompletionRequest) -> Prompts:
        if body.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        if body.tools:
            raise APIError(400, "tools are not supported", param="tools")
        if body.response_format and body.response_format.get("type", "text") != "text":
            raise APIError(
                400, "only response_format type 'text' is supported", param="response_format"
            )
        tok = self.state.tokenizer
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
            limit = max(1, min(DEFAULT_CHAT_MAX_TOKENS, self.state.max_model_len - len(prompt)))
        k = (body.top_logprobs or 0) if body.logprobs else None
        return Prompts([prompt], limit, k)

    def choice(
        self, body: ChatCompletionRequest, index: int, job: Job, out: RequestOutput
    ) -> r.Choice:
        tok, k = self.state.tokenizer, body.top_logprobs or 0
        return r.chat_choice(index, out, tok, k, body.return_token_ids)

    def delta(self, body: ChatCompletionRequest, index: int, out: RequestOutput) -> r.Choice:
        tok, k = self.state.tokenizer, body.top_logprobs or 0
        return r.chat_delta(index, out, tok, k, body.return_token_ids)

    def opening(self, body: ChatCompletionRequest, jobs: list[Job]) -> list[r.Choice]:
        return [r.chat_role(i) for i in range(len(jobs))]
