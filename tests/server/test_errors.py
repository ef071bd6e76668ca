"""Every error carries the OpenAI error body; client input never yields a 500."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, Served, serve


def assert_error(r: httpx.Response, status: int, needle: str = "") -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert needle.lower() in err["message"].lower()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": MODEL_NAME, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL_NAME, "prompt": "x", "temperature": -1}, "temperature"),
        ({"model": MODEL_NAME, "prompt": ""}, "empty"),
        ({"model": MODEL_NAME, "prompt": []}, "empty"),
        ({"model": MODEL_NAME, "prompt": [[]]}, "empty"),
        ({"model": MODEL_NAME, "prompt": [999999999]}, "vocabulary"),
        ({"model": MODEL_NAME, "prompt": "x", "max_tokens": 10**6}, "context length"),
        ({"model": MODEL_NAME, "prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"model": MODEL_NAME, "prompt": "x", "n": 1000}, "n"),
        ({"model": MODEL_NAME, "prompt": "x", "stop": [""]}, "stop"),
        ({"model": MODEL_NAME}, "prompt"),
        ({"model": MODEL_NAME, "prompt": {"a": 1}}, "prompt"),
    ],
)
def test_completion_validation(server: Served, body: dict[str, object], needle: str) -> None:
    with server.client() as c:
        assert_error(c.post("/v1/completions", json=body), 400, needle)


def test_malformed_json_and_unknown_routes(server: Served) -> None:
    with server.client() as c:
        assert_error(
            c.post(
                "/v1/completions", content=b"{nope", headers={"content-type": "application/json"}
            ),
            400,
        )
        assert_error(c.get("/v1/nothing-here"), 404)
        assert_error(
            c.post("/v1/completions", json={"model": "other", "prompt": "x"}), 404, "does not exist"
        )
        assert_error(
            c.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": []}), 400
        )
        assert_error(
            c.post(
                "/v1/chat/completions",
                json={"model": MODEL_NAME, "messages": [{"role": "wizard", "content": "x"}]},
            ),
            400,
        )


def test_body_too_large(server: Served) -> None:
    with server.client() as c:
        big = b'{"prompt": "' + b"a" * (9 << 20) + b'"}'
        assert_error(
            c.post("/v1/completions", content=big, headers={"content-type": "application/json"}),
            413,
        )


def test_api_key(demo_dir: Path) -> None:
    with serve(demo_dir, api_key="s3cret", kv_blocks=128) as s, s.client() as c:
        assert_error(c.get("/v1/models"), 401)
        assert_error(c.get("/v1/models", headers={"authorization": "Bearer wrong"}), 401)
        ok = c.get("/v1/models", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/health").status_code == 200


def test_not_ready_is_503(demo_dir: Path) -> None:
    with serve(demo_dir, load=False) as s, s.client() as c:
        assert c.get("/health").status_code == 503
        assert_error(
            c.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "x"}), 503, "not ready"
        )


@pytest.mark.slow
def test_queue_full_is_503(demo_dir: Path) -> None:
    with serve(demo_dir, max_waiting=0, kv_blocks=128) as s, s.client() as c:
        assert_error(
            c.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "x"}), 503, "queue"
        )
