"""The Anthropic Messages API through the official ``anthropic`` SDK against a live server (the
demo model, fp32 on the CPU): plain text, streamed events, a forced tool use and its result on
the next turn (the history re-sent, as Claude Code sends it, resumes at the answer's message
start), structured output, thinking on and off, stop sequences, count_tokens, auth by
``x-api-key``, and each bad input's error in Anthropic's shape. Also ``/tokenize`` and
``/detokenize``, and the per-API request counter."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.server.conftest import MODEL_NAME, Served, serve
from tests.server.test_agents_api import ANSWER, WEATHER
from tests.server.test_concurrency import metric

BLOCK = 16
TOOLS: list[Any] = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
GREEDY = {"temperature": 0.0}  # the SDK no longer has the argument; the API still takes it


@pytest.fixture(scope="module")
def server(demo_dir: Path) -> Iterator[Served]:
    with serve(demo_dir, max_batch_size=8) as s:
        yield s


def client(s: Served, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=s.url, api_key=key, max_retries=0, timeout=120)


def test_plain_text_usage_and_stop_reason(server: Served) -> None:
    m = client(server).messages.create(
        model=MODEL_NAME,
        max_tokens=10,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "Hello"}],
        metadata={"user_id": "u1"},
        extra_body=GREEDY,
    )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.stop_reason == "max_tokens" and [b.type for b in m.content] == ["text"]
    u = m.usage
    assert u.output_tokens == 10
    with httpx.Client(base_url=server.url) as h:
        tokens = h.post(
            "/tokenize",
            json={
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hello"},
                ],
                # Anthropic's default: no thinking (the template closes an empty block).
                "chat_template_kwargs": {"enable_thinking": False},
            },
        )
    prompt = tokens.json()["count"]
    assert (
        u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
        == prompt
    )


def test_stream_events_and_reassembly(server: Served) -> None:
    c = client(server)
    kw: dict[str, Any] = dict(model=MODEL_NAME, max_tokens=16, extra_body=GREEDY)
    kw |= dict(messages=[{"role": "user", "content": "Think first"}])
    kw |= dict(thinking={"type": "enabled", "budget_tokens": 8})
    with c.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "message_delta" in kinds
    # Thinking on: the output is a thinking block, with its signature, then any text.
    assert final.content[0].type == "thinking"
    assert final.content[0].signature  # type: ignore[union-attr]
    starts = [e.index for e in events if e.type == "content_block_start"]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert starts == stops == list(range(len(final.content)))
    whole = c.messages.create(**kw)
    assert [b.model_dump() for b in whole.content] == [b.model_dump() for b in final.content]


def test_streamed_forced_tool_use_reassembles(server: Served) -> None:
    c = client(server)
    kw: Any = dict(model=MODEL_NAME, max_tokens=120, tools=TOOLS, extra_body=GREEDY)
    kw |= dict(messages=[{"role": "user", "content": "Weather?"}])
    kw |= dict(tool_choice={"type": "tool", "name": "get_weather"})
    with c.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    parts = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    use = [b for b in final.content if b.type == "tool_use"]
    assert len(use) == 1 and json.loads("".join(parts)) == use[0].input
    assert final.stop_reason == "tool_use"
    jsonschema.validate(use[0].input, WEATHER)


def test_thinking_off(server: Served) -> None:
    m = client(server).messages.create(
        model=MODEL_NAME,
        max_tokens=6,
        messages=[{"role": "user", "content": "Hi"}],
        thinking={"type": "disabled"},
        extra_body=GREEDY,
    )
    assert [b.type for b in m.content] == ["text"]


def test_forced_tool_use_then_result_resumes(server: Served) -> None:
    c = client(server)
    system = "You are a weather agent. " * 12
    msgs: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    m1 = c.messages.create(
        model=MODEL_NAME,
        max_tokens=120,
        system=system,
        messages=msgs,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    assert m1.stop_reason == "tool_use"
    uses = [b for b in m1.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER)
    msgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}],
        },
    ]
    m2 = c.messages.create(
        model=MODEL_NAME, max_tokens=6, system=system, messages=msgs, tools=TOOLS, extra_body=GREEDY
    )
    prompt1 = (
        m1.usage.input_tokens
        + m1.usage.cache_read_input_tokens
        + m1.usage.cache_creation_input_tokens
    )  # type: ignore[operator]
    # The re-sent history resumes at the answer's message start (the previous generation
    # prompt), snapped to the block grid.
    assert m2.usage.cache_read_input_tokens >= (prompt1 - 4) // BLOCK * BLOCK - BLOCK  # type: ignore[operator]


def test_structured_output_and_stop_sequences(server: Served) -> None:
    c = client(server)
    m = c.messages.create(
        model=MODEL_NAME,
        max_tokens=200,
        messages=[{"role": "user", "content": "JSON please"}],
        output_config={"format": {"type": "json_schema", "schema": ANSWER}},
        extra_body=GREEDY,
    )
    jsonschema.validate(json.loads(m.content[0].text), ANSWER)  # type: ignore[union-attr]
    free = c.messages.create(
        model=MODEL_NAME,
        max_tokens=30,
        messages=[{"role": "user", "content": "Go"}],
        extra_body=GREEDY,
    )
    text = free.content[0].text  # type: ignore[union-attr]
    stop = text[len(text) // 2 : len(text) // 2 + 2].strip() or text[-2:]
    m2 = c.messages.create(
        model=MODEL_NAME,
        max_tokens=30,
        messages=[{"role": "user", "content": "Go"}],
        stop_sequences=[stop],
        extra_body=GREEDY,
    )
    assert m2.stop_reason == "stop_sequence" and m2.stop_sequence == stop
    assert stop not in m2.content[0].text  # type: ignore[union-attr]


def test_count_tokens_matches_the_prompt(server: Served) -> None:
    c = client(server)
    msgs: Any = [{"role": "user", "content": "Count me"}]
    n = c.messages.count_tokens(model=MODEL_NAME, messages=msgs, tools=TOOLS).input_tokens
    m = c.messages.create(model=MODEL_NAME, max_tokens=1, messages=msgs, tools=TOOLS)
    u = m.usage
    assert n == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens  # type: ignore[operator]


BAD: list[tuple[dict[str, Any], int, str]] = [
    ({"max_tokens": None}, 400, "max_tokens"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}
            ]
        },
        400,
        "text-only",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}]},
        400,
        "t1",
    ),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "web_search"),
    ({"tool_choice": {"type": "sometimes"}}, 400, "tool_choice"),
    ({"thinking": {"type": "enabled", "budget_tokens": 50}}, 400, "budget_tokens"),
    ({"messages": [{"role": "user", "content": "hi " * 3000}]}, 400, "context"),
    ({"model": "claude-opus"}, 404, "claude-opus"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
]


@pytest.mark.parametrize(("extra", "status", "needle"), BAD, ids=[n for *_, n in BAD])
def test_bad_input_in_anthropic_shape(
    server: Served, extra: dict[str, Any], status: int, needle: str
) -> None:
    body = {"model": MODEL_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    body = {k: v for k, v in {**body, **extra}.items() if v is not None}
    with httpx.Client(base_url=server.url, timeout=60) as h:
        r = h.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == status, r.text
        data = r.json()
        assert data["type"] == "error" and set(data["error"]) == {"type", "message"}
        assert needle in data["error"]["message"], data
        assert h.get("/health").status_code == 200


def test_auth_by_x_api_key_and_bearer(demo_dir: Path) -> None:
    with serve(demo_dir, api_key="sekrit") as s:
        m = client(s, "sekrit").messages.create(
            model=MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
        assert m.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError) as err:
            client(s, "wrong").messages.create(
                model=MODEL_NAME, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        assert err.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        with httpx.Client(base_url=s.url) as h:
            body = {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 2}
            ok = h.post("/v1/responses", json=body, headers={"Authorization": "Bearer sekrit"})
            assert ok.status_code == 200
            big = h.post(
                "/v1/messages",
                content=b"x" * (9 << 20),
                headers={"x-api-key": "sekrit", "content-type": "application/json"},
            )
            assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"


def test_tokenize_detokenize_and_request_counts(server: Served) -> None:
    with httpx.Client(base_url=server.url) as h:
        vllm = h.post("/tokenize", json={"prompt": "Hello world"}).json()
        llama = h.post("/tokenize", json={"content": "Hello world"}).json()
        assert vllm["tokens"] == llama["tokens"] and vllm["count"] == len(vllm["tokens"]) > 0
        assert vllm["max_model_len"] == 2048
        text = h.post("/detokenize", json={"tokens": vllm["tokens"]}).json()
        assert text == {"prompt": "Hello world", "content": "Hello world"}
        assert h.post("/detokenize", json={"tokens": [-1]}).status_code == 400
        assert h.post("/tokenize", json={"prompt": "a", "content": "b"}).status_code == 400
        assert h.post("/tokenize", json={"messages": []}).status_code == 400
        metrics = h.get("/metrics").text
    for api in ("messages", "count_tokens", "tokenize", "detokenize"):
        assert f'tt_serve:api_requests_total{{api="{api}"}}' in metrics, api


def test_hang_ups_and_errors_on_the_agent_apis_free_everything(server: Served) -> None:
    """Streams of both APIs dropped mid-way, refused bodies and stored turns (their closed-turn
    prefills included) leave no request running and no KV block held."""

    async def one(c: httpx.AsyncClient, i: int) -> None:
        if i % 2:
            path = "/v1/messages"
            body: dict[str, Any] = {"model": MODEL_NAME, "max_tokens": 40, "ignore_eos": True}
            body["messages"] = [{"role": "user", "content": f"client {i} " * 20}]
        else:
            path = "/v1/responses"
            body = {"model": MODEL_NAME, "input": f"client {i} " * 20, "max_output_tokens": 40}
            body["ignore_eos"] = True
        async with c.stream("POST", path, json={**body, "stream": True}) as r:
            assert r.status_code == 200
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data:")
                if i % 3 == 0 and n == 4:
                    return  # hang up mid-stream
        bad = await c.post(path, json={**body, "max_tokens": -1, "max_output_tokens": -1})
        assert bad.status_code == 400

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            await asyncio.gather(*(one(c, i) for i in range(12)))

    asyncio.run(main())
    with httpx.Client(base_url=server.url) as h:
        deadline = time.monotonic() + 30
        while True:
            m = h.get("/metrics").text
            idle = all(
                metric(m, name) == 0
                for name in (
                    "tt_serve:num_requests_running",
                    "tt_serve:num_requests_waiting",
                    "tt_serve:kv_cache_usage_perc",
                )
            )
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert idle, m
