"""How many requests prefill in one step, and which first: arms side by side in one process.

Usage: python -m bench.prefill_order [--model DIR] [--agents 8] [--head 1472] [--tail 480]
       [--output 16] [--rows 1,2,4,0] [--orders arrival,shortest] [--rounds 3]

The agents' burst of ``bench/agent_replay``: ``--agents`` turns arrive together, each a
``--head``-token shared system prompt + its own ``--tail``-token history (tails of different
lengths, so "shortest first" has something to choose), ``--output`` new tokens each, greedy.
The shared head is computed once and resumed by the rest (the prefix cache on, as served). Each
arm is one ``max_prefill_rows`` (0: every prefilling request, the old lockstep) and one
``prefill_order``; each round runs every arm once, in rotated order, on one engine over the
demo model (or ``--model``), so noise hits every arm alike. Each burst draws a new head, so
every arm computes its head cold and resumes it for the rest of its agents.

Per arm, medians over rounds: time to first token p50 / p99 / max, makespan, and prompt tokens
computed per second. One ledger line to bench/runs/prefill-order.jsonl.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.provenance import REPO_ROOT, append_ledger, arguments
from tt_serve.demo import ensure_demo_model
from tt_serve.llm import LLM
from tt_serve.sequence import SamplingParams

LEDGER = REPO_ROOT / "bench" / "runs" / "prefill-order.jsonl"


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def burst(
    llm: LLM, rows: int, order: str, prompts: list[list[int]], a: argparse.Namespace
) -> dict[str, Any]:
    """One burst under one arm: TTFTs, makespan, prompt tokens/s."""
    eng = llm.engine
    eng.scheduler.config = dataclasses.replace(
        eng.scheduler.config, max_prefill_rows=rows, prefill_order=order
    )
    params = SamplingParams(max_tokens=a.output, temperature=0, ignore_eos=True)
    hits0, queries0 = eng.stats().prefix_hits, eng.stats().prefix_queries
    t0 = time.perf_counter()
    ids = [f"{rows}-{order}-{i}-{t0}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts, strict=True):
        eng.add_request(rid, p, params)
    first: dict[str, float] = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.token_ids and out.request_id not in first:
                first[out.request_id] = time.perf_counter() - t0
    total = time.perf_counter() - t0
    st = eng.stats()
    computed = (st.prefix_queries - queries0) - (st.prefix_hits - hits0)
    ttft = [first[r] for r in ids]
    return {
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p99_s": _pct(ttft, 0.99),
        "ttft_max_s": max(ttft),
        "makespan_s": total,
        "prompt_tok_s": computed / total,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.prefill_order", description=__doc__)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder; default: demo")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--head", type=int, default=1472, help="shared head tokens")
    ap.add_argument("--tail", type=int, default=480, help="longest own-history tokens")
    ap.add_argument("--output", type=int, default=16)
    ap.add_argument("--rows", default="1,2,4,0", help="max_prefill_rows arms (0: all)")
    ap.add_argument("--orders", default="arrival,shortest")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    model = a.model or ensure_demo_model(log=lambda s: None)
    llm = LLM(model, max_batch_size=max(a.agents, 1))
    hi = llm.spec.vocab_size - 1
    lo = min(1000, hi // 2)  # past the special and byte tokens of a real vocabulary
    arms = [(int(r), o) for r in a.rows.split(",") for o in a.orders.split(",")]
    arms = [(r, o) for r, o in arms if not (r == 0 and o == "shortest")] or arms
    runs: dict[str, list[dict[str, Any]]] = {f"rows={r} {o}": [] for r, o in arms}
    rng = random.Random(a.seed)
    for rnd in range(a.rounds + 1):  # round 0 warms every shape up, not recorded
        tails = [a.tail * (i + 1) // a.agents for i in range(a.agents)]
        rng.shuffle(tails)  # one arrival order per round, the same for every arm
        k = rnd % len(arms)
        for rows, order in arms[k:] + arms[:k]:
            head = [rng.randrange(lo, hi) for _ in range(a.head)]
            prompts = [head + [rng.randrange(lo, hi) for _ in range(n)] for n in tails]
            res = burst(llm, rows, order, prompts, a)
            if rnd == 0:
                continue
            runs[f"rows={rows} {order}"].append(res)
            print(
                f"round {rnd} rows={rows} {order:8s} TTFT p50 {res['ttft_p50_s']:.2f} s, "
                f"max {res['ttft_max_s']:.2f} s, makespan {res['makespan_s']:.2f} s, "
                f"{res['prompt_tok_s']:.0f} prompt tok/s",
                flush=True,
            )
    keys = ("ttft_p50_s", "ttft_p99_s", "ttft_max_s", "makespan_s", "prompt_tok_s")
    summary = {
        arm: {k: round(statistics.median(x[k] for x in v), 3) for k in keys}
        for arm, v in runs.items()
    }
    for arm, med in summary.items():
        print(f"{arm:20s} {med}", flush=True)
    append_ledger(
        a.ledger,
        "prefill_order",
        params=arguments(a, "model") | {"model": Path(model).name},
        threads=torch.get_num_threads(),
        medians=summary,
        rounds={arm: [{k: x[k] for k in keys} for x in v] for arm, v in runs.items()},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
