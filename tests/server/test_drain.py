"""Graceful drain of a real ``tt-serve serve`` process: SIGTERM while 8 streams run.

All 8 finish with a finish_reason and ``[DONE]``; meanwhile /health and new requests get 503;
then the process exits on its own (0) well inside the drain bound.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.test_router import ENGINE_FLAGS, free_base

pytestmark = pytest.mark.slow

CLI = "import sys; from tt_serve.cli import main; sys.exit(main(sys.argv[1:]))"
STREAMS = 8
DRAIN_BOUND_S = 60


def stream(url: str, out: dict[str, object], started: threading.Event) -> None:
    body = {
        "model": "demo",
        "prompt": "Count slowly:",
        "max_tokens": 300,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    finish, done, chunks = None, False, 0
    with httpx.Client(timeout=120) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunks += 1
            started.set()
            choice = json.loads(line[6:])["choices"][0]
            finish = choice["finish_reason"] or finish
    out.update(finish=finish, done=done, chunks=chunks, ended=time.monotonic())


def test_sigterm_drains_eight_streams_then_exits(demo_dir: Path, tmp_path: Path) -> None:
    port = free_base(1)
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("wb")
    cmd = [
        sys.executable, "-c", CLI, "serve", "--model", str(demo_dir), "--served-model-name",
        "demo", "--port", str(port), "--drain-timeout", str(DRAIN_BOUND_S), *ENGINE_FLAGS,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.2)

        results: list[dict[str, object]] = [{} for _ in range(STREAMS)]
        events = [threading.Event() for _ in range(STREAMS)]
        threads = [
            threading.Thread(target=stream, args=(url, results[i], events[i]), daemon=True)
            for i in range(STREAMS)
        ]
        for t in threads:
            t.start()
        for e in events:
            assert e.wait(60), "a stream did not start"

        proc.send_signal(signal.SIGTERM)
        t_term = time.monotonic()
        with httpx.Client(timeout=10) as c:
            while (health := c.get(f"{url}/health")).status_code == 200:
                assert time.monotonic() - t_term < 10, "SIGTERM did not start the drain"
                time.sleep(0.02)
            assert health.status_code == 503 and health.json()["status"] == "draining"
            refused = c.post(
                f"{url}/v1/completions", json={"model": "demo", "prompt": "x", "max_tokens": 2}
            )
            refused_at = time.monotonic()
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "draining"
        assert refused.headers.get("retry-after")

        for t in threads:
            t.join(timeout=DRAIN_BOUND_S)
        assert all(r.get("status") == 200 for r in results), results
        assert [r["finish"] for r in results] == ["length"] * STREAMS, results
        assert all(r["done"] and int(r["chunks"]) > 0 for r in results), results  # type: ignore[call-overload]
        # The refusal came while streams were still running.
        assert refused_at < max(float(r["ended"]) for r in results)  # type: ignore[arg-type]
        assert proc.wait(timeout=DRAIN_BOUND_S) == 0
        assert time.monotonic() - t_term < DRAIN_BOUND_S
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def start_server(
    demo_dir: Path, port: int, log_path: Path, drain_s: int
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-c", CLI, "serve", "--model", str(demo_dir), "--served-model-name",
        "demo", "--port", str(port), "--drain-timeout", str(drain_s), *ENGINE_FLAGS,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)


def wait_health(url: str, proc: subprocess.Popen[bytes], want: int, log_path: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == want:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"/health never answered {want}"
        time.sleep(0.02)


def test_drain_bound_ends_long_requests_with_an_openai_error(
    demo_dir: Path, tmp_path: Path
) -> None:
    """Past --drain-timeout a stream still running ends with an error event and [DONE], and a
    non-streaming request gets a JSON error body; the server exits at the bound (it used to
    wait 5 s more, then cancel both: a cut chunked stream and a plain-text 500)."""
    bound, port = 2, free_base(1)
    url, log_path = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    proc = start_server(demo_dir, port, log_path, bound)
    try:
        wait_health(url, proc, 200, log_path)
        body = {"model": "demo", "prompt": "x", "max_tokens": 1900, "ignore_eos": True}
        got: dict[str, object] = {}
        started = threading.Event()

        def streamed() -> None:
            with httpx.stream(
                "POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=60
            ) as r:
                lines = []
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        started.set()
                got["stream"] = lines

        def whole() -> None:
            got["plain"] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)

        threads = [threading.Thread(target=f, daemon=True) for f in (streamed, whole)]
        for t in threads:
            t.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        t_term = time.monotonic()
        for t in threads:
            t.join(timeout=30)
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - t_term < bound + 3
        lines = got["stream"]
        assert isinstance(lines, list) and lines[-1] == "data: [DONE]"
        assert "drain bound" in json.loads(lines[-2][6:])["error"]["message"]
        plain = got["plain"]
        assert isinstance(plain, httpx.Response) and plain.status_code == 500
        assert "drain bound" in plain.json()["error"]["message"]
        assert "Traceback" not in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_sigterm_while_the_model_loads_exits_zero(demo_dir: Path, tmp_path: Path) -> None:
    """It used to exit under the load thread, inside torch: SIGABRT (-6), 'terminate called'."""
    port = free_base(1)
    url, log_path = f"http://127.0.0.1:{port}", tmp_path / "server.log"
    proc = start_server(demo_dir, port, log_path, 30)
    try:
        wait_health(url, proc, 503, log_path)  # answering, still loading
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text()
        assert "terminate called" not in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
