"""Micro-benchmark of the prefix cache's bookkeeping: match + admit + release.

Runs N requests with long prompts through ``match``, ``admit`` and ``release`` against a cold
cache (nothing registered: every lookup hashes until the first block and misses) and a warm one
(the shared prefix and its snapshots are registered: lookups hash and walk the whole prefix),
and reports microseconds per operation (median over rounds). Also times ``on_computed`` over a
whole prompt (registration + snapshot reservations), which the engine pays once per prefill.

    python -m bench.cache.micro                      # 32 requests x 4,096-token prompts
    python -m bench.cache.micro --block-size 16 --json-out bench/out/micro_cache.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence

from tt_serve.cache import Admission, PrefixCache


def build_prompts(n: int, prompt_len: int, shared: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    head = [rng.randrange(150_000) for _ in range(shared)]
    return [head + [rng.randrange(150_000) for _ in range(prompt_len - shared)] for _ in range(n)]


def make_cache(args: argparse.Namespace) -> PrefixCache:
    per_request = -(-(args.prompt_len + args.max_tokens) // args.block_size)
    return PrefixCache(
        num_blocks=1 + per_request * (args.requests + 1),
        block_size=args.block_size,
        num_snapshot_slots=args.snapshot_slots,
        stride=args.stride,
        salt=b"bench",
    )


def warm_up(cache: PrefixCache, prompt: Sequence[int], stride: int) -> None:
    """Compute one prompt in stride chunks, publishing every snapshot, then release it."""
    cache.admit("warm", prompt, 1)
    for end in range(stride, len(prompt) + 1, stride):
        save = cache.on_computed("warm", prompt, end, snapshot_ok=True)
        if save is not None:
            cache.publish(save)
    cache.release("warm")


def time_per_op(fn: Callable[[int], object], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def one_round(args: argparse.Namespace, prompts: list[list[int]], warm: bool) -> dict[str, float]:
    cache = make_cache(args)
    if warm:
        warm_up(cache, prompts[0][: args.shared], args.stride)
    n = len(prompts)
    ids = [f"r{i}" for i in range(n)]
    out = {"match": time_per_op(lambda i: cache.match(prompts[i]), n)}
    results = []
    out["admit"] = time_per_op(
        lambda i: results.append(cache.admit(ids[i], prompts[i], args.max_tokens)), n
    )
    assert all(r.admission is Admission.NOW for r in results)
    hit = results[-1].cached_tokens
    if warm:
        assert hit > 0, "warm run did not hit"
        for i in range(n):
            cache.restore_done(ids[i])
    out["release"] = time_per_op(lambda i: cache.release(ids[i]), n)
    out["cached_tokens"] = float(hit)
    # Registration of a whole prompt by a fresh request, chunk by chunk (once per prefill).
    cache.admit("reg", prompts[-1][::-1], 1)
    ends = list(range(args.stride, args.prompt_len + 1, args.stride))
    t0 = time.perf_counter()
    for end in ends:
        save = cache.on_computed("reg", prompts[-1][::-1], end, snapshot_ok=True)
        if save is not None:
            cache.publish(save)
    out["on_computed_prompt"] = (time.perf_counter() - t0) * 1e6
    cache.release("reg")
    cache.check_invariants()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.cache.micro",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=4096)
    ap.add_argument("--shared", type=int, default=3072, help="shared prefix tokens (warm hit)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--stride", type=int, default=256)
    ap.add_argument("--snapshot-slots", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", help="append one JSON line with the results to this file")
    args = ap.parse_args()

    prompts = build_prompts(args.requests, args.prompt_len, args.shared, args.seed)
    rows: dict[str, dict[str, float]] = {}
    for label, warm in (("cold", False), ("warm", True)):
        runs = [one_round(args, prompts, warm) for _ in range(args.rounds)]
        rows[label] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}

    print(
        f"{args.requests} requests x {args.prompt_len} tokens, block {args.block_size}, "
        f"stride {args.stride}, shared prefix {args.shared}, median of {args.rounds} rounds"
    )
    print(f"{'cache':<6} {'match us':>10} {'admit us':>10} {'release us':>11} {'cached':>7}")
    for label, r in rows.items():
        print(
            f"{label:<6} {r['match']:>10.1f} {r['admit']:>10.1f} {r['release']:>11.1f} "
            f"{int(r['cached_tokens']):>7}"
        )
    reg = rows["cold"]["on_computed_prompt"]
    print(f"on_computed over one {args.prompt_len}-token prompt (all chunks): {reg:.1f} us")
    if args.json_out:
        record = {
            "bench": "micro_cache",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "python": platform.python_version(),
            "args": vars(args) | {"json_out": None},
            "results_us": rows,
        }
        with open(args.json_out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
