"""Regressions of the HTTP layer, each against a real uvicorn: invalid Unicode, streamed requests
over the queue limit, the queue limit itself, authentication before parsing, strict numeric
fields, 405 headers, the engine counters on /metrics, and non-streamed hang-ups."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, Served, serve
from tests.server.test_errors import assert_error

MAX_WAITING = 4


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def post_raw(c: httpx.Client, path: str, raw: str, **headers: str) -> httpx.Response:
    """Send JSON text as written (escapes such as \\ud800 reach the server unchanged)."""
    return c.post(
        path, content=raw.encode(), headers={"content-type": "application/json", **headers}
    )


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/completions", '{"model": "demo", "prompt": "abc\\ud800def"}'),
        ("/v1/completions", '{"model": "demo", "prompt": ["ok", "x\\udc00"]}'),
        ("/v1/completions", '{"model": "demo", "prompt": "x", "stop": ["\\ud800"]}'),
        (
            "/v1/chat/completions",
            '{"model": "demo", "messages": [{"role": "user", "content": "abc\\ud800def"}]}',
        ),
        (
            "/v1/chat/completions",
            '{"model": "demo", "messages": [{"role": "user", '
            '"content": [{"type": "text", "text": "\\udfff"}]}]}',
        ),
        (
            "/v1/chat/completions",
            '{"model": "demo", "messages": [{"role": "user", "content": "x", "name": "\\ud800"}]}',
        ),
    ],
)
def test_lone_surrogate_is_400(server: Served, path: str, raw: str) -> None:
    with server.client() as c:
        assert_error(post_raw(c, path, raw), 400, "surrogate")


def test_surrogate_pair_is_fine(server: Served) -> None:
    with server.client() as c:
        raw = '{"model": "demo", "prompt": "smile \\ud83d\\ude00", "max_tokens": 2}'
        assert post_raw(c, "/v1/completions", raw).status_code == 200


@pytest.mark.parametrize(
    "field",
    [
        {"n": "2"},
        {"max_tokens": "4"},
        {"temperature": "0.5"},
        {"top_p": "1"},
        {"seed": "3"},
        {"logprobs": "1"},
        {"n": 2.0},
        {"n": True},
        {"stream": "true"},
        {"echo": 1},
        {"prompt": [1, True]},
    ],
)
def test_fields_are_strictly_typed(server: Served, field: dict[str, object]) -> None:
    body = {"model": MODEL_NAME, "prompt": "x", "max_tokens": 2, **field}
    with server.client() as c:
        assert_error(c.post("/v1/completions", json=body), 400, next(iter(field)))


def test_integers_are_numbers(server: Served) -> None:
    with server.client() as c:
        for path, body in [
            ("/v1/completions", {"prompt": "x", "temperature": 1, "top_p": 1}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "x"}], "temperature": 0},
            ),
        ]:
            r = c.post(path, json={"model": MODEL_NAME, "max_tokens": 2, **body})
            assert r.status_code == 200, r.text


def test_405_names_the_allowed_methods(server: Served) -> None:
    with server.client() as c:
        r = c.get("/v1/completions")
        assert_error(r, 405)
        assert r.headers["allow"] == "POST"
        r = c.post("/v1/models")
        assert_error(r, 405)
        assert r.headers["allow"] == "GET"


def test_metrics_export_the_engine_counters(server: Served) -> None:
    with server.client() as c:
        c.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 3})
        m = c.get("/metrics").text
    names = [
        "tt_serve:prefix_cache_queries_total",
        "tt_serve:prefix_cache_hits_total",
        "tt_serve:prefill_tokens_computed_total",
        "tt_serve:decode_tokens_computed_total",
        "tt_serve:pipelined_decode_steps_total",
        "tt_serve:failed_steps_total",
        'tt_serve:sampled_rows_total{where="device"}',
        'tt_serve:sampled_rows_total{where="host"}',
        "tt_serve:num_requests_running",
        "tt_serve:num_requests_waiting",
        "tt_serve:kv_cache_usage_perc",
        "tt_serve:kv_cache_blocks_used",
        "tt_serve:snapshot_slots_used",
        "tt_serve:snapshot_slots_total",
    ]
    values = {n: metric(m, n) for n in names}
    assert values["tt_serve:decode_tokens_computed_total"] >= 2
    assert values["tt_serve:failed_steps_total"] == 0
    sampled = values['tt_serve:sampled_rows_total{where="device"}']
    assert sampled + values['tt_serve:sampled_rows_total{where="host"}'] >= 3
    for histogram in [
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
    ]:
        assert f"tt_serve:{histogram}_count" in m
    for counter in ["prompt_tokens_total", "generation_tokens_total", "request_success_total"]:
        assert f"tt_serve:{counter}" in m


def test_non_streamed_hang_up_aborts(server: Served) -> None:
    body = {"model": MODEL_NAME, "prompt": "go on", "max_tokens": 1900, "ignore_eos": True}
    with server.client() as c:
        before = metric(c.get("/metrics").text, "tt_serve:decode_tokens_computed_total")
        with (
            httpx.Client(base_url=server.url, timeout=1.0) as impatient,
            pytest.raises(httpx.ReadTimeout),
        ):
            impatient.post("/v1/completions", json=body)
        deadline = time.monotonic() + 20
        while metric(m := c.get("/metrics").text, "tt_serve:num_requests_running") != 0:
            assert time.monotonic() < deadline, "the abandoned request kept running"
            time.sleep(0.1)
        computed = metric(m, "tt_serve:decode_tokens_computed_total") - before
    assert computed < 1900


# -- authentication ----------------------------------------------------------------------------


@pytest.mark.slow
def test_auth_before_the_body_is_parsed(demo_dir: Path) -> None:
    with serve(demo_dir, api_key="s3cret", kv_blocks=128) as s, s.client() as c:
        for raw in ["{nope", '{"prompt": 5}', '{"model": "demo", "prompt": "x", "n": "2"}']:
            assert_error(post_raw(c, "/v1/completions", raw), 401)
            assert_error(post_raw(c, "/v1/chat/completions", raw, authorization="Bearer no"), 401)
        key = {"authorization": "Bearer s3cret"}
        assert_error(post_raw(c, "/v1/completions", "{nope", **key), 400)
        ok = post_raw(c, "/v1/completions", '{"prompt": "x", "max_tokens": 1}', **key)
        assert ok.status_code == 200, ok.text
        assert c.get("/metrics").status_code == 200


# -- the waiting queue -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_queue(demo_dir: Path) -> Iterator[tuple[Served, list[int]]]:
    """max_waiting 4 and 2 running; ``peak`` records the engine's waiting count after every
    add, on the engine thread."""
    peak = [0]
    with serve(demo_dir, max_waiting=MAX_WAITING, max_batch_size=2, kv_blocks=256) as s:
        assert s.state.engine is not None
        engine = s.state.engine.engine
        add_request = engine.add_request

        def recording_add(*args: Any, **kw: Any) -> None:
            add_request(*args, **kw)
            peak[0] = max(peak[0], engine.stats().num_waiting)

        engine.add_request = recording_add  # type: ignore[method-assign]
        yield s, peak


async def _one(c: httpx.AsyncClient, i: int, stream: bool) -> int:
    body = {
        "model": MODEL_NAME,
        "prompt": f"request {i} " + "word " * (i % 5),
        "max_tokens": 12,
        "ignore_eos": True,
        "stream": stream,
    }
    async with c.stream("POST", "/v1/completions", json=body) as r:
        raw = await r.aread()
        if r.status_code == 503:
            assert r.headers["retry-after"].isdigit()
            err = json.loads(raw)["error"]
            assert err["code"] == "queue_full" and err["type"] == "server_unavailable", err
            return 503
        assert r.status_code == 200, raw
        if stream:
            events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            for e in events[:-1]:
                assert "error" not in json.loads(e), e
        return 200


def _flood(url: str, stream: bool, n: int = 30) -> list[int]:
    async def main() -> list[int]:
        limits = httpx.Limits(max_connections=n + 4)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
            return await asyncio.gather(*(_one(c, i, stream) for i in range(n)))

    return asyncio.run(main())


@pytest.mark.slow
def test_streams_over_the_queue_limit_get_503(small_queue: tuple[Served, list[int]]) -> None:
    served, _ = small_queue
    codes = _flood(served.url, stream=True)
    assert 503 in codes and 200 in codes, codes


@pytest.mark.slow
def test_waiting_never_exceeds_max_waiting(small_queue: tuple[Served, list[int]]) -> None:
    served, peak = small_queue
    seen: list[float] = []
    done = threading.Event()

    def scrape() -> None:
        with served.client() as c:
            while not done.is_set():
                seen.append(metric(c.get("/metrics").text, "tt_serve:num_requests_waiting"))

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for stream in (False, True, False):
            codes = _flood(served.url, stream=stream)
            assert 200 in codes, codes
    finally:
        done.set()
        scraper.join()
    assert 0 < peak[0] <= MAX_WAITING
    assert seen and max(seen) <= MAX_WAITING
    assert served.state.engine is not None and served.state.engine.num_queued == 0
