"""A real ``tt-serve serve`` with a disk tier, stopped and started again on the same folder.

After SIGTERM the first repeated conversation is warm (``cached_tokens`` > 0) and gives the
identical answer; after SIGKILL right after a request (write-backs possibly mid-file) nothing
torn is ever read back; a byte flipped in every cache file is a miss and a correct answer.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.test_drain import CLI, wait_health
from tests.server.test_router import ENGINE_FLAGS, free_base

pytestmark = pytest.mark.slow


def _start(demo_dir: Path, port: int, cache: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-c", CLI, "serve", "--model", str(demo_dir), "--served-model-name",
        "demo", "--port", str(port), "--disk-cache-dir", str(cache), "--disk-cache-gb", "1",
        *ENGINE_FLAGS,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _ask(url: str, prompt: str) -> tuple[str, int]:
    body = {"model": "demo", "prompt": prompt, "max_tokens": 12, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    details = out["usage"].get("prompt_tokens_details") or {}
    return out["choices"][0]["text"], int(details.get("cached_tokens") or 0)


def _metric(url: str, name: str) -> float:
    """The sum of a metric's samples over its labels."""
    found, total = False, 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        head = line.split(" ")[0].split("{")[0]
        if head in (f"tt_serve:{name}", f"tt_serve:{name}_total"):
            found, total = True, total + float(line.split()[-1])
    assert found, f"metric {name} not exported"
    return total


def _stop(proc: subprocess.Popen[bytes], sig: int) -> int:
    proc.send_signal(sig)
    return proc.wait(timeout=60)


def test_restart_finds_conversations_warm_and_never_reads_a_bad_file(
    demo_dir: Path, tmp_path: Path
) -> None:
    cache, log = tmp_path / "cache", tmp_path / "server.log"
    cache.mkdir()
    port = free_base(1)
    url = f"http://127.0.0.1:{port}"
    a = "The history of the river: " + " ".join(f"stone {i} fell" for i in range(60))
    b = "A list of tools and their uses: " + " ".join(f"tool {i} cuts" for i in range(60))
    proc = _start(demo_dir, port, cache, log)
    try:
        wait_health(url, proc, 200, log)
        answer_a, cached = _ask(url, a)
        assert cached == 0
        assert _stop(proc, signal.SIGTERM) == 0  # drains, then finishes the write-backs

        proc = _start(demo_dir, port, cache, log)
        wait_health(url, proc, 200, log)
        again, cached = _ask(url, a)
        assert cached > 0 and again == answer_a
        assert _metric(url, "cache_tier_hits") >= 1
        answer_b, _ = _ask(url, b)
        proc.kill()  # SIGKILL right after: write-backs may be mid-file
        proc.wait(timeout=60)

        proc = _start(demo_dir, port, cache, log)
        wait_health(url, proc, 200, log)
        assert _ask(url, b)[0] == answer_b  # warm or cold, never torn
        assert _ask(url, a)[0] == answer_a
        assert _metric(url, "cache_tier_disk_corrupt") == 0
        assert _stop(proc, signal.SIGTERM) == 0

        files = [p for p in cache.rglob("*") if p.suffix in (".unit", ".blk")]
        assert files
        for p in files:  # one byte flipped in every cache file
            raw = bytearray(p.read_bytes())
            raw[len(raw) // 2] ^= 0x01
            p.write_bytes(bytes(raw))
        proc = _start(demo_dir, port, cache, log)
        wait_health(url, proc, 200, log)
        flipped, cached = _ask(url, a)
        assert flipped == answer_a and cached == 0
        assert _metric(url, "cache_tier_disk_corrupt") >= 1
        assert _stop(proc, signal.SIGTERM) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_unwritable_disk_folder_is_a_clear_startup_error(demo_dir: Path, tmp_path: Path) -> None:
    """The server reports the folder and why on /health (as every failed load) and serves
    nothing: never a silent cold start."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    log = tmp_path / "server.log"
    port = free_base(1)
    url = f"http://127.0.0.1:{port}"
    proc = _start(demo_dir, port, blocker / "cache", log)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                r = httpx.get(f"{url}/health", timeout=2)
                if r.json().get("status") == "error":
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the load never failed"
            time.sleep(0.1)
        assert r.status_code == 503
        assert "disk cache directory" in r.json()["detail"]
        assert "not writable" in r.json()["detail"]
    finally:
        proc.kill()
        proc.wait(timeout=30)
