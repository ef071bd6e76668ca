"""The agent replay through the Responses and Messages APIs: one streamed request per turn, the
same conversations as the chat arm's.

* ``responses``: the first turn sends the system text as ``instructions`` and the task; each
  later turn sends only the new items with ``previous_response_id`` (the server continues from
  the stored ids: nothing is re-rendered);
* ``responses-stateless``: every turn sends the whole history as input items with
  ``store: false``, the answer re-sent as ``mode`` says (what Codex CLI does);
* ``messages``: every turn sends the whole history as Anthropic messages (what Claude Code
  does), the answer re-sent as ``mode`` says.

A random-weight model calls no tool, and neither API lets a result answer no call, so in these
arms each tool result is the next user message (its text, not a ``<tool_response>`` block: a few
template tokens fewer per turn than the chat arm's). TTFT and usage are measured as in
``client.py``: the first delta that carries output, and the final usage event.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.agent_replay.records import TurnRecord
from bench.agent_replay.workload import Answer, Conversation, rerender
from bench.load.generator import post

API_ARMS = ("responses", "responses-stateless", "messages")


@dataclass
class ApiConversation:
    """One agent's state for an API arm: what the next request sends."""

    conv: Conversation
    api: str
    model: str  # the served name (the Messages API requires one)
    last_id: str | None = None
    new: list[dict[str, Any]] = field(default_factory=list)  # items since the last response
    history: list[dict[str, Any]] = field(default_factory=list)  # the whole, in the API's form

    def __post_init__(self) -> None:
        task = self.conv.messages[1]["content"]
        self.new = [{"role": "user", "content": task}]
        self.history = list(self.new)

    def add(self, answer: Answer, result: str) -> None:
        """The answer (as the mode re-sends it) and the tool result after it."""
        text = answer.content if self.conv.mode == "verbatim" else rerender(answer.content)
        if self.api == "messages":
            blocks: list[dict[str, Any]] = []
            if answer.reasoning and self.conv.mode == "verbatim":
                blocks.append({"type": "thinking", "thinking": answer.reasoning, "signature": ""})
            blocks.append({"type": "text", "text": text})
            self.history.append({"role": "assistant", "content": blocks})
        else:
            if answer.reasoning and self.conv.mode == "verbatim":
                part = {"type": "reasoning_text", "text": answer.reasoning}
                self.history.append({"type": "reasoning", "summary": [], "content": [part]})
            out = [{"type": "output_text", "text": text}]
            self.history.append({"type": "message", "role": "assistant", "content": out})
        self.new = [{"role": "user", "content": result}]
        self.history += self.new

    def body(self, max_tokens: int) -> tuple[str, dict[str, Any]]:
        wl = self.conv.workload
        common = {"model": self.model, "temperature": 0.0, "stream": True, "ignore_eos": True}
        if self.api == "messages":
            tools = [
                {
                    "name": t["function"]["name"],
                    "description": t["function"].get("description", ""),
                    "input_schema": t["function"]["parameters"],
                }
                for t in wl.tools
            ]
            thinking = {"type": "enabled", "budget_tokens": 1} if wl.thinking else None
            body = {
                "system": wl.system,
                "messages": self.history,
                "tools": tools,
                "max_tokens": max_tokens,
                "thinking": thinking or {"type": "disabled"},
                **common,
            }
            return "/v1/messages", body
        tools = [{"type": "function", **t["function"]} for t in wl.tools]
        body = {
            "instructions": wl.system,
            "tools": tools,
            "max_output_tokens": max_tokens,
            "reasoning": {"effort": "high" if wl.thinking else "none"},
            **common,
        }
        if self.api == "responses":
            body |= {"input": self.new, "previous_response_id": self.last_id, "store": True}
        else:
            body |= {"input": self.history, "store": False}
        return "/v1/responses", body


async def stream_api_turn(
    client: httpx.AsyncClient, ac: ApiConversation, max_tokens: int, rec: TurnRecord, t0: float
) -> Answer:
    """Send one turn through the arm's API; fill ``rec`` and return the answer as received."""
    path, body = ac.body(max_tokens)
    answer = Answer()
    st = time.perf_counter()
    rec.start, last = st - t0, st
    try:
        resp = await post(client, path, body, stream=True)
        try:
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                return answer
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                ev = json.loads(line[5:])
                kind = ev.get("type", "")
                delta = _delta(ev)
                if delta is not None:
                    now = time.perf_counter()
                    rec.ttft = now - st if rec.ttft is None else rec.ttft
                    last = now
                    if delta[0] == "reasoning":
                        answer.reasoning += delta[1]
                    else:
                        answer.content += delta[1]
                if kind in ("error", "response.failed"):
                    rec.error = f"stream error: {json.dumps(ev)[:300]}"
                    return answer
                _usage(ev, rec, ac)
        finally:
            await resp.aclose()
    except (httpx.HTTPError, json.JSONDecodeError, OSError, KeyError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
        return answer
    if rec.ttft is None:
        rec.error = "no output was streamed"
    elif rec.prompt_tokens is None:
        rec.error = "no usage event"
    rec.e2el = last - st
    return answer


async def served_model(client: httpx.AsyncClient) -> str:
    resp = await client.get("/v1/models")
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


def _delta(ev: dict[str, Any]) -> tuple[str, str] | None:
    """("text" | "reasoning", the text) of an event that carries output."""
    kind = ev.get("type")
    if kind == "response.output_text.delta":
        return "text", str(ev["delta"])
    if kind == "response.reasoning_text.delta":
        return "reasoning", str(ev["delta"])
    if kind == "content_block_delta":
        d = ev.get("delta") or {}
        if d.get("type") == "text_delta":
            return "text", str(d["text"])
        if d.get("type") == "thinking_delta":
            return "reasoning", str(d["thinking"])
    return None


def _usage(ev: dict[str, Any], rec: TurnRecord, ac: ApiConversation) -> None:
    kind = ev.get("type")
    if kind in ("response.completed", "response.incomplete"):
        r = ev["response"]
        u = r["usage"]
        rec.prompt_tokens = int(u["input_tokens"])
        rec.cached_tokens = int(u["input_tokens_details"]["cached_tokens"])
        rec.completion_tokens = int(u["output_tokens"])
        ac.last_id = r["id"]
    elif kind == "message_start":
        u = ev["message"]["usage"]
        cached = int(u.get("cache_read_input_tokens") or 0)
        rec.cached_tokens = cached
        rec.prompt_tokens = int(u["input_tokens"]) + cached
        rec.prompt_tokens += int(u.get("cache_creation_input_tokens") or 0)
    elif kind == "message_delta":
        rec.completion_tokens = int((ev.get("usage") or {}).get("output_tokens") or 0)
