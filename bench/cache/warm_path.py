"""Where a prefix-cache hit's TTFT goes: the engine's step, the server's path, the client.

The peer harness's ``prefix`` measure (``bench/peer``) compares warm / cold TTFT through HTTP.
On the demo model a warm hit is ~10 ms end to end, so fixed costs that a cold 4,096-token
prefill hides decide the ratio. This bench splits the warm TTFT into three parts, measured
side by side in one run (interleaved rounds, the order alternating):

* ``client``: the load generator's own floor: the same client (``bench.load.generator._one``, httpx,
  streaming) and the same request bodies against a no-op SSE server (a subprocess) that answers
  each body with one chunk at once;
* ``engine``: the in-process engine (``LLM``'s, same checkpoint and precision): ``add_request``
  to the request's first token, cold (a fresh head + suffix) and warm (the same head, another
  suffix);
* ``http``: a ``tt-serve serve`` subprocess, the same cold / warm pairs through HTTP.

``server = http - client - engine`` is what the HTTP layer and the thread hand-off add (body
parse and validation, the submit, waking the engine thread, the first SSE chunk); the ledger
line also gives the warm / cold ratio that the HTTP path would reach without it, and without
the client floor. One line to ``bench/runs/warm-path.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.cache.warm_path [--tt-args "--dtype bfloat16"] [--head 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common.provenance import REPO_ROOT, append_ledger, arguments
from bench.load.generator import RequestRecord, _one
from bench.peer.harness import vocab_range
from bench.peer.measures import Prompts
from bench.peer.servers import Running, Slots, TtServeSide

LEDGER = REPO_ROOT / "bench" / "runs" / "warm-path.jsonl"
LOGS = REPO_ROOT / "bench" / "out" / "warm-path"


# -- the no-op server ----------------------------------------------------------------------------

_CHUNK = b'data: {"choices":[{"index":0,"text":"x","finish_reason":"length"}]}\n\n'
_TAIL = (
    b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: [DONE]\n\n'
)


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 with keep-alive: every request gets 200; a POST gets the body read whole, then
    one SSE chunk and the usage chunk."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            size = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    size = int(value)
            if size:
                await reader.readexactly(size)
            if lines[0].startswith("POST"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n" + _chunked(_CHUNK)
                )
                await writer.drain()
                writer.write(_chunked(_TAIL) + b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve_null(port: int) -> None:
    server = await asyncio.start_server(_answer, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@dataclass
class NullSide:
    """The no-op server as a ``Running`` side."""

    label: str = "no-op server"

    def command(self, port: int, slots: Slots) -> list[str]:
        del slots
        return [sys.executable, "-m", "bench.cache.warm_path", "--serve-null", str(port)]

    def env(self) -> dict[str, str]:
        return dict(os.environ)


# -- the measures ---------------------------------------------------------------------------------


def _body(prompt: list[int]) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _ttft(client: httpx.AsyncClient, prompt: list[int]) -> tuple[float, int | None]:
    rec = RequestRecord(0, 0, len(prompt), "")
    await _one(client, rec, _body(prompt), time.perf_counter())
    if rec.error or rec.ttft is None:
        raise RuntimeError(f"request failed: {rec.error}")
    return rec.ttft, rec.cached_tokens


async def _http_pairs(url: str, prompts: Prompts, a: argparse.Namespace) -> dict[str, Any]:
    """For each of ``heads`` fresh heads: one cold request (head + a suffix), then warm ones
    (the same head, other suffixes), ``requests`` in all: median TTFTs in ms."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await _ttft(client, prompts.ids(32, "warmup"))  # the connection, and a first request
        cold, warm, cached = [], [], []
        for i, head in enumerate(_heads(prompts, a)):
            cold.append((await _ttft(client, head + prompts.ids(a.suffix, f"h{i}-cold")))[0])
            for j in range(a.requests // a.heads):
                t, c = await _ttft(client, head + prompts.ids(a.suffix, f"h{i}-warm{j}"))
                warm.append(t)
                cached.append(c or 0)
    return {
        "cold_ms": statistics.median(cold) * 1e3,
        "warm_ms": statistics.median(warm) * 1e3,
        "warm_cached_tokens": min(cached),
    }


def _heads(prompts: Prompts, a: argparse.Namespace) -> list[list[int]]:
    return [prompts.ids(a.head, f"h{i}") for i in range(a.heads)]


def _engine_pairs(llm: Any, prompts: Prompts, a: argparse.Namespace) -> dict[str, Any]:
    """The same pairs through the in-process engine: add_request -> the first token, in ms."""
    from tt_serve.sequence import SamplingParams

    engine = llm.engine
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    ids = itertools.count()

    def first_token(prompt: list[int]) -> float:
        rid = f"warm-path-{next(ids)}"
        t = time.perf_counter()
        engine.add_request(rid, prompt, params)
        while engine.has_unfinished():
            for out in engine.step():
                if out.request_id == rid and out.error:
                    raise RuntimeError(out.error)
        return time.perf_counter() - t

    first_token(prompts.ids(32, "warmup"))
    cold, warm = [], []
    for i, head in enumerate(_heads(prompts, a)):
        cold.append(first_token(head + prompts.ids(a.suffix, f"h{i}-cold")))
        warm += [
            first_token(head + prompts.ids(a.suffix, f"h{i}-warm{j}"))
            for j in range(a.requests // a.heads)
        ]
    return {"cold_ms": statistics.median(cold) * 1e3, "warm_ms": statistics.median(warm) * 1e3}


async def _client_floor(url: str, prompts: Prompts, a: argparse.Namespace) -> dict[str, Any]:
    """The client against the no-op server, bodies of the warm requests' size: TTFT in ms."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await _ttft(client, prompts.ids(32, "warmup"))
        got = [
            (await _ttft(client, prompts.ids(a.head + a.suffix, f"floor{j}")))[0]
            for j in range(a.requests)
        ]
    return {"warm_ms": statistics.median(got) * 1e3}


# -- the run --------------------------------------------------------------------------------------


def _split(r: dict[str, dict[str, Any]]) -> dict[str, float]:
    http, engine, client = r["http"], r["engine"], r["client"]
    server = http["warm_ms"] - client["warm_ms"] - engine["warm_ms"]
    return {
        "http_warm_over_cold": http["warm_ms"] / http["cold_ms"],
        "engine_warm_over_cold": engine["warm_ms"] / engine["cold_ms"],
        "server_ms": server,
        # the HTTP ratio without the client's floor (a client that cost nothing)
        "http_warm_over_cold_net_of_client": (http["warm_ms"] - client["warm_ms"])
        / (http["cold_ms"] - client["warm_ms"]),
    }


def _in_process(model: str, flags: list[str]) -> Any:
    """``LLM`` with the configuration ``tt-serve serve --model MODEL FLAGS`` would have."""
    from tt_serve.config import ServeConfig, add_serve_arguments
    from tt_serve.llm import LLM

    parser = argparse.ArgumentParser(prog="--tt-args")
    add_serve_arguments(parser)
    cfg = ServeConfig.from_args(parser.parse_args(["--model", model, *flags]))
    options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "model"}
    return LLM(model, **options)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cache.warm_path", description=__doc__)
    ap.add_argument("--serve-null", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--model", help="checkpoint folder (default: the demo model)")
    ap.add_argument(
        "--tt-args",
        default="",
        help="serve flags for both the server and the in-process engine, e.g. '--dtype bfloat16'",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--head", type=int, default=4096)
    ap.add_argument("--suffix", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4, help="cold requests per round and part")
    ap.add_argument("--requests", type=int, default=24, help="warm requests per round and part")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    ap.add_argument("--no-ledger", action="store_true")
    ap.add_argument("--log-dir", type=Path, default=LOGS, help="the servers' logs")
    a = ap.parse_args(argv)
    if a.heads < 1 or a.requests < a.heads:
        ap.error("--heads must be at least 1 and at most --requests")
    if a.serve_null is not None:
        asyncio.run(_serve_null(a.serve_null))
        return 0

    import torch

    from tt_serve.demo import ensure_demo_model

    model = a.model or str(ensure_demo_model())
    torch.set_num_threads(a.threads)
    slots = Slots(parallel=1, per_slot=a.head + a.suffix + 1)
    extra = shlex.split(a.tt_args)
    lo_hi = vocab_range(model)
    tt = TtServeSide(model, a.threads, extra)
    rounds: list[dict[str, Any]] = []
    with (
        Running(tt, slots, a.log_dir / "tt-serve.log") as srv,
        Running(NullSide(), slots, a.log_dir / "null.log") as null,  # type: ignore[arg-type]
    ):
        llm = _in_process(model, extra)
        srv.wait_healthy(300)
        null.wait_healthy(30)
        parts = {
            "client": lambda p: asyncio.run(_client_floor(null.url, p, a)),
            "engine": lambda p: _engine_pairs(llm, p, a),
            "http": lambda p: asyncio.run(_http_pairs(srv.url, p, a)),
        }
        for r in range(a.rounds):
            got: dict[str, dict[str, Any]] = {}
            order = list(parts) if r % 2 == 0 else list(reversed(parts))
            for name in order:
                got[name] = parts[name](Prompts(a.seed * 1000 + r * 10 + len(got), *lo_hi))
            if not got["http"]["warm_cached_tokens"]:
                raise SystemExit(f"round {r}: the warm requests missed the prefix cache: {got}")
            rounds.append({"order": order, **got, **_split(got)})
            print(json.dumps(rounds[-1]), flush=True)
    keys = ("client", "engine", "http")
    summary: dict[str, Any] = {
        k: {m: statistics.median(x[k][m] for x in rounds) for m in ("cold_ms", "warm_ms")}
        for k in keys
        if k != "client"
    }
    summary["client"] = {"warm_ms": statistics.median(x["client"]["warm_ms"] for x in rounds)}
    for m in _split(rounds[0]):
        summary[m] = statistics.median(x[m] for x in rounds)
    print(json.dumps(summary, indent=1))
    if not a.no_ledger:
        append_ledger(
            a.ledger,
            "warm_path",
            # no machine paths in a committed ledger: the checkpoint by its folder name
            params=arguments(a, "serve_null", "log_dir") | {"model": Path(model).name},
            summary=summary,
            rounds=rounds,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
