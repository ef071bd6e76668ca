"""Tool calls, structured output and reasoning through a real uvicorn with the official openai
client on the random-weight demo model: only the grammar makes its output valid."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL_NAME, Served, serve

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 8}},
                "required": ["zone"],
            },
        },
    },
]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 16},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "score", "tags", "ok"],
    "additionalProperties": False,
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(demo_dir: Path) -> Iterator[Served]:
    with serve(demo_dir, max_batch_size=8) as s:
        yield s


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)


def over_seeds(check: Callable[[int], None]) -> None:
    """``check(seed)`` for 20 seeds, 8 at a time (the engine batches them)."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(check, range(20)))


@pytest.mark.slow
def test_named_tool_choice_validates_over_seeds(server: Served) -> None:
    c = client(server)

    def check(seed: int) -> None:
        r = c.chat.completions.create(
            model=MODEL_NAME,
            messages=USER,  # type: ignore[arg-type]
            tools=TOOLS,
            tool_choice=NAMED,
            temperature=1.0,
            seed=seed,
            max_completion_tokens=120,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice  # OpenAI's for a named tool_choice
        calls = choice.message.tool_calls
        assert calls is not None and len(calls) == 1, choice.message
        call = calls[0]
        assert call.id.startswith("call_") and len(call.id) == 29
        assert call.function.name == "get_weather"  # type: ignore[union-attr]
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)  # type: ignore[union-attr]

    over_seeds(check)


@pytest.mark.slow
def test_response_format_json_schema_validates_over_seeds(server: Served) -> None:
    c = client(server)
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": ANSWER, "strict": True},
    }

    def check(seed: int) -> None:
        r = c.chat.completions.create(
            model=MODEL_NAME,
            messages=USER,  # type: ignore[arg-type]
            response_format=fmt,
            temperature=1.0,
            seed=seed,
            max_completion_tokens=120,
        )
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), ANSWER)

    over_seeds(check)


@pytest.mark.slow
def test_streamed_tool_calls_reassemble(server: Served) -> None:
    c = client(server)
    args: dict[str, Any] = dict(
        model=MODEL_NAME,
        messages=USER,
        tools=TOOLS,
        tool_choice="required",
        temperature=1.0,
        seed=7,
        max_completion_tokens=300,
    )
    whole = c.chat.completions.create(**args)
    assert whole.choices[0].finish_reason == "tool_calls"
    expected = [
        (t.function.name, t.function.arguments) for t in whole.choices[0].message.tool_calls or []
    ]  # type: ignore[union-attr]
    assert expected
    chunks = list(
        c.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    calls: dict[int, dict[str, str]] = {}
    order: list[str] = []
    for ch in chunks:
        for choice in ch.choices:
            for d in choice.delta.tool_calls or []:
                if d.id is not None:  # the first delta of a call: id and name, no arguments
                    assert d.function is not None and d.function.arguments == ""
                    calls[d.index] = {"name": d.function.name or "", "args": "", "id": d.id}
                    order.append("name")
                elif d.function is not None and d.function.arguments:
                    calls[d.index]["args"] += d.function.arguments
                    order.append("args")
    assert order[0] == "name"
    assert [(v["name"], v["args"]) for _, v in sorted(calls.items())] == expected
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finals[-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


@pytest.mark.slow
def test_agent_loop_reports_cached_tokens(server: Served) -> None:
    c = client(server)
    messages: list[Any] = [
        {"role": "system", "content": "You are a weather agent."},
        {"role": "user", "content": "Weather in Paris, then the time there?"},
    ]
    r1 = c.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        tools=TOOLS,
        tool_choice=NAMED,
        temperature=0,
        max_completion_tokens=120,
    )
    call = (r1.choices[0].message.tool_calls or [])[0]
    messages += [
        r1.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'},
    ]
    r2 = c.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_completion_tokens=300,
    )
    assert r2.choices[0].finish_reason == "tool_calls"
    call2 = (r2.choices[0].message.tool_calls or [])[0]
    messages += [
        r2.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call2.id, "content": "12:00"},
    ]
    r3 = c.chat.completions.create(
        model=MODEL_NAME,
        messages=messages,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_completion_tokens=8,
    )
    assert r3.choices[0].message.tool_calls is None
    assert isinstance(r3.choices[0].message.content, str)
    for r, prev in ((r2, r1), (r3, r2)):
        assert r.usage is not None and prev.usage is not None
        details = r.usage.prompt_tokens_details
        assert details is not None and details.cached_tokens
        # The history is re-rendered as the earlier prompt plus the turn: at least the earlier
        # prompt's whole chunks come from the cache (snapshots every prefill_chunk = 64 tokens).
        assert details.cached_tokens >= prev.usage.prompt_tokens // 64 * 64 > 0


def test_reasoning_split(server: Served) -> None:
    body = {
        "model": MODEL_NAME,
        "messages": USER,
        "chat_template_kwargs": {"enable_thinking": True},
        "temperature": 0,
        "max_tokens": 12,
    }
    with httpx.Client(base_url=server.url, timeout=120) as h:
        whole = h.post("/v1/chat/completions", json=body).json()
        msg = whole["choices"][0]["message"]
        # The random model never closes </think> in 12 tokens: everything is reasoning.
        assert msg["reasoning_content"] and msg["content"] == ""
        ids = whole["usage"]["completion_tokens"]
        assert ids == 12
        lines = h.post("/v1/chat/completions", json={**body, "stream": True}).text.splitlines()
    deltas = [json.loads(x[6:])["choices"] for x in lines if x.startswith("data: {")]
    text = "".join(c[0]["delta"].get("reasoning_content", "") for c in deltas if c)
    assert text == msg["reasoning_content"]
    off = {**body, "chat_template_kwargs": {"enable_thinking": False}}
    with httpx.Client(base_url=server.url, timeout=120) as h:
        plain = h.post("/v1/chat/completions", json=off).json()["choices"][0]["message"]
    assert "reasoning_content" not in plain


def _required_tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
        "tool_choice": "required",
    }


def _param(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": schema}, "required": ["x"]}


def _schema(schema: dict[str, Any], *, strict: bool = False) -> dict[str, Any]:
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "strict": strict, "schema": schema},
        }
    }


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },
            "objekt",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "strict": True,
                        "schema": {"type": "object", "properties": {"a": {"type": "string"}}},
                    },
                }
            },
            "additionalProperties",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "nope",
        ),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"response_format": {"type": "xml"}}, "response_format type"),
        # Malformed schemas that used to reach the grammar builder and fail as a 500.
        (_required_tool({"type": "object", "properties": [1]}), "properties must be an object"),
        (_required_tool({"type": "object", "required": "city"}), "required must be an array"),
        (_required_tool(_param({"type": "string", "maxLength": [1]})), "maxLength must be"),
        (_required_tool(_param({"type": "string", "enum": "abc"})), "enum must be a non-empty"),
        (_required_tool(_param({"enum": []})), "enum must be a non-empty"),
        (_required_tool({"type": "object", "$defs": [1]}), "$defs must be an object"),
        (
            _required_tool({"type": "object", "properties": {"a>\n": {"type": "string"}}}),
            "cannot be a parameter name",
        ),
        (_schema({"type": "object", "x-guidance": "loose"}), "x-guidance must be an object"),
        (
            _schema(
                {"type": "object", "properties": {}, "required": 5, "additionalProperties": False},
                strict=True,
            ),
            "required a list",
        ),
        # Template variables the request owns (they used to collide: TypeError, 500).
        ({"chat_template_kwargs": {"messages": []}}, "may not set ['messages']"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "add_generation_prompt"),
        ({"chat_template_kwargs": {"tools": "x"}}, "may not set ['tools']"),
        # Names the parser could never read back from <function=NAME> (a required call came
        # back as content).
        (
            {"tools": [{"type": "function", "function": {"name": "get weather"}}]},
            "may not contain whitespace",
        ),
        (
            {
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_time", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "content": "12:00"},
                ],
                "tools": TOOLS,
            },
            "messages[2].tool_call_id",
        ),
    ],
)
def test_invalid_constraints_are_400(server: Served, extra: dict[str, Any], needle: str) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as h:
        resp = h.post(
            "/v1/chat/completions",
            json={"model": MODEL_NAME, "messages": USER, "max_tokens": 4, **extra},
        )
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"


@pytest.mark.slow
def test_named_tool_typed_literals_and_slash_patterns(server: Served) -> None:
    """Non-string const / enum values come back typed (``5``, not ``"5"``), and a pattern with
    "/" (bare or escaped) compiles instead of a 400 lexer error."""
    params = {
        "type": "object",
        "properties": {
            "n": {"const": 5},
            "mode": {"enum": ["fast", 2, None]},
            "path": {"type": "string", "pattern": "^[a-z]{1,3}/[0-9]\\/x$"},
        },
        "required": ["n", "mode", "path"],
        "additionalProperties": False,
    }
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    named: Any = {"type": "function", "function": {"name": "f"}}
    cl = client(server)

    def check(seed: int) -> None:
        resp = cl.chat.completions.create(
            model=MODEL_NAME, messages=USER, tools=tools, tool_choice=named, seed=seed,
            temperature=1.0, max_tokens=64,
        )  # fmt: skip
        calls = resp.choices[0].message.tool_calls
        assert calls, resp
        jsonschema.validate(json.loads(calls[0].function.arguments), params)  # type: ignore[union-attr]

    for seed in range(4):
        check(seed)


def test_grammar_failing_mid_generation_is_400_not_500(server: Served) -> None:
    """llguidance builds lexers lazily: a pattern too big for it fails after the first token.
    That is the request's schema failing, answered 400 (and an error event in a stream)."""
    body = {"model": MODEL_NAME, "messages": USER, "max_tokens": 8}
    body.update(_schema({"type": "string", "pattern": "^a{1000000}$"}))
    with httpx.Client(base_url=server.url, timeout=60) as h:
        resp = h.post("/v1/chat/completions", json=body)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert "too many expressions" in err["message"] and "<state>" not in err["message"]
        with h.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            text = s.read().decode()
        assert s.status_code == 200 and "constrained decoding failed" in text
        assert text.rstrip().endswith("data: [DONE]")
        gauges = h.get("/metrics").text
    assert "tt_serve:num_requests_running 0.0" in gauges
