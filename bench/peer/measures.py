"""The measures, the prompts they send and the foreign-load sample around each.

Every request is a streaming POST /v1/completions with a token-id prompt, ``ignore_eos`` and
``stream_options.include_usage``, timed by :func:`bench.load.generator._one` (TTFT = sent ->
first chunk with ``choices``; E2EL = sent -> last such chunk; output tokens from the usage
chunk). Prompts
are drawn from plain-vocabulary ids by a seeded generator keyed by (round seed, tag): both sides
get the same prompts in a round, and no round reuses another's.

Measures (``better``: which direction is better for tt-serve in the ratio):

* ``crosscheck``: one prompt, N greedy tokens with top-k logprobs (compared across sides later);
* ``prefix``: cold = the first request with a fresh head + suffix; warm = the same head + another
  suffix; warm / cold TTFT (lower);
* ``prefill``: TTFT of a fresh prompt, max_tokens 1, prompt tokens / TTFT (higher); llama-server's
  prompt cache is off for it (``cache_prompt: false``);
* ``decode``: one request, (output tokens - 1) / (t_last - t_first) (higher);
* ``c8`` / ``c32``: C concurrent fresh prompts, output tokens / makespan (higher), max TTFT (lower);
* ``sampled``: the ``sampled`` shape greedy, then at temperature 0.7, top_p 0.9, top_k 20 (seeded):
  output tok/s of both and sampled / greedy (higher);
* ``long``: for each length L, cold TTFT of L + suffix and warm TTFT of L + another suffix (lower).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common.provenance import process_cpu_seconds, steal_seconds
from bench.load.generator import RequestRecord, _one, summarize
from bench.load.workloads import prompt_sha256
from bench.peer.servers import Running, Side, Slots

SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
MEASURES = ("prefix", "prefill", "decode", "c8", "c32", "sampled", "long")
"""Selectable measures, in run order (``crosscheck`` always runs first)."""
GROUPS: dict[str, tuple[str, ...]] = {
    "single": ("crosscheck", "prefix", "prefill", "decode"),
    "c8": ("c8", "sampled"),
    "c32": ("c32",),
    "long": ("long",),
}
"""Measures that share one server start (same llama-server --parallel and context)."""


@dataclass(frozen=True)
class Shape:
    """``concurrency x prompt + output`` tokens."""

    concurrency: int
    prompt: int
    output: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        try:
            c, rest = text.lower().split("x", 1)
            p, o = rest.split("+", 1)
            shape = cls(int(c), int(p), int(o))
        except ValueError as exc:
            raise ValueError(f"expected CxP+O (e.g. 8x512+128), got {text!r}") from exc
        if min(shape.concurrency, shape.prompt, shape.output) < 1:
            raise ValueError(f"every part of {text!r} must be >= 1")
        return shape

    def __str__(self) -> str:
        return f"{self.concurrency}x{self.prompt}+{self.output}"


@dataclass(frozen=True)
class Sizes:
    crosscheck_prompt: int = 64
    crosscheck_tokens: int = 16
    top_k: int = 5
    prefix_head: int = 4096
    prefix_suffix: int = 64
    prefill: int = 2048
    decode_prompt: int = 64
    decode_tokens: int = 128
    c8: Shape = Shape(8, 512, 128)
    c32: Shape = Shape(32, 256, 64)
    sampled: Shape = Shape(8, 64, 96)
    long: tuple[int, ...] = ()
    long_suffix: int = 64

    def slots(self, group: str) -> Slots:
        """The --parallel and per-request tokens one group of measures needs."""
        if group == "single":
            per = max(
                self.crosscheck_prompt + self.crosscheck_tokens,
                self.prefix_head + self.prefix_suffix + 1,
                self.prefill + 1,
                self.decode_prompt + self.decode_tokens,
            )
            return Slots(1, per)
        if group == "c8":
            return Slots(
                max(self.c8.concurrency, self.sampled.concurrency),
                max(self.c8.prompt + self.c8.output, self.sampled.prompt + self.sampled.output),
            )
        if group == "c32":
            return Slots(self.c32.concurrency, self.c32.prompt + self.c32.output)
        if group == "long":
            return Slots(1, max(self.long, default=0) + self.long_suffix + 1)
        raise KeyError(group)


class Prompts:
    """Token-id prompts from ids in [lo, hi), a pure function of (seed, tag, length)."""

    def __init__(self, seed: int, lo: int, hi: int) -> None:
        self.seed, self.lo, self.hi = seed, lo, hi

    def ids(self, n: int, tag: str) -> list[int]:
        rng = random.Random(f"{self.seed}:{tag}")
        return [rng.randrange(self.lo, self.hi) for _ in range(n)]


class MeasureError(RuntimeError):
    pass


# -- foreign load --------------------------------------------------------------------------------


def busy_seconds() -> float | None:
    """Machine-wide non-idle CPU seconds so far (user, nice, system, irq, softirq), /proc/stat."""
    try:
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()
        ticks = sum(int(cpu[i]) for i in (1, 2, 3, 6, 7))
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class LoadSample:
    wall: float
    loadavg_1m: float | None
    steal: float | None
    busy: float | None
    server_cpu: float | None
    own_cpu: float

    @classmethod
    def take(cls, pid: int | None) -> LoadSample:
        try:
            load: float | None = os.getloadavg()[0]
        except OSError:
            load = None
        return cls(
            time.perf_counter(),
            load,
            steal_seconds(),
            busy_seconds(),
            process_cpu_seconds(pid),
            time.process_time(),
        )


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def load_between(before: LoadSample, after: LoadSample) -> dict[str, Any]:
    """What else ran during a measure: ``foreign_cores`` = (machine busy CPU-s - the server's -
    this harness's) / wall seconds, i.e. the average number of cores other work took; the steal
    seconds (a VM's neighbours); the 1-minute load average before and after."""
    wall = after.wall - before.wall
    busy = _delta(before.busy, after.busy)
    server = _delta(before.server_cpu, after.server_cpu)
    own = after.own_cpu - before.own_cpu
    foreign = None
    if busy is not None and server is not None and wall > 0:
        foreign = max(0.0, busy - server - own) / wall
    return {
        "wall_s": wall,
        "server_cpu_s": server,
        "foreign_cores": foreign,
        "steal_s": _delta(before.steal, after.steal),
        "loadavg_1m": [before.loadavg_1m, after.loadavg_1m],
    }


# -- requests ------------------------------------------------------------------------------------


@dataclass
class Ctx:
    """What a measure runs against: one healthy server and this round's prompts."""

    client: httpx.AsyncClient
    side: Side
    sizes: Sizes
    prompts: Prompts
    seed: int
    detail: dict[str, Any] = field(default_factory=dict)

    def body(
        self,
        prompt: list[int],
        max_tokens: int,
        *,
        cold: bool = False,
        sampling: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        body |= sampling or {}
        body |= self.side.request_extras(cold)
        return body

    async def batch(
        self, bodies: list[dict[str, Any]], max_tokens: int | None = None
    ) -> tuple[list[RequestRecord], float]:
        """Send all bodies at once; every record must succeed with its full output."""
        recs = [
            RequestRecord(0, i, len(b["prompt"]), prompt_sha256(b["prompt"]))
            for i, b in enumerate(bodies)
        ]
        t0 = time.perf_counter()
        await asyncio.gather(
            *(_one(self.client, r, b, t0) for r, b in zip(recs, bodies, strict=True))
        )
        makespan = time.perf_counter() - t0
        for r, b in zip(recs, bodies, strict=True):
            if r.error:
                raise MeasureError(r.error)
            if r.output_tokens != b["max_tokens"]:
                raise MeasureError(f"{r.output_tokens} output tokens, asked {b['max_tokens']}")
        return recs, makespan

    async def one(self, body: dict[str, Any]) -> RequestRecord:
        return (await self.batch([body]))[0][0]


# -- the measures --------------------------------------------------------------------------------

Metrics = dict[str, float | None]


async def m_crosscheck(c: Ctx) -> Metrics:
    s = c.sizes
    prompt = c.prompts.ids(s.crosscheck_prompt, "crosscheck")
    probe = await c.side.greedy_probe(c.client, prompt, s.crosscheck_tokens, s.top_k)
    c.detail["probe"] = asdict(probe)
    return {"tokens": float(len(probe.ids))}


async def _cold_warm(c: Ctx, head_len: int, suffix: int, tag: str) -> Metrics:
    head = c.prompts.ids(head_len, f"{tag}-head")
    cold = await c.one(c.body(head + c.prompts.ids(suffix, f"{tag}-s1"), 1))
    warm = await c.one(c.body(head + c.prompts.ids(suffix, f"{tag}-s2"), 1))
    assert cold.ttft is not None and warm.ttft is not None
    c.detail[tag] = {"cold_cached": cold.cached_tokens, "warm_cached": warm.cached_tokens}
    return {
        "cold_ttft": cold.ttft,
        "warm_ttft": warm.ttft,
        "warm_over_cold": warm.ttft / cold.ttft,
    }


async def m_prefix(c: Ctx) -> Metrics:
    return await _cold_warm(c, c.sizes.prefix_head, c.sizes.prefix_suffix, "prefix")


async def m_prefill(c: Ctx) -> Metrics:
    n = c.sizes.prefill
    rec = await c.one(c.body(c.prompts.ids(n, "prefill"), 1, cold=True))
    assert rec.ttft is not None
    return {"ttft": rec.ttft, "tok_s": n / rec.ttft}


async def m_decode(c: Ctx) -> Metrics:
    s = c.sizes
    rec = await c.one(c.body(c.prompts.ids(s.decode_prompt, "decode"), s.decode_tokens))
    assert rec.ttft is not None and rec.e2el is not None
    span = rec.e2el - rec.ttft
    tok_s = (rec.output_tokens - 1) / span if rec.output_tokens > 1 and span > 0 else None
    return {"tok_s": tok_s, "ttft": rec.ttft}


async def _concurrent(
    c: Ctx, shape: Shape, tag: str, sampling: dict[str, Any] | None = None, seed_base: int = 0
) -> Metrics:
    bodies = []
    for i in range(shape.concurrency):
        seed = c.seed * 1000 + seed_base + i
        samp = None if sampling is None else {**sampling, "seed": seed}
        bodies.append(
            c.body(c.prompts.ids(shape.prompt, f"{tag}-{i}"), shape.output, sampling=samp)
        )
    recs, makespan = await c.batch(bodies)
    met = summarize(recs, makespan)["metrics"]
    return {
        "output_tok_s": met["output_throughput"],
        "makespan_s": makespan,
        "max_ttft": met["ttft_s"]["max"],
        "median_ttft": met["ttft_s"]["median"],
    }


async def m_c8(c: Ctx) -> Metrics:
    return await _concurrent(c, c.sizes.c8, "c8")


async def m_c32(c: Ctx) -> Metrics:
    return await _concurrent(c, c.sizes.c32, "c32")


async def m_sampled(c: Ctx) -> Metrics:
    """Greedy, sampled, sampled, greedy (an ABBA order: a drift of the machine's speed over
    the measure, linear in time, weighs on both sides alike), each a fresh batch; each side's
    tok/s is its two batches' tokens over their two makespans."""
    shape = c.sizes.sampled
    g1 = await _concurrent(c, shape, "sampled-greedy")
    s1 = await _concurrent(c, shape, "sampled", SAMPLING)
    s2 = await _concurrent(c, shape, "sampled-2", SAMPLING, seed_base=shape.concurrency)
    g2 = await _concurrent(c, shape, "sampled-greedy-2")
    tokens = shape.concurrency * shape.output
    g = 2 * tokens / (g1["makespan_s"] + g2["makespan_s"])
    s = 2 * tokens / (s1["makespan_s"] + s2["makespan_s"])
    return {"greedy_tok_s": g, "sampled_tok_s": s, "sampled_over_greedy": s / g}


async def m_long(c: Ctx) -> Metrics:
    out: Metrics = {}
    for n in c.sizes.long:
        got = await _cold_warm(c, n, c.sizes.long_suffix, f"long{n}")
        out[f"{n}.cold_ttft"] = got["cold_ttft"]
        out[f"{n}.warm_ttft"] = got["warm_ttft"]
    return out


RUNNERS: dict[str, Callable[[Ctx], Awaitable[Metrics]]] = {
    "crosscheck": m_crosscheck,
    "prefix": m_prefix,
    "prefill": m_prefill,
    "decode": m_decode,
    "c8": m_c8,
    "c32": m_c32,
    "sampled": m_sampled,
    "long": m_long,
}


async def run_group(
    srv: Running,
    measures: list[str],
    sizes: Sizes,
    prompts: Prompts,
    seed: int,
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Warm the server up (one short unrecorded request), then run ``measures`` in order, each
    between two load samples. A failing measure is recorded with its error; the rest still run."""
    out: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=max(64, srv.slots.parallel + 8))
    async with httpx.AsyncClient(base_url=srv.url, timeout=timeout, limits=limits) as client:
        warm = Ctx(client, srv.side, sizes, prompts, seed)
        await warm.one(warm.body(prompts.ids(32, "warmup"), 2))
        for name in measures:
            c = Ctx(client, srv.side, sizes, prompts, seed)
            before = LoadSample.take(srv.pid)
            entry: dict[str, Any] = {"metrics": {}, "error": None}
            try:
                entry["metrics"] = await RUNNERS[name](c)
            except (MeasureError, httpx.HTTPError, KeyError, ValueError) as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"[:500]
            entry["load"] = load_between(before, LoadSample.take(srv.pid))
            if c.detail:
                entry["detail"] = c.detail
            out[name] = entry
    return out
