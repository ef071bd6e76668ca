"""The OpenAI Responses API's request body, and its input items as chat messages.

``ResponsesRequest`` takes what the openai SDK (``client.responses.create`` / ``.stream``) and
Codex CLI send; fields they send that change nothing here (``prompt_cache_key``, ``include``,
``service_tier``, ...) are accepted and ignored, and what this server cannot do (built-in tools
such as ``web_search``, images, ``background``) is a 400 naming it. ``to_messages`` turns the
input items into the chat messages ``ServingChat`` renders: ``message`` items by role,
``function_call`` items as the assistant's ``tool_calls``, ``function_call_output`` items as
``tool`` messages, ``reasoning`` items as the next assistant message's ``reasoning_content``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic import Field

from tt_serve.server.protocol import APIError, StrictBody

# Input content parts that carry text, by the role that sends them.
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
_MEDIA_PARTS = frozenset({"input_image", "input_file", "input_audio"})
ROLES = frozenset({"user", "assistant", "system", "developer"})
REASONING_BLOB = "tt-serve:reasoning:v1:"
Namespaces = dict[str, str]  # function name -> the namespace tool that holds it


class ResponsesRequest(StrictBody):
    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=1_000_000)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    stream: bool = False
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    user: str | None = None
    background: bool = False
    truncation: str | None = None
    conversation: str | dict[str, Any] | None = None
    top_logprobs: int | None = None
    prompt: dict[str, Any] | None = None
    # Extension (as chat's, vLLM's): generate max_output_tokens whatever the model writes.
    ignore_eos: bool = False

    def refuse_unsupported(self) -> None:
        if self.background:
            raise APIError(400, "background responses are not supported", param="background")
        if self.conversation is not None:
            raise APIError(
                400,
                "conversation objects are not supported: use previous_response_id",
                param="conversation",
            )
        if self.top_logprobs:
            raise APIError(
                400,
                "top_logprobs is not supported on /v1/responses (chat completions has logprobs)",
                param="top_logprobs",
            )
        if self.prompt is not None:
            raise APIError(400, "stored prompt templates are not supported", param="prompt")
        if self.truncation not in (None, "disabled", "auto"):
            raise APIError(400, "truncation must be 'auto' or 'disabled'", param="truncation")
        if self.metadata is not None and len(self.metadata) > 16:
            raise APIError(400, "metadata holds at most 16 pairs", param="metadata")

    @property
    def thinking(self) -> bool | None:
        """Qwen's ``enable_thinking`` from ``reasoning.effort``: ``none`` and ``minimal`` turn it
        off, any other effort on; no effort: the template's default."""
        effort = (self.reasoning or {}).get("effort")
        if effort is None:
            return None
        if effort not in ("none", "minimal", "low", "medium", "high", "xhigh"):
            raise APIError(
                400,
                "reasoning.effort must be none, minimal, low, medium, high or xhigh",
                param="reasoning.effort",
            )
        return effort not in ("none", "minimal")


def chat_tools(
    tools: list[dict[str, Any]] | None,
) -> tuple[list[dict[str, Any]] | None, Namespaces]:
    """The Responses' flat function tools in chat form, those of a ``namespace`` tool (Codex
    groups its sub-agent tools so) among them; and the namespace of each such function, which
    its calls carry back. Any other tool type is a 400: this server runs no built-in tools."""
    if tools is None:
        return None, {}
    out: list[dict[str, Any]] = []
    spaces: Namespaces = {}

    def add(t: Any, where: str, space: str | None) -> None:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "namespace" and space is None and isinstance(t.get("tools"), list):
            for j, inner in enumerate(t["tools"]):
                add(inner, f"{where}.tools[{j}]", str(t.get("name", "")))
            return
        if kind != "function":
            raise APIError(
                400,
                f"{where}: tool type {kind!r} is not supported: this server runs no built-in "
                'tools, only function tools (in Codex CLI: web_search = "disabled")',
                param=f"{where}.type",
            )
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        out.append({"type": "function", "function": fn})
        if space is not None and isinstance(t.get("name"), str):
            spaces[t["name"]] = space

    for i, t in enumerate(tools):
        add(t, f"tools[{i}]", None)
    return out, spaces


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(
        400,
        "tool_choice must be none, auto, required or {'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format``."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise APIError(400, "text.format must be an object", param="text.format")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise APIError(
        400, "text.format.type must be text, json_object or json_schema", param="text.format"
    )


def reasoning_blob(text: str) -> str:
    """A reasoning item's ``encrypted_content``: its text, readable only by this server's
    input side (nothing is secret; stateless clients hand it back and the turn renders again
    with its reasoning)."""
    return REASONING_BLOB + base64.b64encode(text.encode()).decode()


def _blob_text(blob: object) -> str | None:
    if isinstance(blob, str) and blob.startswith(REASONING_BLOB):
        try:
            return base64.b64decode(blob[len(REASONING_BLOB) :], validate=True).decode()
        except ValueError:
            return None
    return None


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where} must be a string or a list of parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _MEDIA_PARTS:
            raise APIError(
                400,
                f"{where}[{j}]: {kind} is not supported: this model reads text only",
                param=where,
            )
        if not isinstance(part, dict) or (kind not in _TEXT_PARTS and kind != "refusal"):
            raise APIError(400, f"{where}[{j}] must be a text part", param=where)
        value = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(value, str):
            raise APIError(400, f"{where}[{j}].text must be a string", param=where)
        texts.append(value)
    return "".join(texts)


def _reasoning_text(item: dict[str, Any]) -> str:
    blob = _blob_text(item.get("encrypted_content"))
    if blob is not None:
        return blob
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            return _text(parts, f"input reasoning {key}")
    return ""


def with_instructions(
    instructions: str | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The messages with ``instructions`` first in their system message."""
    if not instructions:
        return messages
    if messages and messages[0]["role"] == "system":
        head = {**messages[0], "content": instructions + "\n\n" + messages[0]["content"]}
        return [head, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]


def to_messages(
    items: str | list[dict[str, Any]], known_calls: set[str] | None = None
) -> list[dict[str, Any]]:
    """Input items as chat messages. ``known_calls``: call ids of earlier turns (a continued
    response's); a ``function_call_output`` must answer one of them or a call before it. The
    leading system and developer messages are one system message; a later one (or any, when
    continuing a stored conversation) is read as the user's."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    calls = set(known_calls or ())
    out: list[dict[str, Any]] = []
    head = known_calls is None  # a continued conversation already has its head
    reasoning: str | None = None
    joinable = False  # whether the last message is an assistant turn the next items extend

    def assistant() -> dict[str, Any]:
        nonlocal reasoning, joinable
        if not joinable:
            msg: dict[str, Any] = {"role": "assistant", "content": None}
            if reasoning:
                msg["reasoning_content"] = reasoning
            out.append(msg)
            reasoning, joinable = None, True
        return out[-1]

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise APIError(
                    400, f"{where}.role must be one of {sorted(ROLES)}, got {role!r}", param="input"
                )
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant":
                msg = assistant()
                msg["content"] = (msg["content"] or "") + text
                continue
            joinable = False
            if role in ("system", "developer"):
                if head and all(m["role"] == "system" for m in out):  # one system message
                    if out:
                        out[0]["content"] += "\n\n" + text
                    else:
                        out.append({"role": "system", "content": text})
                    continue
                # Qwen's templates take a system message only first: a later one is the user's.
                role = "user"
            out.append({"role": role, "content": text})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            args = item.get("arguments", "{}")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise APIError(400, f"{where} needs call_id and name strings", param="input")
            if not isinstance(args, str):
                raise APIError(400, f"{where}.arguments must be a JSON string", param="input")
            calls.add(call_id)
            fn = {"name": name, "arguments": args}
            call = {"id": call_id, "type": "function", "function": fn}
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise APIError(
                    400,
                    f"{where}: function_call_output.call_id {call_id!r} answers no function_call "
                    "of this conversation",
                    param="input",
                )
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
            joinable = False
        elif kind == "reasoning":  # it opens the next assistant turn
            reasoning, joinable = _reasoning_text(item), False
        else:
            raise APIError(
                400, f"{where}: input item type {kind!r} is not supported", param="input"
            )
    return out


def call_ids(messages: list[dict[str, Any]]) -> set[str]:
    return {
        c["id"]
        for m in messages
        for c in m.get("tool_calls") or []
        if isinstance(c, dict) and isinstance(c.get("id"), str)
    }


def dumps(value: Any) -> str:
    """A stable text of a request field, to compare a continuation's with the stored one's."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
