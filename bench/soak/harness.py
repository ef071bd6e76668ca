"""Soak: one tt-serve server under a seeded mix of every API for a bounded time, with a pool so
small that the prefix cache evicts to and restores from its host and disk tiers all the time;
then a SIGTERM drain; then a sample of its greedy answers replayed on a fresh cache-off server.

Checks, each with its bound in the report (exit 0 when all hold, 1 otherwise):

* ``equivalence``: every sampled greedy answer equals the cold reference (0 defects); the report
  states the defect rate the sample excludes at 95 % (``bench/common/gates.py``);
* ``statuses``: no status >= 500 (503 only for requests sent while draining); every good
  request 200, every bad input its 4xx with a JSON error body, oversized ones naming the limit;
* ``rss``, ``fds``, ``threads``: least-squares slope over the second half of the steady phase
  (after warm-up) under a bound (RSS per request, fds and threads per minute); ``disk``: the
  tier's folder within its caps;
* ``churn``: the run did evict and restore (else the cache checks above were blind);
* ``settled``: no request left running or waiting once the clients are done;
* ``drain``: requests in flight at SIGTERM finish whole, new ones get 503 or are refused, the
  process exits 0.

Latency: TTFT and inter-token latency p50 / p99 of the full streams, per phase.

    python -m bench.soak --minutes 2            # the short profile
    python -m bench.soak --minutes 30           # the long one
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.common import provenance
from bench.common.provenance import REPO_ROOT
from bench.load.generator import stats
from bench.peer.servers import Running, Slots, TtServeSide
from bench.soak import replay
from bench.soak.client import Exchange, converse, send
from bench.soak.mix import PATHS, Mix
from bench.soak.watch import SERIES, Watch, per_minute

LEDGER = REPO_ROOT / "bench" / "runs" / "soak.jsonl"
OUT_DIR = REPO_ROOT / "bench" / "out" / "soak"
HEALTH_TIMEOUT_S = 300.0
RSS_KIB_PER_REQUEST = 256.0
"""RSS growth per request after warm-up: a leak is per request, so this bound holds at any
request rate. A clean demo-model server still grows while warming (about 100 KiB per request in
the second half of a 45 s run, 40 in that of a 2-minute one, falling: allocator arenas and
caches filling); one 256 KiB buffer kept per request fails it."""
BOUNDS_PER_MIN = {"fds": 5.0, "threads": 5.0}
"""Growth per minute after warm-up: fds wander by the connections in flight, threads not at
all; one socket or thread kept per request passes these within seconds."""
ONE_OFF_STEP = 2
"""A one-off rise the fd and thread bounds allow (a pool thread or connection starting late).
A step of h in the middle of a window of T seconds fits a slope of 1.5 h / T, which on a short
window exceeds the per-minute bound: the bound is the larger of the two."""
DRAIN_STREAMS = 3
DRAIN_REFUSED = 3
SETTLE_S = 15.0
PROBLEMS_KEPT = 10
SERIES_POINTS = 120
"""Samples the report keeps of each series (evenly spaced)."""


def server_flags(a: argparse.Namespace, disk: Path) -> list[str]:
    """The soaked server's pool: 64-token blocks, a KV pool of ``--kv-blocks`` (two requests at
    the context limit), few snapshot slots and small tiers, so entries are evicted and
    restored all the time while every request still fits."""
    return [
        "--max-model-len",
        str(a.max_model_len),
        "--kv-blocks",
        str(a.kv_blocks),
        "--snapshot-slots",
        str(a.snapshot_slots),
        "--host-cache-gb",
        str(a.host_cache_gb),
        "--disk-cache-dir",
        str(disk),
        "--disk-cache-gb",
        str(a.disk_cache_gb),
        "--response-store-entries",
        "256",
        "--response-store-mb",
        str(a.response_store_mb),
        "--drain-timeout",
        str(a.drain_timeout),
    ]


def control_flags(a: argparse.Namespace) -> list[str]:
    return ["--max-model-len", str(a.max_model_len), "--no-prefix-caching"]


def _recorded(flags: list[str], disk: Path) -> list[str]:
    """Flags as a ledger keeps them: the temporary folder by its role, not its path."""
    return ["<disk-tier>" if f == str(disk) else f for f in flags]


async def _steady(url: str, mix: Mix, a: argparse.Namespace, out: list[Exchange]) -> dict[str, Any]:
    """Workers draw items in index order until the time or request budget is spent."""
    deadline = time.monotonic() + a.minutes * 60
    next_item = 0
    sent = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_item, sent
        while time.monotonic() < deadline and sent < a.max_requests:
            item = mix.item(next_item)
            next_item += 1
            if item.conversation is not None:
                done = await converse(client, item, mix.model)
            else:
                done = [await send(client, item)]
            sent += len(done)
            out.extend(done)
            if next_item % 50 == 0:
                print(f"soak: {next_item} items, {sent} requests", file=sys.stderr)

    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=a.concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(a.concurrency)))
    return {"items": next_item, "requests": sent, "wall_s": time.monotonic() - t0}


def _gauges(url: str) -> dict[str, float]:
    m = provenance.scrape(url)
    return {
        k: m.get(f"tt_serve:{k}", 0.0) for k in ("num_requests_running", "num_requests_waiting")
    }


def _settle(url: str) -> dict[str, Any]:
    """Wait (bounded) until the engine holds no request: dropped and timed-out ones included."""
    deadline = time.monotonic() + SETTLE_S
    g = _gauges(url)
    while any(g.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        g = _gauges(url)
    return {
        "ok": not any(g.values()),
        "bound": f"0 running and waiting within {SETTLE_S:.0f} s",
        **g,
    }


async def _drain(server: Running, mix: Mix, drain_timeout: int) -> dict[str, Any]:
    """Streams in flight, SIGTERM, new requests refused, the streams finish, the process ends."""
    limits = httpx.Limits(max_connections=DRAIN_STREAMS + DRAIN_REFUSED + 2)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
        streams = [
            asyncio.create_task(send(client, mix.drain_stream(k))) for k in range(DRAIN_STREAMS)
        ]
        deadline = time.monotonic() + 20
        running = 0.0
        while time.monotonic() < deadline and not all(s.done() for s in streams):
            running = _gauges(server.url)["num_requests_running"]
            if running >= DRAIN_STREAMS:
                break
            await asyncio.sleep(0.05)
        server.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        refused: list[str] = []
        for k in range(DRAIN_REFUSED):
            try:
                body = {"prompt": [k + 1000, 1001], "max_tokens": 2}
                resp = await client.post(PATHS["completions"], json=body)
                refused.append(str(resp.status_code))
            except httpx.TransportError as exc:
                refused.append(type(exc).__name__)
        finished = await asyncio.gather(*streams)
    try:
        rc: int | None = await asyncio.to_thread(server.proc.wait, drain_timeout + 20)
    except subprocess.TimeoutExpired:  # a hung server is a failed drain, reported below
        rc = None
    problems = [f"stream {e.item}: {e.problem}" for e in finished if e.problem]
    if any(r not in ("503", "ConnectError") for r in refused):
        problems.append(f"requests after SIGTERM answered {refused}, expected 503 or refused")
    if running < 1:
        problems.append("no stream was in flight at SIGTERM (the drain was not exercised)")
    if rc != 0:
        problems.append(f"server exit status {rc}, expected 0")
    return {
        "ok": not problems,
        "bound": "in-flight streams finish whole; new requests 503 or refused; exit 0",
        "in_flight_at_signal": running,
        "after_signal": refused,
        "exit_status": rc,
        "problems": problems,
        "exchanges": finished,
    }


def _latency(exchanges: list[Exchange]) -> dict[str, Any]:
    full = [e for e in exchanges if e.kind == "stream" and e.problem is None and e.ttft]
    keep = ("p50", "p99")
    ttft = stats([e.ttft for e in full if e.ttft is not None])
    itl = stats([x for e in full for x in e.itl])
    return {
        "streams": len(full),
        "ttft_s": {k: ttft[k] for k in keep},
        "itl_s": {k: itl[k] for k in keep},
    }


def _statuses(exchanges: list[Exchange]) -> dict[str, Any]:
    kinds = Counter(e.kind for e in exchanges)
    wrong = [e for e in exchanges if e.problem is not None]
    fives = [e for e in exchanges if e.status is not None and e.status >= 500]
    return {
        "ok": not wrong and not fives,
        "bound": "0 statuses >= 500; good requests 200 (ignore_eos: exactly max_tokens); bad "
        "inputs their 4xx with a JSON error body (400; 404 for an unknown model, as OpenAI and "
        "Anthropic); past the context 400 naming the limit",
        "requests": len(exchanges),
        "by_kind": dict(sorted(kinds.items())),
        "statuses": dict(sorted(Counter(str(e.status) for e in exchanges).items())),
        "aborted_by_client": sum(e.aborted for e in exchanges),
        "server_errors": len(fives),
        "wrong": len(wrong),
        "problems": [f"item {e.item} {e.kind} {e.path}: {e.problem}" for e in wrong][
            :PROBLEMS_KEPT
        ],
    }


def _growth(
    watch: Watch, steady_s: float, requests_per_s: float, disk_bound_mib: float
) -> dict[str, Any]:
    """Slopes over the second half of the steady phase (RSS also per request, at the phase's
    mean rate); the disk tier's peak against its caps."""
    since = steady_s / 2
    window = [s for s in watch.samples if since <= s.t <= steady_s]
    out: dict[str, Any] = {}
    for name in SERIES:
        fit = per_minute(watch.samples, name, since, steady_s)
        first = getattr(window[0], name) if window else None
        last = getattr(window[-1], name) if window else None
        out[name] = {"slope_per_min": fit, "first": first, "last": last, "samples": len(window)}
    step_per_min = 1.5 * ONE_OFF_STEP * 60 / max(steady_s - since, 1e-9)
    for name, per_min in BOUNDS_PER_MIN.items():
        fit = out[name]["slope_per_min"]
        bound = max(per_min, step_per_min)
        out[name] |= {"ok": fit is not None and fit < bound, "bound_per_min": bound}
    fit = out["rss_mib"]["slope_per_min"]
    per_request = None if fit is None else fit * 1024 / 60 / max(requests_per_s, 1e-9)
    out["rss_mib"] |= {
        "kib_per_request": per_request,
        "ok": per_request is not None and per_request < RSS_KIB_PER_REQUEST,
        "bound": f"< {RSS_KIB_PER_REQUEST:.0f} KiB per request",
    }
    peak = max((s.disk_mib for s in watch.samples), default=0.0)
    out["disk_mib"] |= {
        "ok": peak <= disk_bound_mib,
        "peak": peak,
        "bound": f"peak <= {disk_bound_mib:.1f} MiB (--disk-cache-gb + --response-store-mb)",
    }
    out["window_s"] = [since, steady_s]
    step = max(1, len(watch.samples) // SERIES_POINTS)
    out["series"] = [
        [round(x.t, 1), round(x.rss_mib, 1), x.fds, x.threads, round(x.disk_mib, 2)]
        for x in watch.samples[::step]
    ]
    return out


def _churn(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    d = provenance.counter_deltas(before, after)
    keys = {
        "prefix_hits_tokens": "tt_serve:prefix_cache_hits_total",
        "prefix_queries_tokens": "tt_serve:prefix_cache_queries_total",
        "host_evictions": 'tt_serve:cache_tier_evictions_total{tier="host"}',
        "disk_evictions": 'tt_serve:cache_tier_evictions_total{tier="disk"}',
        "tier_restores": "tt_serve:cache_tier_restores_total",
        "host_hits": 'tt_serve:cache_tier_hits_total{tier="host"}',
        "disk_hits": 'tt_serve:cache_tier_hits_total{tier="disk"}',
        "disk_errors": "tt_serve:cache_tier_disk_errors_total",
        "disk_corrupt": "tt_serve:cache_tier_disk_corrupt_total",
    }
    got = {k: d.get(v, 0.0) for k, v in keys.items()}
    ok = (
        got["prefix_hits_tokens"] > 0
        and got["host_evictions"] + got["disk_evictions"] > 0
        and got["tier_restores"] > 0
        and got["disk_errors"] == got["disk_corrupt"] == 0
    )
    bound = "prefix hits, tier evictions and restores > 0; 0 disk errors or corrupt units"
    return {"ok": ok, "bound": bound, **got}


def run(a: argparse.Namespace) -> dict[str, Any]:
    """The whole soak; the report (``ok``: every check holds)."""
    if a.model is None:
        from tt_serve.demo import ensure_demo_model

        a.model = str(ensure_demo_model(log=lambda m: print(m, file=sys.stderr)))
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    slots = Slots(a.concurrency, a.max_model_len)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        disk = Path(tmp) / "disk-tier"
        flags = server_flags(a, disk)
        side = TtServeSide(a.model, a.threads, extra=flags, label="soaked")
        print("soak: starting the soaked server", file=sys.stderr)
        with Running(side, slots, OUT_DIR / "server.log") as server:
            server.wait_healthy(HEALTH_TIMEOUT_S)
            info = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]
            mix = Mix(a.seed, int(info["max_model_len"]), str(info["id"]))
            watch = Watch(server.pid, disk)
            before = provenance.scrape(server.url)
            watch.start()
            exchanges: list[Exchange] = []
            steady = asyncio.run(_steady(server.url, mix, a, exchanges))
            steady_s = watch.now()
            settled = _settle(server.url)
            after = provenance.scrape(server.url)
            drain = asyncio.run(_drain(server, mix, a.drain_timeout))
            watch.stop()
        disk_bound = a.disk_cache_gb * 1024 + a.response_store_mb
        growth = _growth(watch, steady_s, steady["requests"] / steady["wall_s"], disk_bound)
        sampled = replay.sample(exchanges, a.max_compare, a.seed)
        print(
            f"soak: replaying {sum(map(len, sampled))} requests on a cache-off server",
            file=sys.stderr,
        )
        control = TtServeSide(a.model, a.threads, extra=control_flags(a), label="control")
        with Running(control, slots, OUT_DIR / "control.log") as ctl:
            ctl.wait_healthy(HEALTH_TIMEOUT_S)
            equivalence = asyncio.run(replay.compare(ctl.url, sampled, a.concurrency))
    equivalence["bound"] = "0 defects: every sampled greedy answer equals its cold reference"
    drain_exchanges = drain.pop("exchanges")
    checks = {
        "equivalence": equivalence,
        "statuses": _statuses(exchanges),
        "rss": growth["rss_mib"],
        "fds": growth["fds"],
        "threads": growth["threads"],
        "disk": growth["disk_mib"],
        "churn": _churn(before, after),
        "settled": settled,
        "drain": drain,
    }
    return {
        "ok": all(c["ok"] for c in checks.values()),
        "failed": [k for k, c in checks.items() if not c["ok"]],
        "checks": checks,
        "phases": {
            "steady": {**steady, **_latency(exchanges)},
            "drain": _latency(drain_exchanges),
        },
        "slope_window_s": growth["window_s"],
        "series": {"columns": ["t_s", *SERIES], "rows": growth["series"]},
        "server": {
            "model": Path(a.model).name,
            "flags": _recorded(flags, disk),
            "control_flags": control_flags(a),
            "threads": a.threads,
        },
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: the demo model)")
    p.add_argument("--minutes", type=float, default=2.0, help="steady phase length (default 2)")
    p.add_argument("--max-requests", type=int, default=100_000, help="steady phase request cap")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=8, help="clients at once (default 8)")
    p.add_argument("--threads", type=int, default=1, help="the servers' torch threads")
    p.add_argument("--max-compare", type=int, default=384, help="greedy requests replayed")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-blocks", type=int, default=64, help="64-token blocks (default 64)")
    p.add_argument("--snapshot-slots", type=int, default=8)
    p.add_argument("--host-cache-gb", type=float, default=0.02)
    p.add_argument("--disk-cache-gb", type=float, default=0.05)
    p.add_argument("--response-store-mb", type=int, default=4)
    p.add_argument("--drain-timeout", type=int, default=30, help="the server's SIGTERM bound")
    p.add_argument("--ledger", type=Path, default=LEDGER)
    p.add_argument("--no-ledger", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    report = run(a)
    print(json.dumps(report, indent=1))
    if not a.no_ledger:
        params = provenance.arguments(a, "no_ledger")
        params["model"] = Path(a.model).name
        provenance.append_ledger(a.ledger, "soak", params=params, **report)
    verdict = "PASS" if report["ok"] else f"FAIL: {', '.join(report['failed'])}"
    print(f"soak: {verdict}", file=sys.stderr)
    return 0 if report["ok"] else 1
