"""In-process A/B of prefix caching on vs off through the offline ``LLM`` API (no HTTP).

It isolates the engine from the server, the client and the network: both arms are loaded in
one process with the same weights and run alternately (A B, B A, ...), timing wall and process
CPU seconds per phase. Phases:

* ``cold``: N all-miss prompts of L tokens (fresh random tokens every round): the cold-path
  cost of caching is on/off of their makespan.
* ``prefix``: a fresh head H plus a suffix S. The off arm computes H + S (cold); the on arm is
  primed with H + another suffix, then computes only the tail (warm). Reported: warm/cold time
  to the first token, and the warm tail's tokens/s over the cold run's tokens/s.

One JSON line per round is appended to the ledger (default ``bench/runs/engine-ab.jsonl``) with
the commit, dirty flag, source hash, machine, parameters and every timing.

    python -m bench.cache.engine_ab --model DIR --rounds 4
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common.provenance import arguments, git_info, machine_info
from tt_serve import LLM, SamplingParams


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict[str, float]:
    c, t = _cpu(), time.perf_counter()
    outs = llm.generate(prompts, params)
    wall, cpu = time.perf_counter() - t, _cpu() - c
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "cached_tokens": float(sum(o.cached_tokens for o in outs)),
    }


def _tokens(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [rng.randrange(lo, hi) for _ in range(n)]


def run_round(arms: dict[str, LLM], a: argparse.Namespace, r: int) -> dict[str, Any]:
    rng = random.Random(a.seed * 1000 + r)
    lo, hi = a.token_range
    order = ("on", "off") if r % 2 == 0 else ("off", "on")
    cold_prompts = [_tokens(rng, a.cold_len, lo, hi) for _ in range(a.cold_n)]
    decode = SamplingParams(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    head = _tokens(rng, a.head, lo, hi)
    prompt = head + _tokens(rng, a.suffix, lo, hi)
    primer = head + _tokens(rng, a.suffix, lo, hi)
    phases: dict[str, dict[str, Any]] = {"cold": {}, "prefix": {}}
    for arm in order:
        phases["cold"][arm] = _timed(arms[arm], cold_prompts, decode)
    arms["on"].generate([primer], first)
    for arm in order:
        phases["prefix"][arm] = _timed(arms[arm], [prompt], first)
    warm, cold = phases["prefix"]["on"], phases["prefix"]["off"]
    tail = len(prompt) - int(warm["cached_tokens"])
    return {
        "round": r,
        "order": "".join("A" if x == "on" else "B" for x in order),
        "phases": phases,
        "ratios": {
            "cold_path_wall_on_off": phases["cold"]["on"]["wall_s"]
            / phases["cold"]["off"]["wall_s"],
            "cold_path_cpu_on_off": phases["cold"]["on"]["cpu_s"] / phases["cold"]["off"]["cpu_s"],
            "warm_cold_ttft": warm["wall_s"] / cold["wall_s"],
            "warm_tail_speed_over_cold": (tail / warm["wall_s"]) / (len(prompt) / cold["wall_s"]),
        },
        "warm_cached_tokens": int(warm["cached_tokens"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.cache.engine_ab", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", required=True)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cold-n", type=int, default=8)
    p.add_argument("--cold-len", type=int, default=2112)
    p.add_argument("--head", type=int, default=4096)
    p.add_argument("--suffix", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--kv-blocks", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--token-range", type=int, nargs=2, default=(1000, 200000))
    p.add_argument("--ledger", default="bench/runs/engine-ab.jsonl")
    a = p.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    arms = {
        "on": LLM(a.model, kv_blocks=a.kv_blocks, prefix_caching=True),
        "off": LLM(a.model, kv_blocks=a.kv_blocks, prefix_caching=False),
    }
    arms["on"].generate([[a.token_range[0]] * 8], SamplingParams(max_tokens=2))  # warm-up
    arms["off"].generate([[a.token_range[0]] * 8], SamplingParams(max_tokens=2))
    # The checkpoint by its folder name: a ledger line names no path of the machine it ran on.
    params = arguments(a)
    params["model"] = Path(a.model).name
    prov = {"git": git_info(), "machine": machine_info(), "params": params}
    rounds = []
    Path(a.ledger).parent.mkdir(parents=True, exist_ok=True)
    for r in range(a.rounds):
        line = {"timestamp": time.time(), "bench": "engine_ab", **prov, **run_round(arms, a, r)}
        rounds.append(line)
        with open(a.ledger, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(json.dumps(line["ratios"]))
    for key in rounds[0]["ratios"]:
        vals = [x["ratios"][key] for x in rounds]
        print(
            f"{key}: median {statistics.median(vals):.3f} (range {min(vals):.3f}-{max(vals):.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
