"""Qwen3.5 / 3.6 tool calls ("qwen3-coder" XML) in the model's text, as OpenAI tool calls
(the JSON-bodied ``<tool_call>`` of Qwen3 / Qwen3-Next templates is read too).

The model writes, after optional text::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

The XML carries no types: each value is converted with the tool's JSON schema (strings raw,
numbers and booleans parsed, objects and arrays as JSON), degrading to the string when a value
does not convert. ``ToolCallParser`` reads the text incrementally and emits a call only once
its block is closed and parsed, so nothing it sends is ever retracted: a block that does not
parse (or is cut off) comes back as plain content, and the streamed events concatenate to
exactly what one ``feed`` of the whole text gives.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
FUNC_OPEN = "<function="
FUNC_CLOSE = "</function>"
PARAM_CLOSE = "</parameter>"

_FUNC_RE = re.compile(r"\s*<function=([^>\n]*)>")
_PARAM_RE = re.compile(r"<parameter=([^>\n]*)>")
# vLLM's rule: names with braces, angle brackets, quotes or whitespace are unrendered template
# text ("<function={{name}}>"), never a call.
_VALID_NAME = re.compile(r"[^\s{}<>\"']+")
_ID_ALPHABET = string.ascii_letters + string.digits


def valid_tool_name(name: str) -> bool:
    """Whether a function name can be read back from ``<function=NAME>``."""
    return _VALID_NAME.fullmatch(name) is not None


def new_call_id() -> str:
    """``call_`` + 24 alphanumerics, as OpenAI's ids."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def argument_fragments(self) -> list[str]:
        """The arguments JSON cut per parameter (``{"a": 1``, ``, "b": 2``, ``}``): how they
        are streamed; the fragments concatenate to ``arguments_json``."""
        if not self.arguments:
            return ["{}"]
        parts = [
            json.dumps(k, ensure_ascii=False) + ": " + json.dumps(v, ensure_ascii=False)
            for k, v in self.arguments.items()
        ]
        return ["{" + parts[0], *(", " + p for p in parts[1:]), "}"]

    @property
    def arguments_json(self) -> str:
        return "".join(self.argument_fragments())


@dataclass(frozen=True)
class Content:
    text: str


ToolEvent = Content | ToolCall


def tool_schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Function name -> its parameters schema, from OpenAI ``tools``."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools or []:
        fn = t.get("function") or {}
        if isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out


def _types(schema: Mapping[str, Any]) -> list[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [x for sub in schema[key] if isinstance(sub, Mapping) for x in _types(sub)]
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return ["string"]
    return []


def _literal(raw: str, schema: Mapping[str, Any]) -> tuple[bool, Any]:
    """(True, value) when the text is one of the schema's ``const`` / ``enum`` values: raw
    for a string member (the grammar writes strings raw), else as JSON (how it writes others)."""
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if not isinstance(values, list):
        return False, None

    def member(x: Any) -> bool:  # type-exact: true is not 1
        return any(type(v) is type(x) and v == x for v in values)

    if member(raw):
        return True, raw
    try:
        parsed = json.loads(raw.strip())
    except (ValueError, RecursionError):
        return False, None
    return (True, parsed) if member(parsed) else (False, None)


def convert_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """One parameter's text as the type its schema says (vLLM's and SGLang's rules)."""
    found, value = _literal(raw, schema or {})
    if found:
        return value
    types = _types(schema or {})
    if raw.strip().lower() in ("null", "none") and "null" in types:
        return None
    non_null = [t for t in types if t != "null"]
    kind = non_null[0] if non_null else "string"
    text = raw.strip()
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            f = float(text)
            return int(f) if f.is_integer() and "." not in text and "e" not in text.lower() else f
        if kind == "boolean":
            if text.lower() in ("true", "false"):
                return text.lower() == "true"
            return raw
        if kind in ("object", "array"):
            try:
                return json.loads(text)
            except ValueError:
                return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return raw
    return raw


def _parse_json_call(block: str) -> ToolCall | None:
    """Hermes-style ``{"name": ..., "arguments": {...}}`` (Qwen3 / Qwen3-Next templates); the
    arguments may also come as a JSON string of an object."""
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or set(obj) - {"name", "arguments"}:
        return None
    name, args = obj.get("name"), obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not _VALID_NAME.fullmatch(name) or not isinstance(args, dict):
        return None
    return ToolCall(name, args)


def parse_call_block(block: str, tools: Mapping[str, dict[str, Any]]) -> ToolCall | None:
    """The call in the text between ``<tool_call>`` and ``</tool_call>`` (Qwen3.5's XML, or
    the JSON object of Qwen3 / Qwen3-Next templates), or None if the block is not a
    well-formed call."""
    if block.lstrip().startswith("{"):
        return _parse_json_call(block.strip())
    m = _FUNC_RE.match(block)
    if m is None or not _VALID_NAME.fullmatch(m.group(1)):
        return None
    name = m.group(1)
    rest = block[m.end() :]
    end = rest.rfind(FUNC_CLOSE)
    if end < 0 or rest[end + len(FUNC_CLOSE) :].strip():
        return None
    inner = rest[:end]
    props = tools.get(name, {}).get("properties")
    props = props if isinstance(props, Mapping) else {}
    args: dict[str, Any] = {}
    pos = 0
    while True:
        pm = _PARAM_RE.search(inner, pos)
        if pm is None:
            if inner[pos:].strip():
                return None
            break
        if inner[pos : pm.start()].strip():
            return None
        key, start = pm.group(1), pm.end()
        close = inner.find(PARAM_CLOSE, start)
        nxt = inner.find("<parameter=", start)
        if close < 0 or 0 <= nxt < close:  # a missing </parameter>: the next tag ends it
            stop = nxt if nxt >= 0 else len(inner)
            pos = stop
        else:
            stop = close
            pos = close + len(PARAM_CLOSE)
        if key in args:
            return None
        raw = inner[start:stop]
        raw = raw.removeprefix("\n").removesuffix("\n")  # the framing newlines only
        args[key] = convert_value(raw, props.get(key))
    return ToolCall(name, args)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ToolCallParser:
    """Incremental: ``feed`` text, get content and whole calls; ``finish`` at the end.

    Whitespace next to a call (the template's separators) is dropped from the content; a
    trailing run of whitespace is held until text follows it or the output ends."""

    def __init__(self, tools: Mapping[str, dict[str, Any]], *, parallel: bool = True) -> None:
        self.tools = tools
        self.parallel = parallel
        self.num_calls = 0
        self._buf = ""
        self._in_block = False
        self._after_call = False
        self._ws = ""

    def feed(self, text: str) -> list[ToolEvent]:
        self._buf += text
        events: list[ToolEvent] = []
        while True:
            if self._in_block:
                if not self._step_block(events):
                    break
            else:
                if self._after_call:  # the separator after a call is not content
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        break
                    self._after_call = False
                i = self._buf.find(TOOL_OPEN)
                if i < 0:
                    keep = _partial_suffix(self._buf, TOOL_OPEN)
                    head = self._buf[: len(self._buf) - keep]
                    body = head.rstrip()
                    self._content(events, body)
                    self._buf = head[len(body) :] + self._buf[len(head) :]
                    break
                before = self._buf[:i]
                body = before.rstrip()
                self._content(events, body)
                self._ws = before[len(body) :]  # dropped if a call follows, else content

                self._buf, self._in_block = self._buf[i + len(TOOL_OPEN) :], True
        return events

    def finish(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self._in_block:
            call = parse_call_block(self._buf, self.tools)  # a call whose </tool_call> is missing
            if call is not None:
                self._call(events, call)
            else:
                self._content(events, self._ws + TOOL_OPEN + self._buf)
        elif self._buf.strip() or self.num_calls == 0:
            self._content(events, self._buf)
        self._buf, self._in_block = "", False
        return events

    def _step_block(self, events: list[ToolEvent]) -> bool:
        """Advance inside a block; False when more text is needed."""
        head = self._buf.lstrip()
        xml = head.startswith(FUNC_OPEN) or FUNC_OPEN.startswith(head)
        if head and not (xml or head.startswith("{")):
            self._content(events, self._ws + TOOL_OPEN)  # not a call after all: plain text
            self._in_block = False
            return True
        j = self._buf.find(TOOL_CLOSE)
        if j < 0:
            return False
        block, self._buf, self._in_block = self._buf[:j], self._buf[j + len(TOOL_CLOSE) :], False
        call = parse_call_block(block, self.tools)
        if call is None:
            self._content(events, self._ws + TOOL_OPEN + block + TOOL_CLOSE)
        else:
            self._call(events, call)
            self._after_call = True
        return True

    def _call(self, events: list[ToolEvent], call: ToolCall) -> None:
        if self.parallel or self.num_calls == 0:
            events.append(call)
        self.num_calls += 1

    @staticmethod
    def _content(events: list[ToolEvent], text: str) -> None:
        if not text:
            return
        if events and isinstance(events[-1], Content):
            events[-1] = Content(events[-1].text + text)
        else:
            events.append(Content(text))
