"""Agents through the Responses and Messages APIs: every later turn resumes (exactly, with
``previous_response_id``: only the new items are computed), and every answer equals the one a
server with prefix caching off gives, through each API.

Two agents share a long system prompt and tools; each turn's answer is followed by a tool result
(as the replay's API arms send it, ``bench/agent_replay/apis.py``). The demo model runs in fp32
on the CPU; answers are greedy and of fixed length (``ignore_eos``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.agent_replay.apis import API_ARMS, ApiConversation, stream_api_turn
from bench.agent_replay.records import TurnRecord
from bench.agent_replay.summary import bound
from bench.agent_replay.workload import Answer, Sizes, build
from tests.server.conftest import MODEL_NAME, Served, serve
from tt_serve.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

BLOCK = 16  # engine_options()
SIZES = Sizes(agents=2, turns=4, head=600, task=40, tool=80, answer=12)


@pytest.fixture(scope="module")
def servers(demo_dir: Path) -> Iterator[tuple[Served, Served]]:
    with serve(demo_dir) as warm, serve(demo_dir, prefix_caching=False) as cold:
        yield warm, cold


async def converse(
    url: str, api: str, mode: str, qwen_tok: Tokenizer
) -> list[tuple[TurnRecord, Answer]]:
    """Both agents' turns, one agent after the other, through ``api``."""
    wl = build(SIZES, 0, qwen_tok)
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for agent in range(SIZES.agents):
            ac = ApiConversation(wl.conversation(agent, mode), api, MODEL_NAME)
            for turn in range(1, SIZES.turns + 1):
                rec = TurnRecord(agent, turn, 0)
                answer = await stream_api_turn(client, ac, SIZES.answer, rec, 0.0)
                assert rec.error is None, rec.error
                out.append((rec, answer))
                if turn < SIZES.turns:
                    ac.add(answer, wl.results[agent][turn - 1])
    return out


@pytest.mark.parametrize("api", API_ARMS)
def test_warm_equals_cold_and_later_turns_resume(
    servers: tuple[Served, Served], api: str, qwen_tok: Tokenizer
) -> None:
    warm, cold = servers
    mode = "verbatim"
    got = asyncio.run(converse(warm.url, api, mode, qwen_tok))
    ref = asyncio.run(converse(cold.url, api, mode, qwen_tok))
    assert [(a.content, a.reasoning) for _, a in got] == [(a.content, a.reasoning) for _, a in ref]
    assert all(r.cached_tokens == 0 for r, _ in ref)
    prev: dict[int, TurnRecord] = {}
    for rec, _ in got:
        assert rec.completion_tokens == SIZES.answer
        before = prev.get(rec.agent)
        prev[rec.agent] = rec
        if before is None:
            continue
        assert rec.prompt_tokens is not None and before.prompt_tokens is not None
        added = rec.prompt_tokens - before.prompt_tokens
        computed = rec.computed
        assert computed is not None and computed <= bound(added), (api, rec)
        if api == "responses":
            # Exact continuation: the previous prompt, its answer and the turn end are the head;
            # the closed turn was prefilled, so only the new items (past the grid) are computed.
            new_items = added - SIZES.answer - 1
            assert computed <= new_items + BLOCK, (rec, added)


@pytest.mark.parametrize(("profile", "api"), [("mixed", "messages"), ("bfp4-mlp", "responses")])
def test_a_block_float_profile_resumes_and_answers_as_cold(
    demo_dir: Path, profile: str, api: str, qwen_tok: Tokenizer
) -> None:
    """The card's packed weights on the CPU (``--precision``): an agent's later turns resume
    from the cache and every answer equals a cache-off server's in the same profile."""
    with (
        serve(demo_dir, precision=profile) as warm,
        serve(demo_dir, precision=profile, prefix_caching=False) as cold,
    ):
        got = asyncio.run(converse(warm.url, api, "verbatim", qwen_tok))
        ref = asyncio.run(converse(cold.url, api, "verbatim", qwen_tok))
    assert [(a.content, a.reasoning) for _, a in got] == [(a.content, a.reasoning) for _, a in ref]
    later = [r for r, _ in got if r.turn > 1]
    assert later and all((r.cached_tokens or 0) >= SIZES.head for r in later), later
