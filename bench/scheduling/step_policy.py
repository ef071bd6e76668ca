"""Mixed steps against prefill-first steps on the torch backend, side by side in one process.

Usage: python -m bench.scheduling.step_policy [--requests 32] [--prompt 256] [--output 64]
       [--rounds 5]

A burst of ``--requests`` prompts arrives at once (the 32-concurrent measure of
``bench/peer``). Each round runs it once per policy, in alternating order, on one engine over
the demo model (or ``--model``):

* ``mixed``: decode rows and prefill chunks share a step (decodes first, chunks fill the token
  budget);
* ``prefill_first``: a step is all prefill or all decode; decodes wait at most
  ``--streak`` prefill steps (``max_prefill_streak``).

Per policy: the median over rounds of the largest time to first token and of output tokens/s,
and in how many rounds prefill-first won each. One ledger line to bench/runs/step-policy.jsonl.
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
from tt_serve.llm import LLM
from tt_serve.sequence import SamplingParams

LEDGER = REPO_ROOT / "bench" / "runs" / "step-policy.jsonl"
POLICIES = {"mixed": True, "prefill_first": False}


def burst(llm: LLM, mixed: bool, streak: int, a: argparse.Namespace, rng: random.Random) -> dict:
    """One burst under one policy: max TTFT (s) and output tokens/s."""
    eng = llm.engine
    eng.scheduler.config = dataclasses.replace(
        eng.scheduler.config, mixed_steps=mixed, max_prefill_streak=streak
    )
    params = SamplingParams(max_tokens=a.output, temperature=0, ignore_eos=True)
    hi = llm.spec.vocab_size - 1
    lo = min(1000, hi // 2)  # past the special and byte tokens of a real vocabulary
    t0 = time.perf_counter()
    first: dict[str, float] = {}
    for i in range(a.requests):
        prompt = [rng.randrange(lo, hi) for _ in range(a.prompt)]
        eng.add_request(f"burst-{mixed}-{i}-{t0}", prompt, params)
    while eng.has_unfinished():
        for out in eng.step():
            if out.token_ids and out.request_id not in first:
                first[out.request_id] = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return {"max_ttft_s": max(first.values()), "output_tok_s": a.requests * a.output / total}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scheduling.step_policy", description=__doc__)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder; default: demo")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--output", type=int, default=64)
    ap.add_argument("--streak", type=int, default=2, help="max_prefill_streak of prefill_first")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    model = a.model or ensure_demo_model(log=lambda s: None)
    llm = LLM(model, max_batch_size=max(a.requests, 1))
    rng = random.Random(a.seed)
    burst(llm, True, a.streak, a, rng)  # warm-up: first-call costs of every shape
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    for r in range(a.rounds):
        order = list(POLICIES) if r % 2 == 0 else list(reversed(POLICIES))
        for name in order:
            res = burst(llm, POLICIES[name], a.streak, a, rng)
            runs[name].append(res)
            print(
                f"round {r} {name:13s} max TTFT {res['max_ttft_s']:.3f} s, "
                f"{res['output_tok_s']:.0f} tok/s",
                flush=True,
            )
    pf, mx = runs["prefill_first"], runs["mixed"]
    summary = {
        name: {k: statistics.median(x[k] for x in v) for k in ("max_ttft_s", "output_tok_s")}
        for name, v in runs.items()
    }
    wins = {
        "lower_max_ttft": sum(
            p["max_ttft_s"] < m["max_ttft_s"] for p, m in zip(pf, mx, strict=True)
        ),
        "higher_tok_s": sum(
            p["output_tok_s"] > m["output_tok_s"] for p, m in zip(pf, mx, strict=True)
        ),
    }
    print(f"medians {summary}; prefill_first won {wins} of {a.rounds} rounds", flush=True)
    append_ledger(
        a.ledger,
        "step_policy",
        params=arguments(a, "model") | {"model": Path(model).name},
        threads=torch.get_num_threads(),
        medians=summary,
        prefill_first_wins=wins,
        rounds=runs,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
