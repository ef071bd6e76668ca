"""The HTTP side: every agent a task of its own, one streaming ``POST /v1/chat/completions`` per
turn with the whole history, the next turn sent once its own answer is in.

Per request (client clock, ``time.perf_counter``): TTFT = sent -> the first chunk whose delta
carries output (content, reasoning, a tool call, or token ids: the role-only opening chunk does
not count); E2EL = sent -> the last such chunk. ``prompt_tokens``, ``cached_tokens`` and
``completion_tokens`` come from the usage chunk (``stream_options.include_usage``), and
llama-server's ``timings.prompt_n`` when it sends it. Every stream is read to its end so the
connection is reused (bench/load/generator.py says why).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from bench.agent_replay.apis import ApiConversation, served_model, stream_api_turn
from bench.agent_replay.records import TurnRecord
from bench.agent_replay.workload import Answer, Conversation, TokenCounter, Workload
from bench.agent_replay.workload import common_prefix as _common
from bench.load.generator import post

IM_START = "<|im_start|>"


def chat_body(conv: Conversation, max_tokens: int, extras: dict[str, Any]) -> dict[str, Any]:
    """One turn's request: the history, the tools, greedy, a fixed answer length."""
    return {
        "messages": conv.messages,
        "tools": conv.workload.tools,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": conv.workload.template_kwargs,
        **extras,
    }


def _merge_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    """Fold one streamed tool-call fragment into ``calls`` (keyed by its index)."""
    call = calls.setdefault(
        int(delta.get("index", 0)),
        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
    )
    call["id"] = delta.get("id") or call["id"]
    fn = delta.get("function") or {}
    call["function"]["name"] += fn.get("name") or ""
    call["function"]["arguments"] += fn.get("arguments") or ""


async def stream_turn(
    client: httpx.AsyncClient, body: dict[str, Any], rec: TurnRecord, t0: float
) -> Answer:
    """Send one turn, fill ``rec`` (times, usage, error) and return the answer as received."""
    answer = Answer()
    calls: dict[int, dict[str, Any]] = {}
    st = time.perf_counter()
    rec.start, last = st - t0, st
    try:
        resp = await post(client, "/v1/chat/completions", body, stream=True)
        try:
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                return answer
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    rec.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    return answer
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    ids = choice.get("token_ids") or []
                    parts = (delta.get("content"), delta.get("reasoning_content"))
                    if any(parts) or delta.get("tool_calls") or ids:
                        now = time.perf_counter()
                        if rec.ttft is None:
                            rec.ttft = now - st
                        last = now
                    answer.content += delta.get("content") or ""
                    answer.reasoning += delta.get("reasoning_content") or ""
                    answer.token_ids += ids
                    for call in delta.get("tool_calls") or []:
                        _merge_call(calls, call)
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = int(usage["prompt_tokens"])
                    rec.completion_tokens = int(usage.get("completion_tokens") or 0)
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    rec.cached_tokens = None if cached is None else int(cached)
                timings = chunk.get("timings") or {}
                if "prompt_n" in timings:
                    rec.server_computed = int(timings["prompt_n"])
                    if rec.cached_tokens is None and "cache_n" in timings:
                        rec.cached_tokens = int(timings["cache_n"])
        finally:
            await resp.aclose()
    except (httpx.HTTPError, json.JSONDecodeError, OSError, KeyError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
        return answer
    answer.tool_calls = [calls[k] for k in sorted(calls)]
    if rec.ttft is None:
        rec.error = "no output was streamed"
    elif rec.prompt_tokens is None:
        rec.error = "no usage chunk"
    rec.e2el = last - st
    return answer


def answer_start(prev: list[int], im_start: int | None) -> int | None:
    """Where the previous answer's message starts: the previous prompt's last ``<|im_start|>``
    (its generation prompt, which the answer's own message re-renders)."""
    if im_start is None or im_start not in prev:
        return None
    return len(prev) - 1 - prev[::-1].index(im_start)


class Rendering:
    """What the client knows of a prompt before sending it: its ids (the model's template)."""

    def __init__(self, tok: TokenCounter, im_start: int | None) -> None:
        self.tok, self.im_start = tok, im_start

    def describe(
        self, conv: Conversation, rec: TurnRecord, prev: list[int] | None, answer: Answer | None
    ) -> list[int]:
        """The prompt's ids; fills ``rec``'s rendered length, resumable prefix, answer start."""
        ids = conv.prompt_ids(self.tok)
        rec.rendered_tokens = len(ids)
        if prev is not None and answer is not None:
            rec.answer_start = answer_start(prev, self.im_start)
            if answer.token_ids:
                rec.resumable = _common(ids, prev + answer.token_ids)
        return ids


async def run_agent(
    client: httpx.AsyncClient,
    conv: Conversation,
    render: Rendering,
    extras: dict[str, Any],
    t0: float,
    out: list[TurnRecord],
    api: str = "chat",
    model: str = "",
) -> None:
    """All turns of one agent, one after the other; a failed turn ends the agent. ``api``:
    chat (completions) or one of ``apis.API_ARMS`` (``model``: the served name)."""
    sizes = conv.workload.sizes
    other = ApiConversation(conv, api, model) if api != "chat" else None
    prev: list[int] | None = None
    answer: Answer | None = None
    for turn in range(1, sizes.turns + 1):
        rec = TurnRecord(conv.agent, turn, 0)
        if answer is not None and conv.mode == "rerendered":
            rec.rerender_changed = conv.messages[-2]["content"] != answer.content
        ids = render.describe(conv, rec, prev, answer)
        out.append(rec)
        if other is None:
            answer = await stream_turn(client, chat_body(conv, sizes.answer, extras), rec, t0)
        else:
            answer = await stream_api_turn(client, other, sizes.answer, rec, t0)
        if rec.error is not None:
            return
        prev = ids
        if turn < sizes.turns:
            if other is None:
                conv.add(answer)
            else:  # the result as the next user message (apis.py says why), in both forms
                result = conv.workload.results[conv.agent][conv.turn]
                other.add(answer, result)
                conv.add_user_result(answer, result)


async def run_replay(
    url: str,
    workload: Workload,
    mode: str,
    render: Rendering,
    extras: dict[str, Any],
    *,
    api: str = "chat",
    timeout: float = 1800.0,
) -> tuple[list[TurnRecord], float]:
    """Every agent concurrently against ``url``; the records (by agent, turn) and the makespan."""
    records: list[TurnRecord] = []
    n = workload.sizes.agents
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        model = await served_model(client) if api != "chat" else ""
        t0 = time.perf_counter()
        convs = [workload.conversation(a, mode) for a in range(n)]
        await asyncio.gather(
            *(run_agent(client, c, render, extras, t0, records, api, model) for c in convs)
        )
        makespan = time.perf_counter() - t0
    records.sort(key=lambda r: (r.agent, r.turn))
    return records, makespan


async def warm_up(url: str, extras: dict[str, Any]) -> None:
    """One short unrecorded chat request (no tools, nothing the replay's prompts share)."""
    body = {
        "messages": [{"role": "user", "content": "Warm-up."}],
        "max_tokens": 4,
        "temperature": 0.0,
        "ignore_eos": True,
        **extras,
    }
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        resp = await post(client, "/v1/chat/completions", body)
        resp.raise_for_status()
