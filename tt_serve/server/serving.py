"""One serving object per generation endpoint: completions and chat completions.

``OpenAIServing.create`` is the path of every generation request once the API key has been
checked (middleware) and the body validated (pydantic, strict): model name and readiness, the
endpoint's prompts, jobs submitted with their queue slots (400 or 503 here, before any header
is sent), then one JSON body or an SSE stream. Each endpoint only says how to build its prompts
and its choices.

``TT_SERVE_FAULT_LEAK_KB=N`` is a test hook (``bench/soak``'s RSS slope check must catch it):
every request that finishes here leaves N KiB behind in a module-level list, a leak of N KiB per
request. Read when the app is created; 0 or unset: none.
"""

from __future__ import annotations

import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, TypeVar

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tt_serve.agents.chat_output import OutputFormat
from tt_serve.agents.constraints import check_strict, tool_call_lark
from tt_serve.agents.grammar import GrammarError, compiler_for, json_schema_lark
from tt_serve.agents.reasoning import THINK_CLOSE, prompt_opens_reasoning
from tt_serve.agents.tool_parser import tool_schemas
from tt_serve.engine.async_engine import AsyncEngine, OutputStream
from tt_serve.sequence import FinishReason, RequestOutput
from tt_serve.server import responses as r
from tt_serve.server.continuation import next_turn_text
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
# Template variables the request sets itself (messages, add_generation_prompt, tools).
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "add_generation_prompt", "tools"})

BodyT = TypeVar("BodyT", bound=SamplingRequest)

FAULT_LEAK_ENV = "TT_SERVE_FAULT_LEAK_KB"
_leaked: list[bytes] = []  # the test hook's retained buffers; never freed
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompts:
    token_ids: list[list[int]]
    max_tokens: int
    logprobs: int | None  # top logprobs per token, None for none
    # SamplingParams fields the endpoint sets beyond the body's (grammar, special tokens).
    params: Mapping[str, Any] = field(default_factory=dict)
    output: OutputFormat = field(default_factory=OutputFormat)  # how chat text is parsed


class EventStream(StreamingResponse):
    """An SSE stream (``sse_data`` or ``sse_named`` bytes). However the response ends (finished,
    failed, client gone, or never started), the engine requests behind it are aborted."""

    def __init__(self, events: AsyncIterator[bytes], outputs: OutputStream) -> None:
        super().__init__(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self._outputs = outputs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._outputs.close()


async def sse_data(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """OpenAI's chat and completion streams: ``data:`` lines, then ``[DONE]``."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n".encode()
    except APIError as exc:  # headers are gone: the error travels in the stream
        yield f"data: {json.dumps(exc.body())}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def sse_named(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """The Responses and Messages streams: an ``event:`` line naming each event's ``type``."""
    async for ev in events:
        yield f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()


def jobs_for(body: SamplingRequest, prompts: Prompts) -> list[Job]:
    """The engine requests of a body whose prompts are built: its choices, with the params
    the endpoint set (grammar, special tokens)."""
    jobs = make_jobs(body, prompts.token_ids, prompts.max_tokens, prompts.logprobs)
    if not prompts.params:
        return jobs
    return [
        replace(j, request=replace(j.request, params=replace(j.request.params, **prompts.params)))
        for j in jobs
    ]


class OpenAIServing(ABC, Generic[BodyT]):
    id_prefix: ClassVar[str]
    body_object: ClassVar[str]
    chunk_object: ClassVar[str]

    def __init__(self, state: ServerState, metrics: Metrics) -> None:
        self.state = state
        self.metrics = metrics
        self.leak_bytes = int(os.environ.get(FAULT_LEAK_ENV) or 0) << 10
        if self.leak_bytes:
            log.warning(
                "%s: every finished %s request leaks %d KiB",
                FAULT_LEAK_ENV,
                self.id_prefix,
                self.leak_bytes >> 10,
            )

    async def create(self, body: BodyT) -> Response:
        engine = self._engine(body.model)
        prompts = self.prompts(body)
        jobs = jobs_for(body, prompts)
        outputs = submit(engine, jobs)
        rid, created, model = new_id(self.id_prefix), now(), self.state.model_name
        builders = [self.builder(body, prompts, i, j) for i, j in enumerate(jobs)]
        if body.stream:
            env = r.Envelope(rid, self.chunk_object, created, model)
            chunks = self._chunks(body, env, prompts, jobs, builders, outputs)
            return EventStream(sse_data(chunks), outputs)
        with outputs:
            finals = {o.request_id: o async for o in self._observed(outputs) if o.finished}
        results = [finals[j.request.request_id] for j in jobs]
        choices = [b.whole(o) for b, o in zip(builders, results, strict=True)]
        env = r.Envelope(rid, self.body_object, created, model)
        return JSONResponse(env.wrap(choices, _usage(prompts, jobs, results)))

    # -- what each endpoint says -------------------------------------------------------------

    @abstractmethod
    def prompts(self, body: BodyT) -> Prompts:
        """Refuse what the endpoint does not support (400), then tokenize."""

    @abstractmethod
    def builder(self, body: BodyT, prompts: Prompts, index: int, job: Job) -> r.ChoiceBuilder:
        """What turns choice ``index``'s outputs into a whole choice or stream chunks."""

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
            if out.finished and self.leak_bytes:
                _leaked.append(b"\x5a" * self.leak_bytes)  # filled: its pages are resident
            if out.finish_reason == FinishReason.ERROR:
                if out.bad_request:  # the request's schema, not the server, failed
                    raise APIError(400, f"constrained decoding failed: {out.error}")
                raise APIError(500, f"generation failed: {out.error}", type="server_error")
            yield out

    async def _chunks(
        self,
        body: BodyT,
        env: r.Envelope,
        prompts: Prompts,
        jobs: list[Job],
        builders: list[r.ChoiceBuilder],
        outputs: OutputStream,
    ) -> AsyncIterator[dict[str, Any]]:
        for choice in self.opening(body, jobs):
            yield env.wrap([choice])
        index = {j.request.request_id: i for i, j in enumerate(jobs)}
        finals: dict[str, RequestOutput] = {}
        async for out in self._observed(outputs):
            if out.finished:
                finals[out.request_id] = out
            for choice in builders[index[out.request_id]].deltas(out):
                yield env.wrap([choice])
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

    def builder(
        self, body: CompletionRequest, prompts: Prompts, index: int, job: Job
    ) -> r.ChoiceBuilder:
        return r.CompletionChoiceBuilder(
            index, self.state.tokenizer, self._echo(body, job), body.return_token_ids
        )

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

    def prompts(
        self,
        body: ChatCompletionRequest,
        continuation: list[int] | None = None,
        fit_context: bool = False,
    ) -> Prompts:
        """``continuation``: the exact ids of the conversation so far (a stored response's
        prompt and output, its turn closed); ``body.messages`` are then only the new messages,
        rendered as the template renders them after a finished assistant turn. ``fit_context``:
        a ``max_tokens`` past the context is cut to what is left (the Responses and Messages
        APIs' "at most"), instead of refused."""
        if body.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        tok = self.state.tokenizer
        if tok is None:
            raise APIError(400, "this model ships no tokenizer, so chat is unavailable")
        tools = body.tools or None
        named = _named_tool(body)
        if body.tool_choice is not None and tools is None:
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        if named is not None and named not in tool_schemas(tools):
            raise APIError(
                400, f"tool_choice names {named!r}, not one of the tools", param="tool_choice"
            )
        kwargs: dict[str, Any] = dict(body.chat_template_kwargs or {})
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
        if reserved:
            raise APIError(
                400,
                f"chat_template_kwargs may not set {reserved}: use the request's own fields",
                param="chat_template_kwargs",
            )
        if tools:
            kwargs["tools"] = tools
        try:
            if continuation is None:
                text = tok.apply_chat_template(
                    _history(body), add_generation_prompt=body.add_generation_prompt, **kwargs
                )
            else:
                text = next_turn_text(
                    tok, _history(body), add_generation_prompt=body.add_generation_prompt, **kwargs
                )
        except ValueError as exc:
            raise APIError(400, str(exc), param="messages") from exc
        prompt = tok.encode(text) if continuation is None else [*continuation, *tok.encode(text)]
        limit = body.max_completion_tokens or body.max_tokens
        room = self.state.max_model_len - len(prompt)
        if limit is None:
            limit = max(1, min(DEFAULT_CHAT_MAX_TOKENS, room))
        elif fit_context and room > 0:
            limit = min(limit, room)
        k = (body.top_logprobs or 0) if body.logprobs else None
        reasoning = body.add_generation_prompt and prompt_opens_reasoning(text)
        parse_tools = tools is not None and body.tool_choice != "none"
        fmt = OutputFormat(
            reasoning=reasoning,
            tools=tool_schemas(tools) if parse_tools else None,
            parallel_tool_calls=body.parallel_tool_calls and named is None,
            named_tool=named,
            tool_required=body.tool_choice == "required",
            keep_specials=tools is not None,
        )
        params: dict[str, Any] = {}
        if fmt.parses:  # <tool_call> and </think> are special tokens: keep them in the text
            params["skip_special_tokens"] = False
        source = self._constraint(body, tools, named, reasoning)
        if source is not None:
            params["grammar"] = self._compile(*source)
            if reasoning:
                params["grammar_after_token"] = tok.token_to_id(THINK_CLOSE)
        return Prompts([prompt], limit, k, params, fmt)

    def _constraint(
        self,
        body: ChatCompletionRequest,
        tools: list[dict[str, Any]] | None,
        named: str | None,
        reasoning: bool,
    ) -> tuple[str, str] | None:
        """(grammar text, the field it comes from), or None when the output is free."""
        rf = body.response_format
        kind = (rf or {}).get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            raise APIError(
                400,
                f"response_format type must be text, json_object or json_schema, got {kind!r}",
                param="response_format",
            )
        if tools is not None and (named is not None or body.tool_choice == "required"):
            try:
                lark = tool_call_lark(
                    tools, named, parallel=body.parallel_tool_calls, reasoning=reasoning
                )
            except GrammarError as exc:
                raise APIError(400, f"invalid tools: {exc}", param="tools") from exc
            return lark, "tools"
        if kind == "json_object":
            return json_schema_lark({"type": "object"}, reasoning=reasoning), "response_format"
        if kind == "json_schema":
            try:
                return self._schema_lark(rf, reasoning), "response_format"
            except GrammarError as exc:
                raise APIError(
                    400, f"invalid response_format schema: {exc}", param="response_format"
                ) from exc
        return None

    @staticmethod
    def _schema_lark(rf: dict[str, Any] | None, reasoning: bool) -> str:
        assert rf is not None
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise APIError(
                400,
                "response_format.json_schema must be an object with a 'schema' object",
                param="response_format",
            )
        schema = spec.get("schema", {})
        if spec.get("strict"):
            try:
                check_strict(schema, "response_format.json_schema.schema")
            except GrammarError as exc:
                raise APIError(400, str(exc), param="response_format") from exc
        return json_schema_lark(schema, reasoning=reasoning)

    def _compile(self, source: str, param: str) -> Any:
        assert self.state.engine is not None and self.state.tokenizer is not None
        cfg = self.state.engine.engine.config
        compiler = compiler_for(self.state.tokenizer, cfg.vocab_size, cfg.eos_token_ids)
        try:
            return compiler.lark(source)
        except GrammarError as exc:
            raise APIError(400, f"invalid {param} schema: {exc}", param=param) from exc

    def builder(
        self, body: ChatCompletionRequest, prompts: Prompts, index: int, job: Job
    ) -> r.ChoiceBuilder:
        tok, k = self.state.tokenizer, body.top_logprobs or 0
        return r.ChatChoiceBuilder(index, tok, k, body.return_token_ids, prompts.output)

    def opening(self, body: ChatCompletionRequest, jobs: list[Job]) -> list[r.Choice]:
        return [r.chat_role(i) for i in range(len(jobs))]


def _named_tool(body: ChatCompletionRequest) -> str | None:
    if isinstance(body.tool_choice, dict):
        return str(body.tool_choice["function"]["name"])
    return None


def _history(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as the template wants them: assistant ``tool_calls`` arguments as mappings
    (clients send JSON strings), empty ``tool_calls`` dropped, ``reasoning`` read as
    ``reasoning_content``, ``developer`` as ``system``."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(body.messages):
        msg = m.model_dump(exclude_none=True)
        if msg.get("role") == "developer":
            msg["role"] = "system"
        if msg.get("role") == "tool" and not isinstance(msg.get("tool_call_id"), str):
            raise APIError(
                400, f"messages[{i}].tool_call_id (a string) is required", param="messages"
            )
        if "reasoning" in msg and "reasoning_content" not in msg:
            msg["reasoning_content"] = msg.pop("reasoning")
        calls = msg.get("tool_calls")
        if not calls:
            msg.pop("tool_calls", None)
        else:
            msg["tool_calls"] = [
                _call_for_template(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(calls)
            ]
        out.append(msg)
    return out


def _call_for_template(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise APIError(400, f"{where} must have function.name", param="messages")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            raise APIError(
                400, f"{where}.function.arguments is not JSON: {exc}", param="messages"
            ) from exc
    if not isinstance(args, dict):
        raise APIError(400, f"{where}.function.arguments must be a JSON object", param="messages")
    return {**call, "function": {**fn, "arguments": args}}
