"""The pieces behind the agents' APIs, without a server: the exact continuation of a stored turn,
the stored-response bounds and their files, and the Responses and Messages bodies as chat
messages."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pytest

from tt_serve.agents.reasoning import Reasoning
from tt_serve.agents.tool_parser import Content, ToolCall
from tt_serve.server import messages_protocol as mp
from tt_serve.server import responses_protocol as rp
from tt_serve.server.continuation import closed_turn, next_turn_text
from tt_serve.server.protocol import APIError
from tt_serve.server.response_store import ResponseStore, StoredResponse
from tt_serve.server.turn import Closed, Delta, Kind, Opened, Segments
from tt_serve.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
IM_END = 248046


# -- continuation ------------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize(
    "new",
    [
        [{"role": "user", "content": "Next question?"}],
        [{"role": "tool", "tool_call_id": "c1", "content": "42"}],
        [
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
            {"role": "tool", "tool_call_id": "c2", "content": "43"},
            {"role": "user", "content": "and?"},
        ],
    ],
    ids=["user", "tool", "tools-then-user"],
)
def test_continuation_is_the_templates_next_turn(
    qwen_tok: Tokenizer, new: list[dict[str, Any]], thinking: bool | None
) -> None:
    """What follows a finished assistant turn is what the template renders there for the whole
    conversation; without thinking the exact turn and the re-rendered one are the same text."""
    kw: dict[str, Any] = {"tools": TOOLS}
    if thinking is not None:
        kw["enable_thinking"] = thinking
    history = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    prompt = qwen_tok.apply_chat_template(history, add_generation_prompt=True, **kw)
    answer = {"role": "assistant", "content": "A."}
    whole = qwen_tok.apply_chat_template([*history, answer, *new], add_generation_prompt=True, **kw)
    nxt = next_turn_text(qwen_tok, new, add_generation_prompt=True, **kw)
    exact = prompt + "A." + "<|im_end|>" + nxt
    assert whole.endswith("A.<|im_end|>" + nxt)
    if thinking is None:
        assert whole == exact
    else:
        # The generation prompt's think block is not in the re-rendered answer: a re-render
        # changes the middle of the prompt, the continuation does not.
        assert whole != exact and exact.startswith(prompt)


def test_continuation_keeps_the_models_own_ids(qwen_tok: Tokenizer) -> None:
    prompt = [1, 2, 3]
    assert closed_turn(prompt, [7, IM_END], qwen_tok, frozenset({IM_END})) == [1, 2, 3, 7, IM_END]
    # Cut off, or ended by another end-of-sequence token: the turn end is put in place.
    assert closed_turn(prompt, [7, 8], qwen_tok, frozenset({IM_END})) == [1, 2, 3, 7, 8, IM_END]
    assert closed_turn(prompt, [7, 248044], qwen_tok, frozenset({IM_END, 248044})) == [
        1,
        2,
        3,
        7,
        IM_END,
    ]
    with pytest.raises(ValueError, match="at least one"):
        next_turn_text(qwen_tok, [], add_generation_prompt=True)


# -- the store ---------------------------------------------------------------------------------


def entry(rid: str, n: int = 10) -> StoredResponse:
    return StoredResponse(rid, {"id": rid}, array("i", range(n)), array("i", [1]), [], {})


def test_store_bounds_entries_and_bytes_lru() -> None:
    s = ResponseStore(max_entries=3, max_bytes=8_050)
    for i in range(3):
        assert s.put(entry(f"r{i}"))
    assert s.get("r0") is not None  # r0 is now the most recent
    s.put(entry("r3"))
    assert s.get("r1") is None and s.get("r0") is not None and len(s) == 3 and s.evicted == 1
    big = entry("big", 2_000)  # 8 kB of ids: the others go
    assert s.put(big) and len(s) == 1 and s.nbytes == big.nbytes
    assert not s.put(entry("huge", 5_000))  # alone over the bound: refused, nothing lost
    assert s.get("big") is not None
    assert s.delete("big") and not s.delete("big") and s.nbytes == 0
    off = ResponseStore(0, 10_000)
    assert not off.put(entry("x")) and off.get("x") is None


def test_store_files_survive_a_restart(tmp_path: Path) -> None:
    s = ResponseStore(4, 1 << 20, tmp_path)
    for i in range(3):
        s.put(entry(f"r{i}"))
    s.delete("r1")
    (tmp_path / "torn.json").write_text("{not json")
    (tmp_path / "r9.tmp").write_text("half")
    again = ResponseStore(4, 1 << 20, tmp_path)
    assert sorted(again._entries) == ["r0", "r2"]
    assert again.get("r2") == s.get("r2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0.json", "r2.json"]
    small = ResponseStore(1, 1 << 20, tmp_path)  # a smaller bound keeps the newest
    assert len(small) == 1 and len(list(tmp_path.glob("*.json"))) == 1


# -- segments ----------------------------------------------------------------------------------


def test_segments_close_each_item_before_the_next() -> None:
    seg = Segments()
    call = ToolCall("f", {"a": 1, "b": "x"})
    out = seg.feed([Reasoning("hm"), Reasoning("m"), Content("hi"), call, Content("bye")])
    out += seg.finish()
    opened = [s for s in out if isinstance(s, Opened)]
    closed = [s for s in out if isinstance(s, Closed)]
    assert [s.kind for s in opened] == [Kind.REASONING, Kind.TEXT, Kind.CALL, Kind.TEXT]
    assert [c.text for c in closed] == ["hmm", "hi", call.arguments_json, "bye"]
    depth = 0
    for s in out:
        depth += isinstance(s, Opened) - isinstance(s, Closed)
        assert depth in (0, 1) and (depth == 1 or not isinstance(s, Delta))
    args = "".join(s.text for s in out if isinstance(s, Delta) and s.kind == Kind.CALL)
    assert json.loads(args) == {"a": 1, "b": "x"} and seg.called


# -- request translation -----------------------------------------------------------------------


def test_responses_items_as_chat_messages() -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "D1"},
        {"role": "system", "content": [{"type": "input_text", "text": "D2"}]},
        {"role": "user", "content": "Q"},
        {"type": "reasoning", "summary": [], "encrypted_content": rp.reasoning_blob("think")},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "R"},
        {"role": "developer", "content": "later"},
    ]
    msgs = rp.to_messages(items)
    assert msgs[0] == {"role": "system", "content": "D1\n\nD2"}
    assert msgs[2]["reasoning_content"] == "think" and msgs[2]["content"] == "A"
    assert msgs[2]["tool_calls"][0]["id"] == "c1"
    assert msgs[3] == {"role": "tool", "tool_call_id": "c1", "content": "R"}
    assert msgs[4] == {"role": "user", "content": "later"}
    assert rp.with_instructions("I", msgs)[0]["content"] == "I\n\nD1\n\nD2"
    with pytest.raises(APIError, match="answers no function_call"):
        rp.to_messages([{"type": "function_call_output", "call_id": "c9", "output": "x"}])
    tools, spaces = rp.chat_tools(
        [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]}]
    )
    assert tools == [{"type": "function", "function": {"name": "g"}}] and spaces == {"g": "ns"}
    with pytest.raises(APIError, match="web_search"):
        rp.chat_tools([{"type": "web_search"}])


def test_messages_body_as_chat_messages() -> None:
    body = mp.MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "t", "signature": "s"},
                        {"type": "tool_use", "id": "u1", "name": "f", "input": {"x": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "u1",
                            "content": [{"type": "text", "text": "ok"}],
                        },
                        {
                            "type": "tool_result",
                            "tool_use_id": "u1",
                            "content": "bad",
                            "is_error": True,
                        },
                        {"type": "text", "text": "go on"},
                    ],
                },
            ],
        }
    )
    msgs = mp.to_messages(body)
    assert msgs[0] == {"role": "system", "content": "S"}
    assert msgs[2]["reasoning_content"] == "t" and msgs[2]["content"] is None
    assert json.loads(msgs[2]["tool_calls"][0]["function"]["arguments"]) == {"x": 1}
    assert [m["role"] for m in msgs[3:]] == ["tool", "tool", "user"]
    assert msgs[4]["content"] == "Error: bad"
    assert mp.chat_tool_choice({"type": "any", "disable_parallel_tool_use": True}) == (
        "required",
        False,
    )
    status, err = mp.shaped(
        "/v1/messages", 503, {"error": {"message": "full", "code": "queue_full"}}
    )
    assert status == 529 and err == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "full"},
    }
    assert mp.shaped("/v1/chat/completions", 503, {"error": {}}) == (503, {"error": {}})
