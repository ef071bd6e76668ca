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

from tests.server.test_router import ENGINE_FLAGS, free_base

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
