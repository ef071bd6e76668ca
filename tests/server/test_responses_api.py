"""The OpenAI Responses API through the official ``openai`` SDK against a live server (the demo
model, fp32 on the CPU): plain text, streamed events in the documented order, a forced function
call and its result on the next turn (stored and continued exactly, or re-sent whole), structured
output, thinking on and off, GET and DELETE of stored responses, and each bad input's 400/404 in
OpenAI's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL_NAME, Served, serve
from tests.server.test_agents_api import ANSWER, WEATHER

BLOCK = 16  # engine_options(): the KV block, the grid a continuation's hit snaps to
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}
]
FORCED: Any = {"type": "function", "name": "get_weather"}


@pytest.fixture(scope="module")
def server(demo_dir: Path) -> Iterator[Served]:
    with serve(demo_dir, max_batch_size=8) as s:
        yield s


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_plain_text_and_usage(server: Served) -> None:
    r = client(server).responses.create(
        model=MODEL_NAME, input="Hello there", max_output_tokens=12, temperature=0
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text and r.output[0].content[0].type == "output_text"  # type: ignore[union-attr]
    u = r.usage
    assert u is not None and u.output_tokens == 12 and u.input_tokens > 0
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0


def test_stream_events_in_order_and_reassemble(server: Served) -> None:
    c = client(server)
    kw: dict[str, Any] = dict(model=MODEL_NAME, input="Tell me", max_output_tokens=16)
    kw |= dict(temperature=0, reasoning={"effort": "high"}, tools=TOOLS)
    events = list(c.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # Each item's events close before the next item opens.
    open_item: int | None = None
    for e in events:
        if e.type == "response.output_item.added":
            assert open_item is None, kinds
            open_item = e.output_index
        elif e.type == "response.output_item.done":
            assert open_item == e.output_index
            open_item = None
        elif hasattr(e, "output_index"):
            assert e.output_index == open_item, e
    assert open_item is None
    final = events[-1].response  # type: ignore[union-attr]
    # The thinking prompt opens a think block: the output starts with a reasoning item.
    assert final.output[0].type == "reasoning"
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == final.output[0].content[0].text
    assert final.usage.output_tokens_details.reasoning_tokens > 0
    # The same request unstreamed gives the same items (greedy).
    whole = c.responses.create(**kw)
    assert [o.model_dump(exclude={"id"}) for o in whole.output] == [
        o.model_dump(exclude={"id"}) for o in final.output
    ]


def test_thinking_off_has_no_reasoning(server: Served) -> None:
    r = client(server).responses.create(
        model=MODEL_NAME,
        input="Hi",
        max_output_tokens=8,
        temperature=0,
        reasoning={"effort": "none"},
    )
    assert [o.type for o in r.output] == ["message"]
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens == 0


def test_forced_call_then_result_continues_exactly(server: Served) -> None:
    c = client(server)
    r1 = c.responses.create(
        model=MODEL_NAME,
        instructions="You are a weather agent. " * 10,
        input="What is the weather in Paris?",
        tools=TOOLS,
        tool_choice=FORCED,
        max_output_tokens=120,
        temperature=0,
    )
    calls = [o for o in r1.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, WEATHER)
    assert calls[0].call_id.startswith("call_")
    assert r1.usage is not None
    result = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}]
    r2 = c.responses.create(
        model=MODEL_NAME,
        previous_response_id=r1.id,
        instructions="You are a weather agent. " * 10,
        input=result,  # type: ignore[arg-type]
        tools=TOOLS,
        max_output_tokens=8,
        temperature=0,
    )
    assert r2.usage is not None
    whole_turn = r1.usage.input_tokens + r1.usage.output_tokens
    # The previous prompt, its output and the turn end are the continuation's exact head...
    assert r2.usage.input_tokens > whole_turn
    # ...and the closed turn was prefilled when r1 was stored: the hit reaches its end, so only
    # the new items (and at most one block of the grid) are computed.
    added = r2.usage.input_tokens - whole_turn
    computed = r2.usage.input_tokens - r2.usage.input_tokens_details.cached_tokens
    assert computed <= added + BLOCK, (computed, added)
    # Re-sent whole (a stateless client, store off), the template renders the call again from
    # its parsed arguments: the head still hits, the rest need not be the model's own tokens.
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    history += [o.model_dump(exclude_none=True) for o in r1.output] + result
    r3 = c.responses.create(
        model=MODEL_NAME,
        instructions="You are a weather agent. " * 10,
        input=history,
        tools=TOOLS,
        max_output_tokens=8,
        temperature=0,
        store=False,
    )
    assert r3.usage is not None and r3.usage.input_tokens_details.cached_tokens >= BLOCK


def test_changed_instructions_render_the_stored_conversation(server: Served) -> None:
    c = client(server)
    r1 = c.responses.create(model=MODEL_NAME, input="First.", max_output_tokens=4, temperature=0)
    r2 = c.responses.create(
        model=MODEL_NAME,
        previous_response_id=r1.id,
        instructions="New rules.",
        input="Second.",
        max_output_tokens=4,
        temperature=0,
    )
    assert r1.usage is not None and r2.usage is not None
    # A new system message heads the prompt: the whole history is rendered again.
    assert r2.usage.input_tokens_details.cached_tokens == 0
    assert r2.usage.input_tokens > r1.usage.input_tokens


def test_structured_output_through_the_stream_helper(server: Served) -> None:
    c = client(server)
    kw: Any = dict(
        model=MODEL_NAME,
        input="Answer in JSON.",
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}},
        max_output_tokens=200,
        temperature=0,
    )
    r = c.responses.create(**kw)
    assert r.status == "completed"  # the grammar ends the object, then the turn
    jsonschema.validate(json.loads(r.output_text), ANSWER)
    with c.responses.stream(**kw) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == r.output_text


def test_streamed_forced_call_reassembles(server: Served) -> None:
    c = client(server)
    kw: Any = dict(model=MODEL_NAME, input="Weather?", tools=TOOLS, tool_choice=FORCED)
    kw |= dict(max_output_tokens=120, temperature=0)
    events = list(c.responses.create(stream=True, **kw))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[-1].item.type == "function_call" and added[-1].item.arguments == ""
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == args and done[0].name == "get_weather"
    jsonschema.validate(json.loads(args), WEATHER)
    whole = c.responses.create(**kw)
    assert [o.arguments for o in whole.output if o.type == "function_call"] == [args]


def test_get_delete_and_unknown_ids(server: Served) -> None:
    c = client(server)
    r = c.responses.create(model=MODEL_NAME, input="Keep me", max_output_tokens=4, temperature=0)
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    deleted = c.responses.delete(r.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    for call in (
        lambda: c.responses.retrieve(r.id),
        lambda: c.responses.create(
            model=MODEL_NAME, previous_response_id=r.id, input="more", max_output_tokens=2
        ),
        lambda: c.responses.delete("resp_unknown"),
    ):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert set(err.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    unstored = c.responses.create(
        model=MODEL_NAME, input="Forget me", max_output_tokens=2, store=False
    )
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


BAD: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "web_search"}]}, "web_search"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "text only",
    ),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "call_x"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
    ({"input": []}, "at least one item"),
    ({"input": "hi " * 3000}, "context"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"reasoning": {"effort": "extreme"}}, "effort"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"background": True}, "background"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": TOOLS}, "nope"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"top_logprobs": 3}, "top_logprobs"),
]


@pytest.mark.parametrize(("extra", "needle"), BAD, ids=[n for _, n in BAD])
def test_bad_input_is_400_in_openai_shape(
    server: Served, extra: dict[str, Any], needle: str
) -> None:
    body = {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 4, **extra}
    with httpx.Client(base_url=server.url, timeout=60) as h:
        r = h.post("/v1/responses", json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert needle in err["message"], err
        assert h.get("/health").status_code == 200  # still serving


def test_store_survives_a_restart_with_the_disk_tier(demo_dir: Path, tmp_path: Path) -> None:
    disk = {"disk_cache_dir": str(tmp_path / "disk"), "disk_cache_gb": 1.0}
    with serve(demo_dir, **disk) as s:
        r1 = client(s).responses.create(
            model=MODEL_NAME, input="Remember this.", max_output_tokens=6, temperature=0
        )
    with serve(demo_dir, **disk) as s:
        c = client(s)
        assert c.responses.retrieve(r1.id).output_text == r1.output_text
        r2 = c.responses.create(
            model=MODEL_NAME, previous_response_id=r1.id, input="And?", max_output_tokens=4
        )
        assert r2.usage is not None and r2.usage.input_tokens > r1.usage.input_tokens  # type: ignore[union-attr]
