"""Every weight precision profile at full depth on the CPU, against the float32 reference.

The torch backend holds a profile's weights as the card stores them (``--precision``: bfloat16,
or bfloat8_b / bfloat4_b block floats decoded in native.c's kernel, bf16 matmul inputs), so a
whole model runs in each profile at CPU speed. On a seeded prompt set the float32 backend
decodes greedily; every profile then runs teacher-forced over the same prompt + float32 tokens
(``execute_all_logits``), so each position compares two distributions on identical inputs:

- top-1: the profile's argmax is the float32 token; top-5: the float32 token is in its top 5;
- KL(float32 || profile) in nats per position (mean, p99);
- |Δ logprob| of the float32 token (mean, p99, max);
- whole greedy continuations (run freely in the profile) equal to the float32 one.

The default checkpoint is the published Qwen3.5-0.8B shape at its full 24 layers (random
weights, the context-sensitive init, written once to a temp folder): random weights have flatter
distributions and more near-ties than a trained model's, so agreement here is a lower bound.
Profiles are built one at a time (the float32 logits are kept), so memory holds two models.
One ledger line to ``bench/runs/precision-profiles.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.precision.profiles [--shape qwen3.5-0.8b] [--layers N]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common.checkpoint import write_checkpoint
from bench.common.provenance import REPO_ROOT, append_ledger, arguments
from bench.precision.drift import BLOCK, forced_logprobs, greedy, prompt_args
from tt_serve.model.precision import PROFILES
from tt_serve.model.torch.backend import TorchBackend

LEDGER = REPO_ROOT / "bench" / "runs" / "precision-profiles.jsonl"


def backend(path: Path, profile: str | None, tokens: int) -> TorchBackend:
    be = TorchBackend.from_pretrained(path, precision=profile)
    blocks = -(-tokens // BLOCK) + 1
    be.allocate(num_kv_blocks=blocks, block_size=BLOCK, num_state_slots=2, num_snapshot_slots=1)
    return be


def compare(ref: list[torch.Tensor], got: list[torch.Tensor], nxt: list[torch.Tensor]) -> dict:
    """Agreement and drift over every generated position of every prompt."""
    top1, top5, kl, drift = [], [], [], []
    for lp_ref, lp, tok in zip(ref, got, nxt, strict=True):
        top1 += (lp.argmax(-1) == tok).tolist()
        top5 += (lp.topk(5, dim=-1).indices == tok[:, None]).any(-1).tolist()
        kl += (lp_ref.exp() * (lp_ref - lp)).sum(-1).tolist()
        drift += (lp.gather(1, tok[:, None]) - lp_ref.gather(1, tok[:, None])).abs()[:, 0].tolist()
    k, d = np.asarray(kl), np.asarray(drift)
    return {
        "positions": len(top1),
        "top1": round(float(np.mean(top1)), 4),
        "top5": round(float(np.mean(top5)), 4),
        "kl_nats": {"mean": float(k.mean()), "p99": float(np.quantile(k, 0.99))},
        "logprob_drift": {
            "mean": float(d.mean()),
            "p99": float(np.quantile(d, 0.99)),
            "max": float(d.max()),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.precision.profiles", description=__doc__)
    ap.add_argument("--shape", default="qwen3.5-0.8b", help="a published model's shape")
    ap.add_argument("--layers", type=int, default=0, help="layers (0: the model's all)")
    ap.add_argument("--model", type=Path, default=None, help="a checkpoint folder instead")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    prompt_args(ap, 8, LEDGER)
    a = ap.parse_args(argv)
    tokens = a.prompt_len + a.steps
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = a.model
        if path is None:
            from tt_serve.model.published import published_config

            text = published_config(a.shape)["text_config"]
            layers = a.layers or text["num_hidden_layers"]
            path = write_checkpoint(Path(tmp) / "ckpt", a.shape, layers, text["vocab_size"], a.seed)
        fp32 = backend(path, None, tokens)
        rng = np.random.default_rng(a.seed)
        vocab = fp32.spec.vocab_size
        prompts = [rng.integers(100, vocab, a.prompt_len).tolist() for _ in range(a.prompts)]
        refs = [greedy(fp32, p, a.steps) for p in prompts]
        pos = torch.arange(a.prompt_len - 1, tokens - 1)
        ref_lp = [forced_logprobs(fp32, p + r)[pos] for p, r in zip(prompts, refs, strict=True)]
        nxt = [torch.tensor(r) for r in refs]
        layers_run = fp32.spec.num_layers
        del fp32
        gc.collect()
        for profile in a.profiles.split(","):
            t = time.perf_counter()
            be = backend(path, profile, tokens)
            load_s = time.perf_counter() - t
            lps = [forced_logprobs(be, p + r)[pos] for p, r in zip(prompts, refs, strict=True)]
            same = sum(greedy(be, p, a.steps) == r for p, r in zip(prompts, refs, strict=True))
            results[profile] = compare(ref_lp, lps, nxt) | {
                "greedy_sequences_equal": same / len(prompts),
                "load_s": round(load_s, 1),
            }
            print(profile, json.dumps(results[profile]), flush=True)
            del be, lps
            gc.collect()
    params = {**arguments(a, "model"), "model": a.model.name if a.model else a.shape}
    append_ledger(a.ledger, "precision_profiles", params=params, layers=layers_run, results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
