"""The Anthropic Messages API's request body and error shape, and its messages as chat messages.

``MessagesRequest`` takes what the anthropic SDK and Claude Code send. ``to_chat`` turns it into
the chat request ``ServingChat`` renders: ``system`` (a string or text blocks) as the system
message; ``text`` blocks as content; ``thinking`` blocks as the assistant's
``reasoning_content``; ``tool_use`` blocks as its ``tool_calls``; ``tool_result`` blocks
(string or text blocks, ``is_error``) as ``tool`` messages, which must answer a ``tool_use`` of
the conversation. ``image`` and ``document`` blocks are a 400 (text-only models), and so are
server tools (web search, code execution, ...): this server runs none. ``cache_control`` is
accepted anywhere and changes nothing: the prefix cache is automatic.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field

from tt_serve.server.protocol import APIError, StrictBody

# Anthropic's error types by HTTP status (their documented set).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
_MEDIA = frozenset({"image", "document", "search_result", "container_upload"})


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def shaped(path: str, status: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """An OpenAI-shaped error (status, body) as the API at ``path`` sends it: under
    /v1/messages Anthropic's body, and a full queue is 529 (overloaded)."""
    if not path.startswith("/v1/messages"):
        return status, body
    err = body.get("error") or {}
    if status == 503 and err.get("code") == "queue_full":
        status = 529
    return status, error_body(status, str(err.get("message", "error")))


class CountTokensRequest(StrictBody):
    """``/v1/messages/count_tokens``: a Messages body without ``max_tokens``."""

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    stream: bool = False
    # Extension (as chat's, vLLM's): generate max_tokens whatever the model writes.
    ignore_eos: bool = False

    @property
    def limit(self) -> int | None:
        return None

    @property
    def enable_thinking(self) -> bool:
        """``thinking.type`` enabled (or adaptive) turns Qwen's thinking on; absent or disabled:
        off, as Anthropic's default."""
        t = (self.thinking or {}).get("type", "disabled")
        if t not in ("enabled", "disabled", "adaptive"):
            raise APIError(400, "thinking.type must be enabled, disabled or adaptive")
        if t == "enabled":
            budget = (self.thinking or {}).get("budget_tokens")
            if type(budget) is not int or budget < 1:
                raise APIError(400, "thinking.budget_tokens must be a positive integer")
            if self.limit is not None and budget >= self.limit:
                raise APIError(400, "max_tokens must be greater than thinking.budget_tokens")
        return t != "disabled"


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)

    @property
    def limit(self) -> int | None:
        return self.max_tokens


def response_format(output_config: dict[str, Any] | None) -> dict[str, Any] | None:
    """``output_config.format`` (structured outputs) as chat's ``response_format``."""
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise APIError(400, "output_config.format must be {'type': 'json_schema', 'schema': {...}}")
    if not isinstance(fmt.get("schema"), dict):
        raise APIError(400, "output_config.format.schema must be a JSON schema object")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _text_blocks(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise APIError(400, f"{where} must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in _MEDIA:
            raise APIError(400, f"{where}[{j}]: {kind} blocks are not supported: text-only model")
        if kind != "text" or not isinstance(block.get("text"), str):
            raise APIError(400, f"{where}[{j}] must be a text block")
        texts.append(block["text"])
    return "".join(texts)


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type", "custom")
        if kind != "custom" or "input_schema" not in t:
            raise APIError(
                400,
                f"tools.{i}: tool type {kind!r} is not supported (only client tools with an "
                "input_schema: this server runs no server tools)",
            )
        if not isinstance(t.get("name"), str) or not isinstance(t["input_schema"], dict):
            raise APIError(400, f"tools.{i} needs a name and an input_schema object")
        fn = {"name": t["name"], "parameters": t["input_schema"]}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[str | dict[str, Any] | None, bool]:
    """(chat's tool_choice, parallel_tool_calls)."""
    if choice is None:
        return None, True
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise APIError(400, "tool_choice.type must be auto, any, tool (with a name) or none")


def _assistant(blocks: Any, i: int) -> dict[str, Any]:
    if isinstance(blocks, str):
        return {"role": "assistant", "content": blocks}
    if not isinstance(blocks, list):
        raise APIError(400, f"messages.{i}.content must be a string or a list of blocks")
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    thinking = []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        where = f"messages.{i}.content.{j}"
        if kind == "text":
            msg["content"] += _text_blocks([b], where)
        elif kind == "thinking":
            if not isinstance(b.get("thinking"), str):
                raise APIError(400, f"{where}.thinking must be a string")
            thinking.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue  # opaque to us: another server's
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise APIError(400, f"{where}: tool_use needs an id and a name")
            if not isinstance(b.get("input", {}), dict):
                raise APIError(400, f"{where}.input must be an object")
            fn = {"name": b["name"], "arguments": json.dumps(b.get("input", {}))}
            msg.setdefault("tool_calls", []).append(
                {"id": b["id"], "type": "function", "function": fn}
            )
        elif kind in _MEDIA:
            raise APIError(400, f"{where}: {kind} blocks are not supported: text-only model")
        else:
            raise APIError(400, f"{where}: block type {kind!r} is not supported in assistant turns")
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    if msg.get("tool_calls") and not msg["content"]:
        msg["content"] = None
    return msg


def _user(blocks: Any, i: int, calls: set[str]) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages (first, as the template groups them),
    then its text as a user message."""
    if isinstance(blocks, str):
        return [{"role": "user", "content": blocks}]
    if not isinstance(blocks, list):
        raise APIError(400, f"messages.{i}.content must be a string or a list of blocks")
    results, texts = [], []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        where = f"messages.{i}.content.{j}"
        if kind == "tool_result":
            use = b.get("tool_use_id")
            if use not in calls:
                raise APIError(
                    400, f"{where}: tool_result.tool_use_id {use!r} answers no tool_use before it"
                )
            text = _text_blocks(b.get("content", ""), f"{where}.content")
            if b.get("is_error"):
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": use, "content": text})
        elif kind == "text":
            texts.append(_text_blocks([b], where))
        elif kind in _MEDIA:
            raise APIError(400, f"{where}: {kind} blocks are not supported: text-only model")
        else:
            raise APIError(400, f"{where}: block type {kind!r} is not supported in user turns")
    out = results
    if texts or not results:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def to_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.system is not None:
        system = _text_blocks(body.system, "system")
        if system:
            out.append({"role": "system", "content": system})
    calls: set[str] = set()
    for i, m in enumerate(body.messages):
        role = m.get("role")
        if role == "assistant":
            msg = _assistant(m.get("content"), i)
            calls |= {c["id"] for c in msg.get("tool_calls") or []}
            out.append(msg)
        elif role == "user":
            out += _user(m.get("content"), i, calls)
        elif role == "system":
            # Claude Code sends reminders as system messages between turns; Qwen's templates
            # allow a system message only first, so one here is read as the user's.
            out.append({"role": "user", "content": _text_blocks(m.get("content"), f"messages.{i}")})
        else:
            raise APIError(
                400, f"messages.{i}.role must be user, assistant or system, got {role!r}"
            )
    return out


def signature(thinking: str) -> str:
    """A thinking block's ``signature``: a digest of its text (clients hand it back; nothing
    here needs it verified, since the text is re-rendered as it came)."""
    return hashlib.sha256(thinking.encode()).hexdigest()
