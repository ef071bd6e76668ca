"""The cold reference: a sample of the soak's greedy requests sent again, in the same order per
conversation, to a fresh server with prefix caching off, whose answers must be identical (text,
output tokens, and token ids where the API returns them).

A conversation is replayed turn by turn with its recorded bodies; on the Responses API each turn
continues from the control's own previous response instead of the soaked server's. A turn
after a differing one is not compared (its input is no longer the same).
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx

from bench.common import gates
from bench.load.generator import post
from bench.soak.client import Answer, Exchange, answer_of
from bench.soak.mix import PATHS

FAILURES_KEPT = 10


def groups(exchanges: list[Exchange]) -> list[list[Exchange]]:
    """The greedy exchanges that were right, per item, in turn order (a conversation's turns
    after a wrong one were never sent)."""
    by_item: dict[int, list[Exchange]] = {}
    for ex in exchanges:
        if ex.body is not None and ex.answer is not None and ex.problem is None:
            by_item.setdefault(ex.item, []).append(ex)
    return [sorted(g, key=lambda e: e.turn) for _, g in sorted(by_item.items())]


def sample(exchanges: list[Exchange], most: int, seed: int) -> list[list[Exchange]]:
    """Whole items drawn by ``seed`` until ``most`` requests (the last item may pass it)."""
    pool = groups(exchanges)
    random.Random(f"soak-sample|{seed}").shuffle(pool)
    out, n = [], 0
    for g in pool:
        if n >= most:
            break
        out.append(g)
        n += len(g)
    return out


def differs(ref: Answer, got: Answer) -> str | None:
    if ref.token_ids is not None and got.token_ids is not None and ref.token_ids != got.token_ids:
        return "token ids differ"
    if ref.text != got.text:
        return f"text differs: {ref.text[:60]!r} vs {got.text[:60]!r}"
    if ref.output_tokens != got.output_tokens:
        return f"{ref.output_tokens} vs {got.output_tokens} output tokens"
    return None


async def _control_answer(client: httpx.AsyncClient, ex: Exchange, body: dict[str, Any]) -> Answer:
    if not body.get("stream"):
        resp = await post(client, ex.path, body)
        resp.raise_for_status()
        return answer_of(ex.path, resp.json())
    answer = Answer(token_ids=[])
    async with client.stream("POST", ex.path, json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or []:
                answer.text += choice.get("text") or ""
                answer.token_ids = (answer.token_ids or []) + (choice.get("token_ids") or [])
            if chunk.get("usage"):
                answer.output_tokens = int(chunk["usage"].get("completion_tokens") or 0)
    return answer


async def _replay(client: httpx.AsyncClient, group: list[Exchange]) -> tuple[int, list[str]]:
    """(requests compared, defects) of one item."""
    compared, defects = 0, []
    previous_id: str | None = None
    for ex in group:
        assert ex.body is not None and ex.answer is not None
        body = ex.body
        if ex.path == PATHS["responses"] and previous_id is not None:
            body = body | {"previous_response_id": previous_id}
        try:
            got = await _control_answer(client, ex, body)
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            # The control failing is not a difference of the soaked server: not compared.
            return compared, defects + [f"item {ex.item} turn {ex.turn}: control failed: {exc}"]
        compared += 1
        why = differs(ex.answer, got)
        if why is not None:
            return compared, defects + [f"item {ex.item} turn {ex.turn} ({ex.path}): {why}"]
        previous_id = got.response_id
    return compared, defects


async def compare(url: str, sampled: list[list[Exchange]], concurrency: int) -> dict[str, Any]:
    """Replay ``sampled`` on the control at ``url``; the gate's fields (``gates.report``) and
    the first failures."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one(group: list[Exchange]) -> tuple[int, list[str]]:
            async with sem:
                return await _replay(client, group)

        results = await asyncio.gather(*(one(g) for g in sampled))
    n = sum(c for c, _ in results)
    failures = [f for _, fs in results for f in fs]
    defects = sum(1 for f in failures if "control failed" not in f)
    control_failed = len(failures) - defects
    return {
        **gates.report(n, defects),
        "control_failures": control_failed,
        "failures": failures[:FAILURES_KEPT],
        "ok": n > 0 and defects == 0 and control_failed == 0,
    }
