"""Prefix-hit equivalence: greedy tokens of a cold run, a warm (cache-hit) run and a control must
be identical. Exit 0 when they are, 1 on any difference or when the check would be blind.

For each case i (a fresh random head H_i + suffix S_i, so nothing can be cached yet):

1. cold:    H_i + S_i; must report ``cached_tokens == 0`` (else it was not cold);
2. primer:  H_i + a different suffix (the shared-prefix request);
3. warm:    H_i + S_i again; must report ``cached_tokens > 0`` (else nothing hit and warm equal
            to cold would prove nothing);
4. control: H_i + S_i on ``--control-url`` (a cache-off server) when given, else a repeat on the
            same server (run-to-run determinism).

Every run must return exactly ``max_tokens`` tokens (``ignore_eos``), never an empty output.
Tokens are compared as ids (``return_token_ids``, when the server returns them), as the per-token
strings of ``logprobs=1`` (always), and by logprob (within ``--logprob-tol``).

The report states what the run rules out (``bench/common/gates.py``): of the valid cases (cold was
cold, warm hit), the ones whose warm or control answer differs are defects, and the defect rate
excluded at 95 % is 3/n with none, Clopper-Pearson otherwise. The default 384 cases exclude
1/128, the rate of the hybrid-cache defect this project exists to avoid; cases run
``--concurrency`` at a time (each case's requests in order).

    python -m bench.cache.prefix_hit_equivalence --url http://127.0.0.1:8000 [--control-url URL]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.common import gates
from bench.load.workloads import token_range


@dataclass
class Run:
    tokens: list[str]
    logprobs: list[float | None]
    cached_tokens: int
    completion_tokens: int
    token_ids: list[int] | None = None  # None when the server does not return ids


@dataclass
class Report:
    cases: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and bool(self.cases)

    @property
    def gate(self) -> dict[str, Any]:
        """What the run rules out: valid comparisons, the defects among them, the rate."""
        valid = [c for c in self.cases if c["valid"]]
        return gates.report(len(valid), sum(1 for c in valid if not c["ok"]))


def complete(client: httpx.Client, prompt: list[int], max_tokens: int) -> Run:
    """One greedy non-streaming completion with per-token logprobs."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 1,
        "return_token_ids": True,
    }
    resp = client.post("/v1/completions", json=body)
    resp.raise_for_status()
    data = resp.json()
    choice = data["choices"][0]
    lp = choice.get("logprobs") or {}
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return Run(
        tokens=list(lp.get("tokens") or []),
        logprobs=list(lp.get("token_logprobs") or []),
        cached_tokens=int(details.get("cached_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        token_ids=[int(t) for t in choice["token_ids"]] if "token_ids" in choice else None,
    )


def _diff(name: str, ref: Run, other: Run, tol: float) -> list[str]:
    if (
        ref.token_ids is not None
        and other.token_ids is not None
        and ref.token_ids != other.token_ids
    ):
        first = next(
            (
                i
                for i, (a, b) in enumerate(zip(ref.token_ids, other.token_ids, strict=False))
                if a != b
            ),
            min(len(ref.token_ids), len(other.token_ids)),
        )
        return [f"{name}: token ids differ from cold at output position {first}"]
    if ref.tokens != other.tokens:
        first = next(
            (i for i, (a, b) in enumerate(zip(ref.tokens, other.tokens, strict=False)) if a != b),
            min(len(ref.tokens), len(other.tokens)),
        )
        return [f"{name}: tokens differ from cold at output position {first}"]
    worst = max(
        (
            abs(a - b)
            for a, b in zip(ref.logprobs, other.logprobs, strict=False)
            if a is not None and b is not None
        ),
        default=0.0,
    )
    if worst > tol:
        return [f"{name}: logprobs differ from cold by {worst:.3g} (> {tol})"]
    return []


def _complete_run(name: str, run: Run, max_tokens: int) -> list[str]:
    if not run.tokens or run.completion_tokens == 0:
        return [f"{name}: empty output"]
    if len(run.tokens) != max_tokens or run.completion_tokens != max_tokens:
        return [
            f"{name}: {len(run.tokens)} tokens ({run.completion_tokens} in usage), "
            f"expected {max_tokens}"
        ]
    if run.token_ids is not None and len(run.token_ids) != max_tokens:
        return [f"{name}: {len(run.token_ids)} token ids, expected {max_tokens}"]
    if len(run.logprobs) != len(run.tokens):
        return [f"{name}: {len(run.logprobs)} logprobs for {len(run.tokens)} tokens"]
    return []


DEFAULT_CASES = gates.clean_needed()  # 384: excludes 1/128


def check(
    url: str,
    *,
    control_url: str | None = None,
    cases: int = DEFAULT_CASES,
    head: int = 512,
    suffix: int = 32,
    max_tokens: int = 16,
    seed: int = 0,
    vocab: int = 0,
    logprob_tol: float = 1e-3,
    timeout: float = 600.0,
    concurrency: int = 1,
    fail_fast: bool = False,
) -> Report:
    """Run the cold / warm / control comparison; the report lists every failure. ``fail_fast``:
    no case starts once one has found a defect (the gate has failed; the cases already running
    finish and are reported)."""
    rng = random.Random(f"equivalence|{seed}")
    lo, hi = token_range(vocab)
    prompts = []
    for _ in range(cases):  # drawn up front: the cases are the same at any concurrency
        h = [rng.randrange(lo, hi) for _ in range(head)]
        prompts.append(
            (
                h + [rng.randrange(lo, hi) for _ in range(suffix)],
                h + [rng.randrange(lo, hi) for _ in range(suffix)],
            )
        )
    limits = httpx.Limits(max_connections=concurrency + 2)
    with (
        httpx.Client(base_url=url, timeout=timeout, limits=limits) as srv,
        httpx.Client(base_url=control_url or url, timeout=timeout, limits=limits) as ctl,
    ):
        failed = threading.Event()

        def one(i: int) -> tuple[dict[str, Any], list[str]] | None:
            if failed.is_set():
                return None
            prompt, other = prompts[i]
            cold = complete(srv, prompt, max_tokens)
            complete(srv, other, max_tokens)
            warm = complete(srv, prompt, max_tokens)
            control = complete(ctl, prompt, max_tokens)
            invalid: list[str] = []
            for name, run in (("cold", cold), ("warm", warm), ("control", control)):
                invalid += _complete_run(name, run, max_tokens)
            if cold.cached_tokens != 0:
                invalid.append(f"cold: cached_tokens = {cold.cached_tokens}, the run was not cold")
            if warm.cached_tokens <= 0:
                invalid.append("warm: cached_tokens = 0, nothing hit the cache (blind comparison)")
            defects = _diff("warm", cold, warm, logprob_tol) + _diff(
                "control", cold, control, logprob_tol
            )
            if defects and fail_fast:
                failed.set()
            case = {
                "case": i,
                "prompt_len": len(prompt),
                "cold_cached": cold.cached_tokens,
                "warm_cached": warm.cached_tokens,
                "control_cached": control.cached_tokens,
                "tokens": len(cold.tokens),
                "valid": not invalid,
                "ok": not invalid and not defects,
            }
            return case, invalid + defects

        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            results = list(pool.map(one, range(cases)))
    report = Report()
    for result in results:
        if result is None:  # not started: an earlier case had failed the gate (fail_fast)
            continue
        case, fails = result
        report.cases.append(case)
        report.failures += [f"case {case['case']}: {f}" for f in fails]
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cache.prefix_hit_equivalence")
    p.add_argument("--url", required=True, help="the prefix-caching server")
    p.add_argument("--control-url", default=None, help="a cache-off server (default: repeat)")
    p.add_argument(
        "--cases", type=int, default=DEFAULT_CASES, help=f"default {DEFAULT_CASES}: excludes 1/128"
    )
    p.add_argument("--concurrency", type=int, default=8, help="cases at a time (default 8)")
    p.add_argument("--head", type=int, default=512, help="shared head length (a chunk multiple)")
    p.add_argument("--suffix", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=0, help="tiny models: ids in [vocab/2, vocab)")
    p.add_argument("--logprob-tol", type=float, default=1e-3)
    p.add_argument(
        "--fail-fast", action="store_true", help="start no case once one has found a defect"
    )
    a = p.parse_args(argv)
    try:
        report = check(
            a.url,
            control_url=a.control_url,
            cases=a.cases,
            head=a.head,
            suffix=a.suffix,
            max_tokens=a.max_tokens,
            seed=a.seed,
            vocab=a.vocab,
            logprob_tol=a.logprob_tol,
            concurrency=a.concurrency,
            fail_fast=a.fail_fast,
        )
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        print(f"FAIL: request error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    gate = report.gate
    out = {"ok": report.ok, **gate, "cases": report.cases, "failures": report.failures}
    print(json.dumps(out))
    for f in report.failures:
        print(f"FAIL: {f}", file=sys.stderr)
    print(f"{'PASS' if report.ok else 'FAIL'}: {gate['excludes']}", file=sys.stderr)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
