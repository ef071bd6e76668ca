"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: the Anthropic Messages API.

The body becomes one chat request (``messages_protocol.py``) on ``ServingChat``'s prompt path,
and the output is read once into items (``turn.py``), here content blocks: ``thinking``
(with a ``signature``), ``text`` and ``tool_use``. Streamed: ``message_start`` (with the
prompt's usage, so after the first engine output, when the cache hit is known), ``ping``, each
block's ``content_block_start`` / ``_delta`` / ``_stop``, then ``message_delta`` (stop reason,
output tokens) and ``message_stop``; a failure mid-stream is an ``error`` event.

Usage follows Anthropic's split of the prompt: ``cache_read_input_tokens`` is the prefix-cache
hit, ``cache_creation_input_tokens`` the computed prompt tokens that the cache keeps (whole KV
blocks, when caching is on), ``input_tokens`` the rest; the three add up to the prompt.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.responses import Response

from tt_serve.engine.async_engine import OutputStream
from tt_serve.sequence import RequestOutput
from tt_serve.server.jobs import submit
from tt_serve.server.messages_protocol import (
    CountTokensRequest,
    MessagesRequest,
    chat_tool_choice,
    chat_tools,
    error_body,
    response_format,
    signature,
    to_messages,
)
from tt_serve.server.protocol import APIError, ChatCompletionRequest
from tt_serve.server.serving import EventStream, Prompts, ServingChat, jobs_for, sse_named
from tt_serve.server.turn import Closed, Delta, Kind, Opened, Segment, TurnReader, read_whole

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(24))


def _block(kind: Kind, text: str, call: Any, tool_id: str) -> dict[str, Any]:
    if kind == Kind.REASONING:
        return {"type": "thinking", "thinking": text, "signature": signature(text)}
    if kind == Kind.TEXT:
        return {"type": "text", "text": text}
    return {"type": "tool_use", "id": tool_id, "name": call.name, "input": call.arguments}


class MessageEncoder:
    """Blocks and stream events of one message."""

    def __init__(self, model: str, stops: list[str] | None, tokenizer: Any) -> None:
        self.id, self.model = _id("msg_"), model
        self.stops, self.tok = stops or [], tokenizer
        self.content: list[dict[str, Any]] = []
        self._tool_ids: dict[int, str] = {}

    def message(
        self, usage: dict[str, Any], stop: tuple[str | None, str | None] = (None, None)
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": list(self.content),
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
            "usage": usage,
        }

    def segment(self, seg: Segment) -> list[dict[str, Any]]:
        i = seg.index
        if isinstance(seg, Opened):
            self._tool_ids[i] = _id("toolu_")
            start: dict[str, Any]
            if seg.kind == Kind.REASONING:
                start = {"type": "thinking", "thinking": "", "signature": ""}
            elif seg.kind == Kind.TEXT:
                start = {"type": "text", "text": ""}
            else:
                assert seg.call is not None
                start = {
                    "type": "tool_use",
                    "id": self._tool_ids[i],
                    "name": seg.call.name,
                    "input": {},
                }
            return [{"type": "content_block_start", "index": i, "content_block": start}]
        if isinstance(seg, Delta):
            if seg.kind == Kind.REASONING:
                delta = {"type": "thinking_delta", "thinking": seg.text}
            elif seg.kind == Kind.TEXT:
                delta = {"type": "text_delta", "text": seg.text}
            else:
                delta = {"type": "input_json_delta", "partial_json": seg.text}
            return [{"type": "content_block_delta", "index": i, "delta": delta}]
        assert isinstance(seg, Closed)
        self.content.append(_block(seg.kind, seg.text, seg.call, self._tool_ids[i]))
        events: list[dict[str, Any]] = []
        if seg.kind == Kind.REASONING:
            sig = {"type": "signature_delta", "signature": signature(seg.text)}
            events.append({"type": "content_block_delta", "index": i, "delta": sig})
        events.append({"type": "content_block_stop", "index": i})
        return events

    def stop_reason(self, out: RequestOutput, called: bool) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of the finished output."""
        if out.finish_reason == "length":
            return "max_tokens", None
        if called:
            return "tool_use", None
        matched = self._stop_sequence(out)
        return ("stop_sequence", matched) if matched is not None else ("end_turn", None)

    def _stop_sequence(self, out: RequestOutput) -> str | None:
        """The stop sequence that ended the text: the one that follows it in the whole decoded
        output (the text returned stops before it)."""
        if not self.stops or self.tok is None:
            return None
        text = out.text or ""
        full = self.tok.decode(out.token_ids, skip_special_tokens=False)
        rest = full[len(text) :] if full.startswith(text) else ""
        return next((s for s in self.stops if rest.startswith(s)), None)


class ServingMessages:
    def __init__(self, chat: ServingChat) -> None:
        self.chat = chat

    @property
    def state(self) -> Any:
        return self.chat.state

    def _chat(self, body: CountTokensRequest, max_tokens: int) -> ChatCompletionRequest:
        choice, parallel = chat_tool_choice(body.tool_choice)
        fields: dict[str, Any] = {
            "model": body.model,
            "messages": to_messages(body),
            "tools": chat_tools(body.tools),
            "tool_choice": choice,
            "parallel_tool_calls": parallel,
            "max_tokens": max_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "stop": body.stop_sequences or None,
            "response_format": response_format(body.output_config),
            "ignore_eos": body.ignore_eos,
            "chat_template_kwargs": {"enable_thinking": body.enable_thinking},
        }
        try:
            return ChatCompletionRequest.model_validate(
                {k: v for k, v in fields.items() if v is not None}
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ()))
            raise APIError(400, f"{loc}: {first.get('msg')}") from exc

    async def count_tokens(self, body: CountTokensRequest) -> JSONResponse:
        self.chat._engine(body.model)
        prompts = self.chat.prompts(self._chat(body, 1))
        return JSONResponse({"input_tokens": len(prompts.token_ids[0])})

    async def create(self, body: MessagesRequest) -> Response:
        engine = self.chat._engine(body.model)
        chat = self._chat(body, body.max_tokens)
        # max_tokens is "at most": past the context it is cut to what is left.
        prompts = self.chat.prompts(chat, fit_context=True)
        outputs = submit(engine, jobs_for(chat, prompts))
        enc = MessageEncoder(self.state.model_name, body.stop_sequences, self.state.tokenizer)
        if body.stream:
            return EventStream(sse_named(self._stream(prompts, enc, outputs)), outputs)
        reader = TurnReader(prompts.output)
        with outputs:
            final = await read_whole(self.chat._observed(outputs), reader, enc.segment)
        usage = {**self._prompt_usage(final), "output_tokens": len(final.token_ids)}
        return JSONResponse(enc.message(usage, enc.stop_reason(final, reader.called)))

    async def _stream(
        self, prompts: Prompts, enc: MessageEncoder, outputs: OutputStream
    ) -> AsyncIterator[dict[str, Any]]:
        reader = TurnReader(prompts.output)
        started = False
        try:
            async for out in self.chat._observed(outputs):
                if not started:
                    usage = {**self._prompt_usage(out), "output_tokens": 0}
                    yield {"type": "message_start", "message": enc.message(usage)}
                    yield {"type": "ping"}
                    started = True
                for seg in reader.read(out):
                    for ev in enc.segment(seg):
                        yield ev
                if out.finished:
                    reason, seq = enc.stop_reason(out, reader.called)
                    yield {
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": seq},
                        "usage": {"output_tokens": len(out.token_ids)},
                    }
                    yield {"type": "message_stop"}
        except APIError as exc:
            yield error_body(500 if exc.status >= 500 else exc.status, exc.message)

    def _prompt_usage(self, out: RequestOutput) -> dict[str, int]:
        engine = self.state.engine
        cfg = engine.engine.config if engine is not None else None
        prompt, cached = len(out.prompt_token_ids), out.cached_tokens
        created = 0
        if cfg is not None and cfg.prefix_caching:
            block = cfg.scheduler.block_size
            created = (prompt - 1) // block * block - cached if prompt > cached else 0
            created = max(0, created)
        return {
            "input_tokens": prompt - cached - created,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": created,
        }
