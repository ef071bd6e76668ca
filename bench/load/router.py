"""Replicas behind sglang-router: one arm per invocation, one ledger line per arm.

The workloads of bench/load/workloads.py, sent as *text*: sglang-router 0.3.2 refuses token-id
prompts (422; docs/routing.md), so every turn's ids are decoded with the model's tokenizer and a
later turn re-sends the conversation as text (previous prompt text + answer text + new text),
which is what an agent client does. The hit rate is in tokens, summed over the replicas'
/metrics; per-replica load is each replica's share of the prompt tokens it was sent.

  python -m bench.load.router --state STATE.json --model DIR --label cache_aware \
      --phase agents=agents:agents=8,turns=3,head=2048 --ledger bench/runs/router.jsonl
  ... --fault-after 0.4   # SIGKILL the busiest worker once 40 % of the requests finished
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common.provenance import counter_deltas, git_info, hit_rate, machine_info, parse_metrics
from bench.load.generator import RequestRecord, _one, summarize
from bench.load.workloads import WorkloadSpec, build, prompt_sha256

REQUEST_TIMEOUT_S = 300.0


def scrape_all(urls: list[str]) -> list[dict[str, float] | None]:
    out: list[dict[str, float] | None] = []
    for u in urls:
        try:
            out.append(parse_metrics(httpx.get(f"{u}/metrics", timeout=10).text))
        except httpx.HTTPError:
            out.append(None)  # a killed replica
    return out


def summed_deltas(
    before: list[dict[str, float] | None], after: list[dict[str, float] | None]
) -> tuple[dict[str, float], list[dict[str, float] | None]]:
    per = [
        counter_deltas(b, a) if b is not None and a is not None else None
        for b, a in zip(before, after, strict=True)
    ]
    total: dict[str, float] = {}
    for d in per:
        for k, v in (d or {}).items():
            total[k] = total.get(k, 0.0) + v
    return total, per


async def run_text(
    url: str,
    spec: WorkloadSpec,
    model: str,
    decode: Any,
    on_done: Any = None,
) -> tuple[list[RequestRecord], float]:
    sessions = build(spec)
    sem = asyncio.Semaphore(spec.effective_concurrency())
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=spec.effective_concurrency() + 4)
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=limits) as c:
        t0 = time.perf_counter()

        async def session(idx: int) -> None:
            convo, failed = "", False
            for k, turn in enumerate(sessions[idx].turns):
                prompt = (convo if turn.resend else "") + decode(list(turn.ids))
                rec = RequestRecord(idx, k, len(prompt), prompt_sha256([ord(ch) for ch in prompt]))
                records.append(rec)
                if failed:
                    rec.error = "not sent: an earlier turn of this session failed"
                    continue
                body = {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": spec.max_tokens,
                    "temperature": 0.0,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                async with sem:
                    await _one(c, rec, body, t0)
                failed = not rec.ok
                convo = prompt + rec.text
                if on_done is not None:
                    on_done(records)

        await asyncio.gather(*(session(i) for i in range(len(sessions))))
        makespan = time.perf_counter() - t0
    records.sort(key=lambda r: (r.session, r.turn))
    return records, makespan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load.router")
    p.add_argument("--state", required=True, help="scripts/serve-replicas --state-file")
    p.add_argument("--model", required=True, help="model folder (its tokenizer decodes ids)")
    p.add_argument("--served-name", default="demo")
    p.add_argument("--label", required=True)
    p.add_argument("--direct", action="store_true", help="send to worker 0, not the router")
    p.add_argument("--phase", action="append", required=True, help="NAME=kind:key=value,...")
    p.add_argument("--fault-after", type=float, default=None)
    p.add_argument("--ledger", required=True)
    a = p.parse_args(argv)

    from tt_serve.tokenizer import load_tokenizer

    tok = load_tokenizer(a.model)
    state = json.loads(Path(a.state).read_text())
    workers = [w["url"] for w in state["workers"]]
    url = workers[0] if a.direct else state["router"]
    results: dict[str, Any] = {}
    fault: dict[str, Any] | None = None
    for item in a.phase:
        name, _, text = item.partition("=")
        spec = WorkloadSpec.parse(text)
        total_requests = len(build(spec)) * spec.turns if spec.kind == "agents" else None
        killed: list[float] = []
        victim: list[int] = []
        t_start = time.perf_counter()

        before = scrape_all(workers)

        def on_done(
            records: list[RequestRecord],
            killed: list[float] = killed,
            victim: list[int] = victim,
            t_start: float = t_start,
            total_requests: int | None = total_requests,
            before: list[dict[str, float] | None] = before,
        ) -> None:
            done = sum(r.e2el is not None or r.error is not None for r in records)
            if a.fault_after is None or killed or total_requests is None:
                return
            if done >= a.fault_after * total_requests:
                # The replica that has taken the most prompt tokens so far: the one holding
                # the conversations, so the router has to move them.
                now = scrape_all(workers)
                sent = [
                    (m or {}).get("tt_serve:prompt_tokens_total", 0.0)
                    - (b or {}).get("tt_serve:prompt_tokens_total", 0.0)
                    for b, m in zip(before, now, strict=True)
                ]
                victim.append(max(range(len(sent)), key=sent.__getitem__))
                os.kill(state["workers"][victim[0]]["pid"], signal.SIGKILL)
                killed.append(time.perf_counter() - t_start)

        records, makespan = asyncio.run(
            run_text(url, spec, a.served_name, tok.decode, on_done if a.fault_after else None)
        )
        total, per = summed_deltas(before, scrape_all(workers))
        summary = summarize(records, makespan)
        prompt_tokens = [
            d.get("tt_serve:prompt_tokens_total") if d is not None else None for d in per
        ]
        results[name] = {
            "metrics": summary["metrics"],
            "hit_rate": hit_rate(total),
            "server": total,
            "per_replica_prompt_tokens": prompt_tokens,
            "errors": summary["errors"],
            "requests": summary["requests"],
        }
        if killed:
            fault = {"killed_worker": workers[victim[0]], "killed_at_s": killed[0]}
            workers_view = httpx.get(f"{state['router']}/workers", timeout=10).json()
            fault["router_view"] = [
                {"url": w["url"], "is_healthy": w["is_healthy"]} for w in workers_view["workers"]
            ]
            late = [r for r in records if r.start is not None and r.start > killed[0] + 1.0]
            fault["failed_after_kill_plus_1s"] = sum(not r.ok for r in late)
            fault["sent_after_kill_plus_1s"] = len(late)
        m = summary["metrics"]
        print(
            f"{a.label} {name}: hit_rate={results[name]['hit_rate']} "
            f"makespan={m['makespan_s']:.2f}s ttft_p50={m['ttft_s']['p50']} "
            f"ttft_p99={m['ttft_s']['p99']} failed={m['failed']} per_replica={prompt_tokens}",
            flush=True,
        )
    line = {
        "name": "router",
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git": git_info(),
        "machine": machine_info(),
        "arms": {"A": {"label": a.label, "url": url, "replicas": len(workers)}},
        "phases": {item.partition("=")[0]: item.partition("=")[2] for item in a.phase},
        "results": {"A": results},
        "fault": fault,
    }
    out = Path(a.ledger)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
