"""Qwen tool-call and reasoning parsing: the parsers alone (streamed in every split equals
whole), then a scripted backend behind a real uvicorn: its output, in Qwen's format, comes
back as OpenAI tool calls; malformed blocks come back as content, never a 5xx."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from tt_serve.agents.chat_output import ChatMessage, ChatOutputParser, OutputFormat, parse_whole
from tt_serve.agents.constraints import _regex_body
from tt_serve.agents.reasoning import prompt_opens_reasoning
from tt_serve.agents.tool_parser import ToolCall, convert_value
from tt_serve.engine.async_engine import AsyncEngine
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.engine.text import text_stream_factory
from tt_serve.model.interface import StateCopy, StepBatch, StepOutput
from tt_serve.qwen_vocab import IM_END_ID
from tt_serve.server.app import ServerState, create_app
from tt_serve.tokenizer import Tokenizer, load_tokenizer

SCHEMAS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "opts": {"type": "object"},
            "hourly": {"type": "boolean"},
        },
    }
}
TWO_CALLS = (
    "I'll check both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
    "<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=opts>\n"
    '{"a": [1, 2]}\n</parameter>\n<parameter=hourly>\nTrue\n</parameter>\n</function>\n'
    "</tool_call>"
)
CALLS = [
    ToolCall("get_weather", {"city": "Paris", "days": 3}),
    ToolCall("get_weather", {"city": "New\nYork", "opts": {"a": [1, 2]}, "hourly": True}),
]
MALFORMED = [
    "see <tool_call>\n<function=get_weather>\n<parameter=city>\nParis",  # cut off
    "x <tool_call>\n<function={{name}}>\n</function>\n</tool_call> y",  # unrendered template
    "<tool_call>not a call</tool_call>",
    "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\njunk\n</function>\n</tool_call>",
]


def _stream(text: str, fmt: OutputFormat, cuts: list[int]) -> ChatMessage:
    p, msg, last = ChatOutputParser(fmt), ChatMessage(), 0
    for c in [*cuts, len(text)]:
        msg.add(p.feed(text[last:c]))
        last = c
    msg.add(p.finish())
    return msg


def _joined(m: ChatMessage) -> tuple[str, str, list[ToolCall]]:
    return "".join(m.reasoning), "".join(m.content), m.calls


def test_two_calls_parse_and_any_split_agrees() -> None:
    fmt = OutputFormat(tools=SCHEMAS)
    whole = parse_whole(TWO_CALLS, fmt)
    assert whole.calls == CALLS and "".join(whole.content) == "I'll check both."
    assert json.loads(CALLS[1].arguments_json) == CALLS[1].arguments
    rng = np.random.default_rng(0)
    for _ in range(200):
        cuts = sorted(rng.choice(len(TWO_CALLS), size=int(rng.integers(1, 30)), replace=False))
        assert _joined(_stream(TWO_CALLS, fmt, [int(c) for c in cuts])) == _joined(whole)


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_blocks_are_content(text: str) -> None:
    fmt = OutputFormat(tools=SCHEMAS)
    whole = parse_whole(text, fmt)
    assert whole.calls == [] and "".join(whole.content) == text
    cuts = list(range(1, len(text)))
    assert _joined(_stream(text, fmt, cuts)) == _joined(whole)


HERMES = (
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}'
    "\n</tool_call>"
)


def test_json_bodied_calls_of_qwen3_next_templates() -> None:
    """Qwen3 / Qwen3-Next templates ask for a JSON object inside <tool_call>; arguments as an
    object or as a JSON string of one. Any split of the stream agrees with the whole."""
    fmt = OutputFormat(tools=SCHEMAS)
    whole = parse_whole(HERMES, fmt)
    assert whole.calls == [
        ToolCall("get_weather", {"city": "Paris", "days": 3}),
        ToolCall("get_weather", {"city": "Rome"}),
    ]
    assert "".join(whole.content) == "Checking."
    rng = np.random.default_rng(1)
    for _ in range(100):
        cuts = sorted(rng.choice(len(HERMES), size=int(rng.integers(1, 20)), replace=False))
        assert _joined(_stream(HERMES, fmt, [int(c) for c in cuts])) == _joined(whole)
    for bad in (
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "f", "extra": 1}</tool_call>',
        '<tool_call>{"name": "f" "arguments": {}}</tool_call>',
    ):
        got = parse_whole(bad, fmt)
        assert got.calls == [] and "".join(got.content) == bad


def test_reasoning_split_and_prompt_state() -> None:
    fmt = OutputFormat(reasoning=True, tools=SCHEMAS)
    text = "think hard\n</think>\n\n" + TWO_CALLS
    whole = parse_whole(text, fmt)
    assert _joined(whole) == ("think hard", "I'll check both.", CALLS)
    assert _joined(_stream(text, fmt, list(range(1, len(text))))) == _joined(whole)
    cut = parse_whole("still thinking", fmt)
    assert _joined(cut) == ("still thinking", "", [])
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>user\n<think></think><|im_start|>assistant\n")


def test_value_conversion_follows_the_schema() -> None:
    assert convert_value("3", {"type": "integer"}) == 3
    assert convert_value("2.5", {"type": "number"}) == 2.5
    assert convert_value("x", {"type": "integer"}) == "x"  # degrades to the string
    assert convert_value("null", {"type": ["string", "null"]}) is None
    assert convert_value("[1, 2]", {"type": "array"}) == [1, 2]
    assert convert_value("{'a': 1}", {"type": "object"}) == {"a": 1}
    assert convert_value("07", None) == "07"
    # const / enum members keep their type: the grammar writes strings raw, other values JSON.
    assert convert_value("5", {"const": 5}) == 5
    assert convert_value("2", {"enum": ["fast", 2, None]}) == 2
    assert convert_value("null", {"enum": ["fast", 2, None]}) is None
    assert convert_value('"fast"', {"enum": ["fast", 2]}) == "fast"
    assert convert_value("fast", {"enum": ["fast", 2]}) == "fast"
    assert convert_value("true", {"enum": [1]}) == "true"  # true is not 1
    assert convert_value("[" * 100_000, {"enum": [1]}) == "[" * 100_000  # no RecursionError


def test_pattern_slashes_are_escaped_once() -> None:
    assert _regex_body("^a/b$") == r"a\/b"
    assert _regex_body(r"a\/b") == r"a\/b"  # already escaped: unchanged
    assert _regex_body(r"a\\/b") == r"a\\\/b"  # an escaped backslash, then a bare "/"


class ScriptedBackend:
    """Greedy tokens from a script (then ``<|im_end|>``), whatever the prompt."""

    script: list[int] = []  # noqa: RUF012 (set per test)

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.sampled: dict[int, int] = {}

    def allocate(self, **_: int) -> None:
        pass

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        pass

    def execute(self, batch: StepBatch) -> StepOutput:
        out = StepOutput(token_ids=[], logprobs=[])
        for i, row in enumerate(batch.rows):
            if not row.sample:
                out.token_ids.append(None)
                out.logprobs.append(None)
                continue
            n = self.sampled.get(row.seq_id, 0)
            self.sampled[row.seq_id] = n + 1
            tok = self.script[n] if n < len(self.script) else IM_END_ID
            if row.want_logits:
                logits = np.full(self.vocab, -10.0, dtype=np.float32)
                logits[tok] = 10.0
                out.logits[i] = logits
                out.token_ids.append(None)
            else:
                out.token_ids.append(tok)
            out.logprobs.append(None)
        return out

    def close(self) -> None:
        pass


@contextmanager
def scripted_server(tok: Tokenizer) -> Iterator[str]:
    state = ServerState(model_name="scripted", api_key=None)

    def loader(st: ServerState) -> None:
        config = EngineConfig(
            scheduler=SchedulerConfig(max_batch=4, chunk=64, block_size=16),
            num_kv_blocks=256,
            num_snapshot_slots=4,
            max_model_len=4096,
            vocab_size=248320,
            eos_token_ids=frozenset(tok.eos_token_ids),
        )
        engine = Engine(ScriptedBackend(248320), config, text_streams=text_stream_factory(tok))  # type: ignore[arg-type]
        ae = AsyncEngine(engine)
        ae.start()
        st.tokenizer, st.max_model_len, st.engine = tok, 4096, ae

    server = uvicorn.Server(
        uvicorn.Config(create_app(state, loader), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started or state.engine is None:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def scripted(demo_dir: Path) -> Iterator[tuple[str, Tokenizer]]:
    tok = load_tokenizer(demo_dir)
    assert tok is not None
    with scripted_server(tok) as url:
        yield url, tok


def _ask(url: str, stream: bool = False, **extra: Any) -> Any:
    body = {
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": SCHEMAS["get_weather"]},
            }
        ],
        "temperature": 0,
        "max_tokens": 200,
        "stream": stream,
        **extra,
    }
    with httpx.Client(base_url=url, timeout=60) as h:
        resp = h.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    if not stream:
        return resp.json()
    return [json.loads(x[6:]) for x in resp.text.splitlines() if x.startswith("data: {")]


def test_scripted_two_calls_through_the_server(scripted: tuple[str, Tokenizer]) -> None:
    url, tok = scripted
    ScriptedBackend.script = tok.encode(TWO_CALLS)
    choice = _ask(url)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "I'll check both."
    got = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]
    ]
    assert got == [(c.name, c.arguments) for c in CALLS]
    assert len({c["id"] for c in msg["tool_calls"]}) == 2
    chunks = _ask(url, stream=True)
    args: dict[int, str] = {}
    for ch in chunks:
        for d in ch["choices"][0]["delta"].get("tool_calls", []) if ch["choices"] else []:
            args[d["index"]] = args.get(d["index"], "") + d["function"].get("arguments", "")
    assert [args[0], args[1]] == [c["function"]["arguments"] for c in msg["tool_calls"]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # tool_choice none: the same text is plain content
    plain = _ask(url, tool_choice="none")["choices"][0]
    assert plain["message"]["content"] == TWO_CALLS and plain["finish_reason"] == "stop"


@pytest.mark.parametrize("text", MALFORMED)
def test_scripted_malformed_is_content(scripted: tuple[str, Tokenizer], text: str) -> None:
    url, tok = scripted
    ScriptedBackend.script = tok.encode(text)
    choice = _ask(url)["choices"][0]
    assert choice["message"]["content"] == text and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
