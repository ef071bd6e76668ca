"""Async OpenAI-compatible load generator (streaming completions), ``vllm bench serve`` metrics.

Per request (client side, ``time.perf_counter`` around one streaming POST /v1/completions):

* TTFT: request sent -> first SSE chunk carrying ``choices`` (vLLM's definition);
* ITL: gaps between successive chunks carrying ``choices``;
* E2EL: request sent -> last chunk;
* TPOT: (E2EL - TTFT) / (output_tokens - 1), only for requests with more than one output token;
* output tokens and ``cached_tokens`` come from the final usage chunk (``include_usage``).

Per phase: makespan (first send -> last completion), request / output / total token throughput
over the makespan, and mean, median, std, p50, p90, p99 of TTFT, TPOT, ITL and E2EL over the
successful requests. Failed requests are kept (with their error) and never retried; the later
turns of an agent whose turn failed are recorded as failed too. Requests are greedy with
``ignore_eos`` and a fixed ``max_tokens``.

    python -m bench.load.generator --url http://127.0.0.1:8000 \
        --workload agents:agents=8,turns=3,head=2048
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np

from bench.load.workloads import Session, WorkloadSpec, answer_ids, build, prompt_sha256

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    session: int
    turn: int
    prompt_len: int
    prompt_sha256: str
    start: float = 0.0
    """Seconds after the phase started."""
    ttft: float | None = None
    e2el: float | None = None
    tpot: float | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    text: str = ""
    token_ids: list[int] = field(default_factory=list)  # when the server returns them
    itl: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _completion_body(prompt: list[int], spec: WorkloadSpec, model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if model:
        body["model"] = model
    return body


async def post(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], *, stream: bool = False
) -> httpx.Response:
    """POST ``body`` as JSON; sent once more if the server dropped a kept-alive connection
    before answering anything (an idle close racing with the connection's reuse: llama-server
    closes idle connections after 5 s, and on a reused one sometimes sooner). A ``stream``
    response must be closed by the caller."""
    request = client.build_request("POST", path, json=body)
    try:
        return await client.send(request, stream=stream)
    except httpx.RemoteProtocolError:  # "Server disconnected without sending a response"
        return await client.send(request, stream=stream)


async def _one(
    client: httpx.AsyncClient, rec: RequestRecord, body: dict[str, Any], t0: float
) -> None:
    st = time.perf_counter()
    rec.start = st - t0
    last = st
    try:
        resp = await post(client, "/v1/completions", body, stream=True)
        try:
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                return
            # Read to the end of the body, past ``[DONE]``: a response left unread closes its
            # connection, and the next request would pay a new one (about 1 ms on loopback, on
            # both servers of a side-by-side run), as a client that reads whole streams does not.
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    rec.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    return
                now = time.perf_counter()
                if chunk.get("choices"):
                    if rec.ttft is None:
                        rec.ttft = now - st
                    else:
                        rec.itl.append(now - last)
                    last = now
                    rec.text += chunk["choices"][0].get("text") or ""
                    rec.token_ids += chunk["choices"][0].get("token_ids") or []
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    rec.output_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    rec.cached_tokens = details.get("cached_tokens")
        finally:
            await resp.aclose()
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
        return
    if rec.ttft is None:
        rec.error = "no token was streamed"
        return
    rec.e2el = last - st
    if rec.output_tokens > 1:
        rec.tpot = (rec.e2el - rec.ttft) / (rec.output_tokens - 1)


async def _session(
    client: httpx.AsyncClient,
    idx: int,
    session: Session,
    spec: WorkloadSpec,
    model: str | None,
    sem: asyncio.Semaphore,
    t0: float,
    out: list[RequestRecord],
) -> None:
    convo: list[int] = []
    failed = False
    for k, turn in enumerate(session.turns):
        prompt = (list(convo) if turn.resend else []) + list(turn.ids)
        rec = RequestRecord(idx, k, len(prompt), prompt_sha256(prompt))
        out.append(rec)
        if failed:
            rec.error = "not sent: an earlier turn of this session failed"
            continue
        async with sem:
            await _one(client, rec, _completion_body(prompt, spec, model), t0)
        failed = not rec.ok
        # The real generated ids when the server returns them (tt-serve does, with
        # return_token_ids); otherwise stand-in ids derived from the text, of the right length.
        answer = rec.token_ids
        if len(answer) != spec.max_tokens:
            answer = list(answer_ids(rec.text, spec.max_tokens, spec.vocab))
        convo = prompt + answer


async def run_async(
    url: str, spec: WorkloadSpec, *, model: str | None = None, timeout: float = 1800.0
) -> dict[str, Any]:
    """Run one workload against ``url``; return its metrics and per-request records."""
    sessions = build(spec)
    sem = asyncio.Semaphore(spec.effective_concurrency())
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=spec.effective_concurrency() + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(
            *(_session(client, i, s, spec, model, sem, t0, records) for i, s in enumerate(sessions))
        )
        makespan = time.perf_counter() - t0
    records.sort(key=lambda r: (r.session, r.turn))
    return {"workload": spec.params(), **summarize(records, makespan)}


def stats(values: list[float]) -> dict[str, float | None]:
    """mean, median, std, p50/p90/p99 (numpy's linear percentiles), min, max; None if empty."""
    keys = ["mean", "median", "std", "min", "max", *(f"p{p}" for p in PERCENTILES)]
    if not values:
        return dict.fromkeys(keys)
    a = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "std": float(a.std()),
        "min": float(a.min()),
        "max": float(a.max()),
    }
    out.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES})
    return out


def summarize(records: list[RequestRecord], makespan: float) -> dict[str, Any]:
    """Phase metrics from request records (failed requests count, never in latencies)."""
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    span = makespan if makespan > 0 else float("nan")
    metrics = {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "makespan_s": makespan,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "total_cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "request_throughput": len(ok) / span,
        "output_throughput": out_tokens / span,
        "total_token_throughput": (in_tokens + out_tokens) / span,
        "ttft_s": stats([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": stats([r.tpot for r in ok if r.tpot is not None]),
        "itl_s": stats([x for r in ok for x in r.itl]),
        "e2el_s": stats([r.e2el for r in ok if r.e2el is not None]),
    }
    requests = []
    for r in records:
        d = asdict(r)
        del d["itl"], d["text"], d["token_ids"]
        requests.append(d)
    return {
        "metrics": metrics,
        "requests": requests,
        "errors": [r.error for r in records if r.error],
    }


def run(url: str, spec: WorkloadSpec, *, model: str | None = None) -> dict[str, Any]:
    """Synchronous wrapper of :func:`run_async`."""
    return asyncio.run(run_async(url, spec, model=model))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.load.generator", description=__doc__.split("\n")[0]
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--workload", required=True, help="kind[:key=value,...] (bench/load/workloads.py)"
    )
    p.add_argument("--model", default=None, help="model name to send (default: none)")
    p.add_argument("--out", default=None, help="write the full result JSON here")
    a = p.parse_args(argv)
    result = run(a.url, WorkloadSpec.parse(a.workload), model=a.model)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    json.dump(result["metrics"], sys.stdout, indent=1)
    print()
    return 1 if result["metrics"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
