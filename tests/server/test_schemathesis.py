"""Property-based fuzzing of the live server from its own OpenAPI schema (positive and negative
cases): no 5xx, and every 4xx carries its API's error body (OpenAI's; Anthropic's under
/v1/messages)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from tests.server.conftest import Served, serve

pytestmark = pytest.mark.slow

EXAMPLES = {
    "/v1/completions": 300,
    "/v1/chat/completions": 240,
    "/v1/responses": 200,
    "/v1/messages": 200,
    "/v1/messages/count_tokens": 60,
    "/tokenize": 60,
}
OTHER_EXAMPLES = 20


@pytest.fixture(scope="module")
def small_server(demo_dir: Path) -> Iterator[Served]:
    # A short context keeps valid fuzzed requests cheap: huge max_tokens is rejected as 400.
    with serve(demo_dir, max_model_len=96, kv_blocks=256, max_batch_size=16) as s:
        yield s


def test_fuzz_no_5xx_and_error_bodies(small_server: Served) -> None:
    schema = schemathesis.openapi.from_url(f"{small_server.url}/openapi.json")
    total = 0
    failures: list[str] = []
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            n = EXAMPLES.get(op.path, OTHER_EXAMPLES) // 2

            @settings(
                max_examples=n,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def check(case: schemathesis.Case) -> None:
                nonlocal total
                total += 1
                resp = case.call(base_url=small_server.url, timeout=120)
                where = f"{case.method} {case.path} body={case.body!r}"[:400]
                if resp.status_code >= 500:
                    failures.append(f"{resp.status_code} for {where}: {resp.text[:200]}")
                elif resp.status_code >= 400:
                    body = resp.json()
                    err = body.get("error")
                    want = {"message", "type", "param", "code"}
                    if case.path.startswith("/v1/messages"):
                        want = {"type", "message"}
                        if body.get("type") != "error":
                            err = None
                    if not isinstance(err, dict) or set(err) != want:
                        failures.append(f"{resp.status_code} without error body: {where}")

            try:
                check()
            except Unsatisfiable:
                # An operation with no inputs has no negative cases to generate.
                assert mode is GenerationMode.NEGATIVE, op.path
    assert not failures, "\n".join(failures[:10])
    assert total >= 900, total
