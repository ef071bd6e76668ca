"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``: the OpenAI Responses API.

A body becomes one chat request (``responses_protocol.py``) served by ``ServingChat``'s prompt
path, and its output is read once into items (``turn.py``): a ``reasoning`` item, a ``message``
with one ``output_text`` part, and one ``function_call`` per call, in the model's order. Streamed,
each item's events close before the next item opens, and every event carries its
``sequence_number``.

``store`` (default true) keeps the response with its exact prompt and output ids
(``response_store.py``). ``previous_response_id`` then continues from those ids plus the new
items as the template renders a next turn (``continuation.py``): nothing the model saw is
re-rendered. When a response is stored, the server prefills its closed turn (prompt, output,
turn end) as a one-token request while the client runs its tools, so the next turn's cache hit
reaches the previous turn's end; a continuation that arrives before that prefill ends waits for
it rather than computing the same tokens again. Changed ``instructions``, ``tools`` or
``reasoning`` cannot continue exactly (they sit at the head of the prompt): such a turn renders
the stored conversation whole, as a stateless client's would be.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.responses import Response

from tt_serve.agents.tool_parser import new_call_id
from tt_serve.engine.async_engine import NewRequest, OutputStream, QueueFullError
from tt_serve.sequence import RequestError, RequestOutput, SamplingParams
from tt_serve.server.continuation import closed_turn
from tt_serve.server.jobs import submit
from tt_serve.server.protocol import APIError, ChatCompletionRequest, new_id, now
from tt_serve.server.response_store import ResponseStore, StoredResponse
from tt_serve.server.responses_protocol import (
    Namespaces,
    ResponsesRequest,
    call_ids,
    chat_tool_choice,
    chat_tools,
    dumps,
    reasoning_blob,
    response_format,
    to_messages,
    with_instructions,
)
from tt_serve.server.serving import EventStream, Prompts, ServingChat, jobs_for, sse_named
from tt_serve.server.turn import (
    Closed,
    Delta,
    Kind,
    Opened,
    Segment,
    TurnReader,
    read_whole,
    reasoning_tokens,
)

log = logging.getLogger(__name__)

_PREFIX = {Kind.REASONING: "rs", Kind.TEXT: "msg", Kind.CALL: "fc"}


@dataclass
class _Plan:
    """One request as the engine sees it, and what its stored entry will need."""

    chat: ChatCompletionRequest
    continuation: list[int] | None
    conversation: list[dict[str, Any]]  # the messages so far, without the instructions
    context: dict[str, Any]
    namespaces: Namespaces
    waits_for: str | None = None  # the stored response whose closed-turn prefill to await


class ResponseEncoder:
    """Items and events of one response. ``segment`` maps one ``turn.Segment`` to its stream
    events; ``response`` is the response object with the items closed so far."""

    def __init__(self, body: ResponsesRequest, rid: str, model: str, spaces: Namespaces) -> None:
        self.body, self.id, self.model, self.spaces = body, rid, model, spaces
        self.created = now()
        self.output: list[dict[str, Any]] = []
        self._seq = 0
        self._ids: dict[int, tuple[str, str]] = {}  # item index -> (item id, call id)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return ev

    def response(
        self,
        status: str,
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "model": self.model,
            "output": list(self.output),
            "parallel_tool_calls": b.parallel_tool_calls,
            "previous_response_id": b.previous_response_id,
            "reasoning": {"effort": (b.reasoning or {}).get("effort"), "summary": None},
            "store": b.store,
            "temperature": 1.0 if b.temperature is None else b.temperature,
            "text": b.text or {"format": {"type": "text"}},
            "tool_choice": b.tool_choice or "auto",
            "tools": b.tools or [],
            "top_p": 1.0 if b.top_p is None else b.top_p,
            "truncation": b.truncation or "disabled",
            "usage": usage,
            "user": b.user,
            "metadata": b.metadata or {},
        }

    def _item(self, index: int, kind: Kind, text: str, call: Any, status: str) -> dict[str, Any]:
        item_id, call_id = self._ids[index]
        if kind == Kind.REASONING:
            item: dict[str, Any] = {
                "type": "reasoning",
                "id": item_id,
                "summary": [],
                "content": [{"type": "reasoning_text", "text": text}] if text else [],
                "status": status,
            }
            if status == "completed":
                item["encrypted_content"] = reasoning_blob(text)
            return item
        if kind == Kind.TEXT:
            parts = [_text_part(text)] if text or status == "completed" else []
            return {
                "type": "message",
                "id": item_id,
                "status": status,
                "role": "assistant",
                "content": parts,
            }
        item = {
            "type": "function_call",
            "id": item_id,
            "call_id": call_id,
            "name": call.name,
            "arguments": text,
            "status": status,
        }
        if call.name in self.spaces:
            item["namespace"] = self.spaces[call.name]
        return item

    def segment(self, seg: Segment) -> list[dict[str, Any]]:
        i = seg.index
        if isinstance(seg, Opened):
            self._ids[i] = (_new_id(_PREFIX[seg.kind]), new_call_id())
            added = self.event(
                "response.output_item.added",
                output_index=i,
                item=self._item(i, seg.kind, "", seg.call, "in_progress"),
            )
            if seg.kind == Kind.CALL:
                return [added]
            part = _reasoning_part("") if seg.kind == Kind.REASONING else _text_part("")
            ids = {"item_id": self._ids[i][0], "output_index": i, "content_index": 0}
            return [added, self.event("response.content_part.added", **ids, part=part)]
        item_id = self._ids[i][0]
        where = {"item_id": item_id, "output_index": i}
        if isinstance(seg, Delta):
            if seg.kind == Kind.CALL:
                return [
                    self.event("response.function_call_arguments.delta", **where, delta=seg.text)
                ]
            name = "reasoning_text" if seg.kind == Kind.REASONING else "output_text"
            extra = _logprobs_field(seg.kind)
            return [
                self.event(
                    f"response.{name}.delta", **where, content_index=0, delta=seg.text, **extra
                )
            ]
        assert isinstance(seg, Closed)
        item = self._item(i, seg.kind, seg.text, seg.call, "completed")
        self.output.append(item)
        events: list[dict[str, Any]] = []
        if seg.kind == Kind.CALL:
            name = seg.call.name if seg.call else ""
            events.append(
                self.event(
                    "response.function_call_arguments.done", **where, name=name, arguments=seg.text
                )
            )
        else:
            kind = "reasoning_text" if seg.kind == Kind.REASONING else "output_text"
            extra = _logprobs_field(seg.kind)
            part = _reasoning_part(seg.text) if seg.kind == Kind.REASONING else _text_part(seg.text)
            where0 = {**where, "content_index": 0}
            events.append(self.event(f"response.{kind}.done", **where0, text=seg.text, **extra))
            events.append(self.event("response.content_part.done", **where0, part=part))
        events.append(self.event("response.output_item.done", output_index=i, item=item))
        return events


def _logprobs_field(kind: Kind) -> dict[str, Any]:
    return {} if kind == Kind.REASONING else {"logprobs": []}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


@dataclass
class ServingResponses:
    chat: ServingChat
    # Closed-turn prefills in flight, by the stored response they continue.
    _warming: dict[str, asyncio.Event] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def state(self) -> Any:
        return self.chat.state

    @property
    def store(self) -> ResponseStore:
        """The server's (the loader puts the configured one in place with the engine)."""
        store: ResponseStore = self.state.store
        return store

    async def create(self, body: ResponsesRequest) -> Response:
        body.refuse_unsupported()
        engine = self.chat._engine(body.model)
        plan = self._plan(body)
        prompts = self.chat.prompts(plan.chat, plan.continuation, fit_context=True)
        if plan.waits_for is not None and (ev := self._warming.get(plan.waits_for)) is not None:
            await ev.wait()
        jobs = jobs_for(plan.chat, prompts)
        outputs = submit(engine, jobs)
        enc = ResponseEncoder(body, _new_id("resp"), self.state.model_name, plan.namespaces)
        if body.stream:
            events = self._stream(body, plan, prompts, enc, outputs)
            return EventStream(sse_named(events), outputs)
        with outputs:
            reader = TurnReader(prompts.output)
            final = await read_whole(self.chat._observed(outputs), reader, enc.segment)
        resp = enc.response(_status(final), self._usage(prompts, final))
        await self._keep(body, plan, prompts, final, resp, enc)
        return JSONResponse(resp)

    async def _stream(
        self,
        body: ResponsesRequest,
        plan: _Plan,
        prompts: Prompts,
        enc: ResponseEncoder,
        outputs: OutputStream,
    ) -> AsyncIterator[dict[str, Any]]:
        yield enc.event("response.created", response=enc.response("in_progress"))
        yield enc.event("response.in_progress", response=enc.response("in_progress"))
        reader = TurnReader(prompts.output)
        final: RequestOutput | None = None
        try:
            async for out in self.chat._observed(outputs):
                for seg in reader.read(out):
                    for ev in enc.segment(seg):
                        yield ev
                final = out if out.finished else final
        except APIError as exc:
            error = {"code": exc.code or exc.type, "message": exc.message}
            yield enc.event("response.failed", response=enc.response("failed", error=error))
            return
        assert final is not None
        status = _status(final)
        resp = enc.response(status, self._usage(prompts, final))
        await self._keep(body, plan, prompts, final, resp, enc)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield enc.event(kind, response=resp)

    # -- the request -------------------------------------------------------------------------

    def _plan(self, body: ResponsesRequest) -> _Plan:
        tools, spaces = chat_tools(body.tools)
        thinking = body.thinking
        context = {"instructions": body.instructions, "tools": tools, "thinking": thinking}
        prev: StoredResponse | None = None
        if body.previous_response_id is not None:
            prev = self.store.get(body.previous_response_id)
            if prev is None:
                raise APIError(
                    404,
                    f"no stored response {body.previous_response_id!r} (never stored, deleted "
                    "or evicted)",
                    type="not_found_error",
                    param="previous_response_id",
                    code="response_not_found",
                )
        before = prev.messages if prev is not None else []
        new = to_messages(body.input, call_ids(before) if prev is not None else None)
        if not new:
            raise APIError(400, "input must hold at least one item", param="input")
        conversation = [*before, *new]
        continuation = None
        if prev is not None and dumps(prev.context) == dumps(context):
            cfg = self.chat._engine(body.model).engine.config
            tok = self.state.tokenizer
            continuation = closed_turn(prev.prompt_ids, prev.output_ids, tok, cfg.eos_token_ids)
        messages = new if continuation else with_instructions(body.instructions, conversation)
        fields: dict[str, Any] = {
            "model": body.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": chat_tool_choice(body.tool_choice),
            "parallel_tool_calls": body.parallel_tool_calls,
            "max_tokens": body.max_output_tokens or max(1, self.state.max_model_len),
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "seed": body.seed,
            "stop": body.stop,
            "response_format": response_format(body.text),
            "user": body.user,
            "ignore_eos": body.ignore_eos,
        }
        if thinking is not None:
            fields["chat_template_kwargs"] = {"enable_thinking": thinking}
        chat = _chat_request({k: v for k, v in fields.items() if v is not None})
        waits = body.previous_response_id if continuation is not None else None
        return _Plan(chat, continuation, conversation, context, spaces, waits)

    def _usage(self, prompts: Prompts, out: RequestOutput) -> dict[str, Any]:
        n_in, n_out = len(out.prompt_token_ids), len(out.token_ids)
        return {
            "input_tokens": n_in,
            "input_tokens_details": {
                "cached_tokens": out.cached_tokens,
                "cache_write_tokens": 0,
            },
            "output_tokens": n_out,
            "output_tokens_details": {
                "reasoning_tokens": reasoning_tokens(out, prompts.output, self.state.tokenizer)
            },
            "total_tokens": n_in + n_out,
        }

    # -- the store ---------------------------------------------------------------------------

    async def _keep(
        self,
        body: ResponsesRequest,
        plan: _Plan,
        prompts: Prompts,
        out: RequestOutput,
        resp: dict[str, Any],
        enc: ResponseEncoder,
    ) -> None:
        if not body.store or not self.store.enabled:
            return
        entry = StoredResponse(
            enc.id,
            resp,
            array("i", out.prompt_token_ids),
            array("i", out.token_ids),
            [*plan.conversation, _answer_message(enc.output)],
            plan.context,
        )
        if not await asyncio.to_thread(self.store.put, entry):
            log.info(
                "response %s not stored: %d bytes over the store's bound", enc.id, entry.nbytes
            )
            return
        self._prefill_closed_turn(entry)

    def _prefill_closed_turn(self, entry: StoredResponse) -> None:
        """Compute the closed turn's prompt once now, so the next turn hits its end."""
        engine = self.state.engine
        if engine is None or not engine.engine.config.prefix_caching:
            return
        cfg = engine.engine.config
        ids = closed_turn(
            entry.prompt_ids, entry.output_ids, self.state.tokenizer, cfg.eos_token_ids
        )
        if ids is None or len(ids) + 1 > cfg.max_model_len:
            return
        params = SamplingParams(max_tokens=1, temperature=0.0)
        try:
            outputs = engine.submit([NewRequest(new_id("turn-prefill"), ids, params)])
        except (QueueFullError, RequestError) as exc:  # the next turn computes it itself
            log.debug("closed-turn prefill of %s skipped: %s", entry.id, exc)
            return
        done = asyncio.Event()
        self._warming[entry.id] = done

        async def drain() -> None:
            try:
                with outputs:
                    async for _ in outputs:
                        pass
            finally:
                done.set()
                self._warming.pop(entry.id, None)

        task = asyncio.ensure_future(drain())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def get(self, response_id: str) -> JSONResponse:
        entry = self.store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return JSONResponse(entry.response)

    async def delete(self, response_id: str) -> JSONResponse:
        if not await asyncio.to_thread(self.store.delete, response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _new_id(prefix: str) -> str:
    """OpenAI's id shape: ``resp_``, ``msg_``, ``rs_``, ``fc_`` + hex."""
    return f"{prefix}_{uuid.uuid4().hex}"


def _not_found(response_id: str) -> APIError:
    return APIError(
        404,
        f"no stored response {response_id!r}",
        type="not_found_error",
        code="response_not_found",
    )


def _chat_request(fields: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise APIError(400, f"{loc}: {first.get('msg')}", param=loc or None) from exc


def _status(out: RequestOutput) -> str:
    return "incomplete" if out.finish_reason == "length" else "completed"


def _answer_message(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The response's output as the assistant message of the stored conversation."""
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    for item in items:
        if item["type"] == "reasoning":
            msg["reasoning_content"] = "".join(p["text"] for p in item["content"])
        elif item["type"] == "message":
            msg["content"] = "".join(p["text"] for p in item["content"])
        else:
            fn = {"name": item["name"], "arguments": item["arguments"]}
            call = {"id": item["call_id"], "type": "function", "function": fn}
            msg.setdefault("tool_calls", []).append(call)
    return msg
