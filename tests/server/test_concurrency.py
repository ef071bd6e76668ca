"""32 concurrent streaming clients, 8 of which hang up mid-stream: the rest finish correctly and
the server returns to its idle baseline (no running requests, no KV blocks held)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, Served

pytestmark = pytest.mark.slow

MAX_TOKENS = 24


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


async def stream_one(c: httpx.AsyncClient, prompt: str, hang_up: bool) -> str | None:
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    text, chunks = [], 0
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            payload = json.loads(data)
            assert "error" not in payload, payload
            text.append(payload["choices"][0]["text"])
            chunks += 1
            if hang_up and chunks == 3:
                return None  # leaves the context: the connection closes mid-stream
    return "".join(text)


def test_disconnects_free_everything(server: Served) -> None:
    prompts = [f"client {i}: " + "lorem ipsum " * (5 + i) for i in range(32)]
    hang = {i for i in range(32) if i % 4 == 0}

    async def main() -> list[str | None]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as c:
            return await asyncio.gather(
                *(stream_one(c, p, i in hang) for i, p in enumerate(prompts))
            )

    results = asyncio.run(main())
    with server.client() as c:
        for i, (p, got) in enumerate(zip(prompts, results, strict=True)):
            if i in hang:
                assert got is None
                continue
            ref = c.post(
                "/v1/completions",
                json={
                    "model": MODEL_NAME,
                    "prompt": p,
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            ).json()
            assert got == ref["choices"][0]["text"]
        deadline = time.monotonic() + 30
        while True:
            m = c.get("/metrics").text
            idle = (
                metric(m, "tt_serve:num_requests_running") == 0
                and metric(m, "tt_serve:num_requests_waiting") == 0
                and metric(m, "tt_serve:kv_cache_usage_perc") == 0
            )
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert idle, m
        assert metric(m, "tt_serve:snapshot_slots_used") <= metric(
            m, "tt_serve:snapshot_slots_total"
        )
        aborted = re.search(r'tt_serve:request_success_total\{finished_reason="length"\} (\S+)', m)
        assert aborted and float(aborted.group(1)) >= 24
