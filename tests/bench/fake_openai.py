"""A tiny fake OpenAI-compatible completions server with canned, deliberately broken behaviours,
for proving the prefix-hit equivalence checker non-blind.

Greedy "tokens" are a deterministic function of the prompt. A prompt whose first ``block`` ids
were seen before reports ``cached_tokens`` = the largest block multiple below its length.

Modes: ``correct`` (warm equals cold), ``corrupt`` (a warm hit returns different tokens, as a
server restoring a corrupted state would), ``nohit`` (never reports cached tokens), ``empty``
(returns no tokens).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES = ("correct", "corrupt", "nohit", "empty")


def _tokens(prompt: list[int], n: int, salt: str = "") -> list[str]:
    h = hashlib.sha256((salt + json.dumps(prompt)).encode()).hexdigest()
    return [f"t{int(h[i % 60 : i % 60 + 4], 16)}" for i in range(n)]


class _State:
    def __init__(self, mode: str, block: int) -> None:
        self.mode = mode
        self.block = block
        self.seen: set[tuple[int, ...]] = set()
        self.lock = threading.Lock()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = [int(t) for t in body["prompt"]]
        n = int(body.get("max_tokens", 16))
        key = tuple(prompt[: self.block])
        with self.lock:
            hit = key in self.seen and len(prompt) > self.block
            self.seen.add(key)
        cached = (len(prompt) - 1) // self.block * self.block if hit else 0
        if self.mode == "nohit":
            cached = 0
        toks = _tokens(prompt, n)
        if self.mode == "corrupt" and cached:
            toks = _tokens(prompt, n, salt="corrupted-state")
        if self.mode == "empty":
            toks = []
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "text": "".join(toks),
                    "logprobs": {
                        "tokens": toks,
                        "token_logprobs": [-0.5] * len(toks),
                        "top_logprobs": [{t: -0.5} for t in toks],
                        "text_offset": list(range(len(toks))),
                    },
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(toks),
                "total_tokens": len(prompt) + len(toks),
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }


@contextmanager
def fake_server(mode: str, block: int = 16) -> Iterator[str]:
    """Serve on 127.0.0.1 (ephemeral port); yields the base URL."""
    if mode not in MODES:
        raise ValueError(mode)
    state = _State(mode, block)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length))
            data = json.dumps(state.complete(body)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
