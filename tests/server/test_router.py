"""Two tiny replicas behind the pinned sglang-router (scripts/serve-replicas), on loopback, driven
with the official ``openai`` client; then Ctrl-C stops the lot.

The router binary comes from the ``sglang-router`` wheel in the ``test`` extra (PyPI); the
replicas are real ``tt-serve serve`` processes on the demo model written by the conftest.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.server.conftest import Served, serve

ROOT = Path(__file__).resolve().parents[2]
SMG = Path(sys.executable).parent / "smg"
# The same engine sizes as the conftest's in-process server (engine_options).
ENGINE_FLAGS = [
    "--block-size", "16", "--prefill-chunk", "64", "--kv-blocks", "1024",
    "--snapshot-slots", "16", "--max-batch-size", "16", "--max-num-batched-tokens", "512",
    "--max-model-len", "2048", "--log-level", "warning",
]  # fmt: skip

pytestmark = pytest.mark.skipif(not SMG.exists(), reason="sglang-router not installed")


def free_base(n: int) -> int:
    """A port with n free ports from it on (the router, its metrics, then the workers)."""
    for _ in range(200):
        base = random.randrange(20000, 60000)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


@pytest.fixture(scope="module")
def routed(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    tmp = tmp_path_factory.mktemp("replicas")
    base = free_base(4)
    state = tmp / "state.json"
    cmd = [
        sys.executable, str(ROOT / "scripts/serve-replicas"), "--replicas", "2",
        "--port", str(base), "--prometheus-port", str(base + 1),
        "--worker-base-port", str(base + 2), "--threads", "1", "--drain-timeout", "10",
        "--state-file", str(state), "--log-dir", str(tmp / "logs"), "--start-timeout", "120",
        "--", "--model", str(demo_dir), "--served-model-name", "demo", *ENGINE_FLAGS,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 150
    while not state.exists():
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert time.monotonic() < deadline, "replicas did not start"
        time.sleep(0.2)
    info = {**json.loads(state.read_text()), "proc": proc}
    try:
        yield info
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def single(demo_dir: Path) -> Iterator[Served]:
    with serve(demo_dir) as s:
        yield s


@pytest.mark.slow
def test_greedy_output_equals_a_single_servers(routed: dict[str, object], single: Served) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    via = client(str(routed["router"]))
    direct = client(single.url)
    for prompt in prompts:
        kw = dict(model="demo", prompt=prompt, max_tokens=12, temperature=0)
        a = via.completions.create(**kw)  # type: ignore[call-overload]
        b = direct.completions.create(**kw)  # type: ignore[call-overload]
        assert a.choices[0].text == b.choices[0].text and a.choices[0].text
        assert a.choices[0].finish_reason == b.choices[0].finish_reason == "length"
    messages = [{"role": "user", "content": "Say something."}]
    a_chat = via.chat.completions.create(
        model="demo", messages=messages, max_tokens=8, temperature=0
    )  # type: ignore[arg-type]
    b_chat = direct.chat.completions.create(
        model="demo", messages=messages, max_tokens=8, temperature=0
    )  # type: ignore[arg-type]
    assert a_chat.choices[0].message.content == b_chat.choices[0].message.content


@pytest.mark.slow
def test_agent_second_turn_hits_the_replica_holding_its_prefix(routed: dict[str, object]) -> None:
    via = client(str(routed["router"]))
    head = "You are a careful agent. Tools: search, read, write. " * 12  # > 2 chunks of 64
    turn1 = head + "User: find the file."
    first = via.completions.create(model="demo", prompt=turn1, max_tokens=8, temperature=0)
    assert first.usage is not None and first.usage.prompt_tokens > 128
    turn2 = turn1 + first.choices[0].text + "\nTool: found it. User: now read it."
    second = via.completions.create(model="demo", prompt=turn2, max_tokens=8, temperature=0)
    details = second.usage.prompt_tokens_details if second.usage else None
    assert details is not None and details.cached_tokens is not None
    assert details.cached_tokens > 0, "turn 2 went to a replica without turn 1's prefix"


@pytest.mark.slow
def test_streaming_through_the_router(routed: dict[str, object], single: Served) -> None:
    via = client(str(routed["router"]))
    kw = dict(model="demo", prompt="Streaming works when", max_tokens=10, temperature=0)
    chunks = list(via.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert text == client(single.url).completions.create(**kw).choices[0].text  # type: ignore[call-overload]
    chat = via.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
    )
    finishes = [c.choices[0].finish_reason for c in chat if c.choices]
    assert finishes[-1] == "length" and len(finishes) >= 6


@pytest.mark.slow
def test_router_lists_the_served_model(routed: dict[str, object]) -> None:
    """The worker's /get_model_info gives the router the real model name (not "unknown")."""
    ids = [m.id for m in client(str(routed["router"])).models.list().data]
    assert ids == ["demo"]


@pytest.mark.slow
def test_ctrl_c_stops_router_and_replicas(routed: dict[str, object]) -> None:
    proc = routed["proc"]
    assert isinstance(proc, subprocess.Popen)
    pids = [int(w["pid"]) for w in routed["workers"]] + [int(routed["router_pid"])]  # type: ignore[attr-defined]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_port_in_use_is_named_and_nothing_starts(tmp_path: Path) -> None:
    """It used to start the workers, let one die on the taken port, and report only 'a worker
    exited with 3 while starting' (or, were the port an HTTP server, route to it)."""
    base = free_base(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 3))
        taken.listen()
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts/serve-replicas"), "--replicas", "2",
             "--port", str(base), "--prometheus-port", str(base + 1),
             "--worker-base-port", str(base + 2), "--log-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"worker 1 port 127.0.0.1:{base + 3}" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())  # no process was started


@pytest.mark.slow
def test_second_ctrl_c_cuts_the_workers_drain_short(demo_dir: Path, tmp_path: Path) -> None:
    """The first Ctrl-C drains (up to --drain-timeout, here 60 s); a second one is passed on to
    the workers, which end their requests with an error and exit."""
    base, state = free_base(3), tmp_path / "state.json"
    cmd = [
        sys.executable, str(ROOT / "scripts/serve-replicas"), "--replicas", "1",
        "--port", str(base), "--prometheus-port", str(base + 1),
        "--worker-base-port", str(base + 2), "--drain-timeout", "60",
        "--state-file", str(state), "--start-timeout", "120",
        "--", "--model", str(demo_dir), "--served-model-name", "demo", *ENGINE_FLAGS,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 150
        while not state.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "replicas did not start"
            time.sleep(0.2)
        worker = json.loads(state.read_text())["workers"][0]["url"]
        stream = client(worker).completions.create(
            model="demo", prompt="x", max_tokens=1900, stream=True, extra_body={"ignore_eos": True}
        )
        next(iter(stream))
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        t_second = time.monotonic()
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in stream:
                pass
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - t_second < 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
