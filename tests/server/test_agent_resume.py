"""Agents through HTTP: each turn resumes at the previous answer's message start, and every
answer equals the one a server with prefix caching off gives (content, tool calls, logprobs).

Two agents share a long system prompt and tools; their turns alternate between a forced tool
call (the client re-sends it as ``tool_calls``, which the template re-serialises) and a plain
answer (re-sent with its text stripped, as clients that drop reasoning do), each followed by a
tool result or a user message. The demo model runs in fp32 on the CPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import MODEL_NAME, Served, serve
from tests.server.test_agents_api import NAMED, TOOLS

BLOCK = 16  # engine_options()
SYSTEM = "You are a careful agent. " * 60 + "Use the tools when they help."


# Two servers per module (about 10 s to start): the slow run holds them; the fast loop keeps the
# same warm == cold rule in tests/tt/runtime/test_resume_points.py.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def servers(demo_dir: Path) -> Iterator[tuple[Served, Served]]:
    with serve(demo_dir) as warm, serve(demo_dir, prefix_caching=False) as cold:
        yield warm, cold


def ask(s: Served, messages: list[dict[str, Any]], turn: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": messages,
        "tools": TOOLS,
        "max_tokens": 120 if turn % 2 == 0 else 24,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    if turn % 2 == 0:
        body["tool_choice"] = NAMED
    with s.client() as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def answer(reply: dict[str, Any]) -> tuple[Any, ...]:
    """What the model said: content and calls (a call's id is random per response)."""
    msg = reply["choices"][0]["message"]
    calls = [c["function"] for c in msg.get("tool_calls") or []]
    return msg.get("content"), calls, reply["choices"][0]["finish_reason"]


def next_messages(history: list[dict[str, Any]], reply: dict[str, Any], a: int, t: int) -> None:
    """The client's next turn: the answer as it re-sends it, then a tool result or a user
    message."""
    msg = reply["choices"][0]["message"]
    if msg.get("tool_calls"):
        calls = msg["tool_calls"]
        history.append({"role": "assistant", "content": msg.get("content"), "tool_calls": calls})
        result = f"agent {a} turn {t}: sunny, 21 degrees, light wind from the west. " * 4
        history.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": result})
    else:
        text = re.sub(r"\s+", " ", msg.get("content") or "").strip()  # re-rendered
        history.append({"role": "assistant", "content": text})
        history.append({"role": "user", "content": f"Agent {a}, now check turn {t + 1}."})


def test_agents_resume_at_message_starts_and_answer_as_cold(
    servers: tuple[Served, Served],
) -> None:
    warm, cold = servers
    histories = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Plan trip {a}."}]
        for a in range(2)
    ]
    prompt_tokens: list[list[int]] = [[], []]
    cached: list[list[int]] = [[], []]
    with ThreadPoolExecutor(2) as pool:
        for t in range(4):
            replies = list(pool.map(ask, [warm, warm], histories, [t, t]))
            for a, (h, got) in enumerate(zip(histories, replies, strict=True)):
                want = ask(cold, h, t)
                assert answer(got) == answer(want)
                assert got["choices"][0]["logprobs"] == want["choices"][0]["logprobs"]
                assert want["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
                prompt_tokens[a].append(got["usage"]["prompt_tokens"])
                cached[a].append(got["usage"]["prompt_tokens_details"]["cached_tokens"])
                next_messages(h, got, a, t)
    calls = [m for h in histories for m in h if m.get("tool_calls")]
    assert len(calls) == 4, "turns 0 and 2 force a tool call; the client re-sends it"
    for a in range(2):
        for t in range(1, 4):
            added = prompt_tokens[a][t] - prompt_tokens[a][t - 1]
            computed = prompt_tokens[a][t] - cached[a][t]
            assert computed <= 1.1 * added + BLOCK + 4, (a, t, computed, added)
    with warm.client() as c:
        metrics = c.get("/metrics").text
    kinds = {
        k: float(v)
        for k, v in re.findall(
            r'tt_serve:prefix_cache_resumes_total\{kind="(\w+)"\} (\S+)', metrics
        )
    }
    # Seven of the eight requests resume (the first to arrive computes the shared head): at a
    # message start, or at a chunk multiple between the answer's start and the prompt end.
    assert sum(kinds.values()) == 7 and kinds["message"] >= 4, kinds
    held = re.search(r"^tt_serve:snapshots_held (\S+)", metrics, re.M)
    assert held is not None and float(held.group(1)) >= 1
    assert "tt_serve:prompt_tokens_recomputed_count" in metrics


def test_same_prompt_twice_hits_up_to_its_last_block(servers: tuple[Served, Served]) -> None:
    warm, _ = servers
    messages = [{"role": "user", "content": "A fresh question about tides. " * 9}]
    first = ask(warm, messages, 1)
    again = ask(warm, messages, 1)
    n = first["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // BLOCK * BLOCK
    assert answer(again) == answer(first)
