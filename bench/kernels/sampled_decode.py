"""Sampled decode: device draws vs host draws vs greedy, side by side in one process.

Three arms on the same model, interleaved over rounds: ``greedy`` (temperature 0, the device
argmax), ``device`` (temperature 0.7, top-p 0.9, top-k 20 drawn on the device, ids only cross)
and ``host`` (the same requests with ``device_sampling=False``: every row's fp32 logits cross to
the host sampler each step, the path before device sampling). N concurrent seeded requests of
``--prompt-len`` token-id prompts and ``--tokens`` output tokens each, for every N in
``--batches``. Per arm: output tok/s (median over rounds), the backend's device -> host bytes per
output token and per decode step, and whether the two sampled arms gave identical tokens (they
must: same uniforms, same rules). With ``--ttnn-plan MODEL`` it also plans MODEL on the
shape-only ttnn device model (``tt-serve plan``) at every N and records the device -> host
bytes of a greedy, a device-sampled and a host-sampled decode step there (no timing: there is
no card). One ledger line to ``bench/runs/sampled-decode.jsonl``.

    python -m bench.kernels.sampled_decode --batches 8,32 --rounds 3 --ttnn-plan qwen3.5-9b
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common.provenance import REPO_ROOT, append_ledger
from tt_serve import LLM
from tt_serve.demo import ensure_demo_model
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.sequence import SamplingParams

LEDGER = REPO_ROOT / "bench" / "runs" / "sampled-decode.jsonl"
SAMPLED: dict[str, Any] = dict(temperature=0.7, top_p=0.9, top_k=20)
ARMS = ("greedy", "device", "host")


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def _params(arm: str, n: int, tokens: int) -> list[SamplingParams]:
    setting = dict(temperature=0.0) if arm == "greedy" else SAMPLED
    return [
        SamplingParams(max_tokens=tokens, ignore_eos=True, seed=1000 + i, **setting)
        for i in range(n)
    ]


def _run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, Any]:
    be = llm.engine.backend
    assert isinstance(be, TorchBackend)
    before = be.host_bytes
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    return {
        "tok_s": tokens / seconds,
        "bytes_per_token": (be.host_bytes - before) / tokens,
        "ids": [o.token_ids for o in outs],
    }


def _ttnn_readback(model: str, device: str, batches: list[int]) -> dict[str, Any]:
    """Bytes per decode step of each kind on the shape-only plan, per max batch."""
    from tt_serve.model.published import write_published_config
    from tt_serve.model.spec import ModelSpec
    from tt_serve.model.tt.boards import device_spec
    from tt_serve.model.tt.options import TTOptions
    from tt_serve.model.tt.plan import planner

    with tempfile.TemporaryDirectory() as tmp:
        spec = ModelSpec.from_hf_dir(write_published_config(model, Path(tmp)))
    out: dict[str, Any] = {}
    for n in batches:
        p = planner.plan(spec, device_spec(device), TTOptions(max_batch_size=n))
        out[f"batch_{n}"] = p.readback if p.ok else {"limit": p.limit_rule}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.sampled_decode", description=__doc__)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder (demo model)")
    ap.add_argument("--batches", default="8,32", help="concurrent requests, comma-separated")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ttnn-plan", default=None, help="a published model to plan, e.g. qwen3.5-9b")
    ap.add_argument("--ttnn-device", default="p150", help="the device description it plans on")
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    path = a.model or ensure_demo_model(log=lambda s: None)
    batches = [int(b) for b in a.batches.split(",")]
    llms = {
        arm: LLM(path, max_batch_size=max(batches), device_sampling=arm != "host") for arm in ARMS
    }
    vocab = llms["greedy"].engine.config.vocab_size
    results: dict[str, Any] = {}
    for n in batches:
        prompts = _prompts(n, a.prompt_len, vocab, seed=n)
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        for _ in range(a.rounds):
            for arm in ARMS:
                runs[arm].append(_run(llms[arm], prompts, _params(arm, n, a.tokens)))
        row: dict[str, Any] = {}
        for arm in ARMS:
            tok_s = statistics.median(r["tok_s"] for r in runs[arm])
            per_token = statistics.median(r["bytes_per_token"] for r in runs[arm])
            row[arm] = {
                "tok_s": round(tok_s, 1),
                "tok_s_rounds": [round(r["tok_s"], 1) for r in runs[arm]],
                "bytes_per_token": round(per_token, 1),
                "bytes_per_decode_step": round(per_token * n),
            }
        row["device_over_host"] = round(row["device"]["tok_s"] / row["host"]["tok_s"], 3)
        row["device_over_greedy"] = round(row["device"]["tok_s"] / row["greedy"]["tok_s"], 3)
        row["sampled_tokens_equal"] = all(
            d["ids"] == h["ids"] for d, h in zip(runs["device"], runs["host"], strict=True)
        )
        results[f"batch_{n}"] = row
        print(f"batch {n}: {row}")
    if a.ttnn_plan:
        results["ttnn_plan"] = _ttnn_readback(a.ttnn_plan, a.ttnn_device, batches)
        print(f"ttnn plan: {results['ttnn_plan']}")
    params = {
        "ttnn_plan": a.ttnn_plan,
        "ttnn_device": a.ttnn_device,
        "model": str(a.model or "demo"),
        "batches": batches,
        "prompt_len": a.prompt_len,
        "tokens": a.tokens,
        "rounds": a.rounds,
        "sampled": SAMPLED,
    }
    append_ledger(a.ledger, "sampled_decode", params=params, results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
