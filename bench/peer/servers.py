"""One server of either kind: its command line, environment, request extras and greedy probe;
started on a free loopback port, waited for on ``/health`` (bounded), always stopped.

Both kinds get the same thread count: tt-serve through ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
(torch's intra-op pool), llama-server through ``-t T -tb T``. llama-server divides ``-c`` by
``--parallel``, so its context is ``parallel x`` the longest request of the measures it serves.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

from bench.common.provenance import REPO_ROOT
from bench.load.generator import post

CTX_ALIGN = 256
"""llama-server context per slot is rounded up to a multiple of this."""


@dataclass(frozen=True)
class Slots:
    """What one group of measures needs from a server."""

    parallel: int
    """Concurrent requests (llama-server ``--parallel``)."""
    per_slot: int
    """Prompt + output tokens of the longest request."""

    def llama_ctx(self) -> int:
        per = -(-(self.per_slot + 16) // CTX_ALIGN) * CTX_ALIGN
        return self.parallel * per


@dataclass
class Probe:
    """A greedy run with top-k logprobs: ids, the top-k tokens per step (as text, best first) and
    the logprob of each chosen token."""

    ids: list[int]
    top: list[list[str]]
    logprobs: list[float | None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TtServeSide:
    """tt-serve (``python -m tt_serve.cli serve``) on the same checkpoint."""

    model: str
    threads: int
    extra: list[str] = field(default_factory=list)
    label: str = "tt-serve"
    kind: str = "tt-serve"
    python: str = sys.executable

    def command(self, port: int, slots: Slots) -> list[str]:
        del slots  # tt-serve's defaults already serve 32 concurrent requests on torch
        return [
            self.python,
            "-m",
            "tt_serve.cli",
            "serve",
            "--model",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *self.extra,
        ]

    def env(self) -> dict[str, str]:
        t = str(self.threads)
        return dict(os.environ, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t)

    def request_extras(self, cold: bool) -> dict[str, Any]:
        del cold  # fresh random prompts miss tt-serve's prefix cache anyway
        return {}

    async def greedy_probe(
        self, client: httpx.AsyncClient, prompt: list[int], n: int, k: int
    ) -> Probe:
        body = {
            "prompt": prompt,
            "max_tokens": n,
            "temperature": 0.0,
            "logprobs": k,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        resp = await post(client, "/v1/completions", body)
        resp.raise_for_status()
        choice = resp.json()["choices"][0]
        lp = choice.get("logprobs") or {}
        tops = [
            [t for t, _ in sorted(d.items(), key=lambda kv: -kv[1])][:k]
            for d in lp.get("top_logprobs") or []
        ]
        return Probe(
            list(choice.get("token_ids") or []), tops, list(lp.get("token_logprobs") or [])
        )

    def describe(self, slots: Slots) -> dict[str, Any]:
        flags = self.command(0, slots)[4:]
        return {
            "kind": self.kind,
            "flags": _without_port([Path(a).name if a == self.model else a for a in flags]),
            "threads_env": {"OMP_NUM_THREADS": self.threads, "MKL_NUM_THREADS": self.threads},
        }


@dataclass
class LlamaServerSide:
    """llama.cpp's ``llama-server`` on a GGUF of the same checkpoint."""

    binary: str
    gguf: str
    threads: int
    render: Callable[[int], str] = str
    """Token id -> the text tt-serve's logprobs use for it (to compare top-k lists)."""
    extra: list[str] = field(default_factory=list)
    label: str = "llama.cpp"
    kind: str = "llama-server"
    _help: str | None = None

    def help_text(self) -> str:
        if self._help is None:
            res = subprocess.run(
                [self.binary, "--help"], capture_output=True, text=True, timeout=60, check=False
            )
            self._help = res.stdout + res.stderr
        return self._help

    def version(self) -> str:
        try:
            res = subprocess.run(
                [self.binary, "--version"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unknown ({type(exc).__name__})"
        lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
        found = [ln for ln in lines if ln.startswith("version")]
        return (found or lines or ["unknown"])[0]

    def command(self, port: int, slots: Slots) -> list[str]:
        t = str(self.threads)
        cmd = [
            self.binary,
            "-m",
            self.gguf,
            "-t",
            t,
            "-tb",
            t,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(slots.llama_ctx()),
            "--parallel",
            str(slots.parallel),
        ]
        if "--no-webui" in self.help_text():
            cmd.append("--no-webui")
        return cmd + self.extra

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def request_extras(self, cold: bool) -> dict[str, Any]:
        # cache_prompt is llama-server's prefix reuse (on by default); a cold measure turns it off.
        return {"cache_prompt": not cold}

    async def greedy_probe(
        self, client: httpx.AsyncClient, prompt: list[int], n: int, k: int
    ) -> Probe:
        # The native endpoint takes token ids and returns the generated ids and per-step top-k
        # (pre-sampling probabilities of the full distribution, as logprobs).
        body = {
            "prompt": prompt,
            "n_predict": n,
            "temperature": 0.0,
            "n_probs": k,
            "return_tokens": True,
            "ignore_eos": True,
            "cache_prompt": False,
            "stream": False,
        }
        resp = await post(client, "/completion", body)
        resp.raise_for_status()
        data = resp.json()
        steps = data.get("completion_probabilities") or []
        ids = list(data.get("tokens") or [int(s["id"]) for s in steps])
        tops = []
        for s in steps:
            seen: list[str] = []
            for p in s.get("top_logprobs") or []:
                text = self.render(int(p["id"]))
                if text not in seen:  # tt-serve keys its top-k by text: equal texts merge
                    seen.append(text)
            tops.append(seen[:k])
        return Probe(ids, tops, [s.get("logprob") for s in steps])

    def describe(self, slots: Slots) -> dict[str, Any]:
        flags = self.command(0, slots)[1:]
        return {
            "kind": self.kind,
            "binary": Path(self.binary).name,
            "version": self.version(),
            "gguf": file_identity(self.gguf),
            "flags": _without_port([Path(a).name if a == self.gguf else a for a in flags]),
        }


def _without_port(flags: list[str]) -> list[str]:
    """Flags as recorded: the (per-start, random) port left out."""
    if "--port" in flags:
        i = flags.index("--port")
        return flags[:i] + flags[i + 2 :]
    return flags


Side = TtServeSide | LlamaServerSide


def file_identity(path: str, whole_below: int = 1 << 30) -> dict[str, Any]:
    """Name, size and sha256 (of the whole file below ``whole_below`` bytes, else of its first
    64 MiB) of a model file."""
    p = Path(path)
    size = p.stat().st_size
    h = hashlib.sha256()
    limit = size if size < whole_below else 64 << 20
    with p.open("rb") as fh:
        left = limit
        while left > 0:
            buf = fh.read(min(left, 8 << 20))
            if not buf:
                break
            h.update(buf)
            left -= len(buf)
    key = "sha256" if limit == size else "sha256_first_64MiB"
    return {"name": p.name, "bytes": size, key: h.hexdigest()}


class Running:
    """One started server. Use as a context manager: it is always stopped on exit."""

    def __init__(self, side: Side, slots: Slots, log_path: Path) -> None:
        self.side, self.slots, self.log_path = side, slots, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = side.command(self.port, slots)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = log_path.open("ab")
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=REPO_ROOT,
            env=side.env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.side.label} exited during startup (rc {self.proc.returncode}); "
                    f"log {self.log_path}:\n{self.tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.side.label} not healthy after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, grace: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
