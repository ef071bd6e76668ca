"""How many requests prefill in one step, and which first: arms side by side in one process.

Usage: python -m bench.scheduling.prefill_order [--model DIR] [--agents 8] [--head 1472]
       [--tail 480] [--output 16] [--rows 1,2,4,0,auto] [--orders arrival,shortest] [--steps split,mixed]
       [--rounds 3]

The agents' burst of ``bench/agent_replay``: ``--agents`` turns arrive together, each a
``--head``-token shared system prompt + its own ``--tail``-token history (tails of different
lengths, so "shortest first" has something to choose), ``--output`` new tokens each, greedy.
The shared head is computed once and resumed by the rest (the prefix cache on, as served). Each
arm is one ``max_prefill_rows`` (0: every prefilling request, lockstep; ``auto``: the
measured rule of ``tt_serve/engine/prefill_rows.py``, its measure kept across rounds as a
server's would be), one ``prefill_order`` and one step shape (``--steps``: ``split``,
all-prefill and all-decode steps, or ``mixed``, decode rows riding in the prefill steps); each
round runs every arm once, in rotated order, on one engine over the demo model (or
``--model``), so noise hits every arm alike. Each burst draws a new head, so
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

from bench.common.provenance import REPO_ROOT, append_ledger, arguments
from tt_serve.demo import ensure_demo_model
from tt_serve.engine.prefill_rows import PrefillRows
from tt_serve.llm import LLM
from tt_serve.sequence import SamplingParams

LEDGER = REPO_ROOT / "bench" / "runs" / "prefill-order.jsonl"


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def burst(
    llm: LLM,
    arm: Arm,
    prompts: list[list[int]],
    a: argparse.Namespace,
    measured: PrefillRows,
) -> dict[str, Any]:
    """One burst under one arm: TTFTs, makespan, prompt tokens/s. ``measured``: the one
    measure the "auto" arms share (it learns from every arm's steps, as a server's would)."""
    eng = llm.engine
    eng.scheduler.config = dataclasses.replace(
        eng.scheduler.config,
        max_prefill_rows=0 if arm.rows == "auto" else int(arm.rows),
        prefill_order=arm.order,
        mixed_steps=arm.steps == "mixed",
    )
    eng.scheduler.prefill_rows = measured if arm.rows == "auto" else None
    params = SamplingParams(max_tokens=a.output, temperature=0, ignore_eos=True)
    hits0, queries0 = eng.stats().prefix_hits, eng.stats().prefix_queries
    t0 = time.perf_counter()
    ids = [f"{arm.label}-{i}-{t0}" for i in range(len(prompts))]
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


@dataclasses.dataclass(frozen=True)
class Arm:
    rows: str  # a max_prefill_rows (0: all) or "auto" (measured, engine/prefill_rows.py)
    order: str
    steps: str  # "split" (all-prefill / all-decode steps) or "mixed"

    @property
    def label(self) -> str:
        return f"rows={self.rows} {self.order} {self.steps}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.scheduling.prefill_order", description=__doc__
    )
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder; default: demo")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--head", type=int, default=1472, help="shared head tokens")
    ap.add_argument("--tail", type=int, default=480, help="longest own-history tokens")
    ap.add_argument("--output", type=int, default=16)
    ap.add_argument(
        "--rows", default="1,2,4,0,auto", help="max_prefill_rows arms (0: all; auto: measured)"
    )
    ap.add_argument("--orders", default="arrival,shortest")
    ap.add_argument(
        "--steps", default="split", help="step shapes: split (the default on both backends), mixed"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    model = a.model or ensure_demo_model(log=lambda s: None)
    llm = LLM(model, max_batch_size=max(a.agents, 1))
    hi = llm.spec.vocab_size - 1
    lo = min(1000, hi // 2)  # past the special and byte tokens of a real vocabulary
    arms = [
        Arm(r, o, st)
        for r in a.rows.split(",")
        for o in a.orders.split(",")
        for st in a.steps.split(",")
    ]
    arms = [x for x in arms if not (x.rows == "0" and x.order == "shortest")] or arms
    runs: dict[str, list[dict[str, Any]]] = {x.label: [] for x in arms}
    sched = llm.engine.scheduler.config
    measured = PrefillRows(sched.chunk, sched.max_batch)
    rng = random.Random(a.seed)
    for rnd in range(a.rounds + 1):  # round 0 warms every shape up, not recorded
        tails = [a.tail * (i + 1) // a.agents for i in range(a.agents)]
        rng.shuffle(tails)  # one arrival order per round, the same for every arm
        k = rnd % len(arms)
        for arm in arms[k:] + arms[:k]:
            head = [rng.randrange(lo, hi) for _ in range(a.head)]
            prompts = [head + [rng.randrange(lo, hi) for _ in range(n)] for n in tails]
            res = burst(llm, arm, prompts, a, measured)
            if arm.rows == "auto":
                res["auto_rows"] = measured.limit
            if rnd == 0:
                continue
            runs[arm.label].append(res)
            print(
                f"round {rnd} {arm.label:28s} TTFT p50 {res['ttft_p50_s']:.2f} s, "
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
        rounds=runs,
        auto_rows=measured.limit,
        auto_fit=measured.fit(),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
