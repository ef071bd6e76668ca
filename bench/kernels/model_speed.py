"""Prefill and decode throughput of the torch backend beside HF transformers, one run, one model.

Usage: python -m bench.kernels.model_speed [--threads 2] [--prefill 2048] [--decode 32]
Builds the tiny dense checkpoint of tests/tiny_models.py (8 layers, hidden 256, vocab 4096)
in a temp dir, then times both implementations alternately so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tests import tiny_models as tm
from tt_serve.model.interface import StepBatch, StepRow
from tt_serve.model.torch.backend import TorchBackend

BLOCK = 64


def _row(seq: int, ids: list[int], start: int, width: int) -> StepRow:
    table = tuple(range(1 + seq * width, 1 + (seq + 1) * width))
    return StepRow(seq, tuple(ids), start, table, seq + 1, sample=True)


def ours_prefill(be: TorchBackend, ids: list[int], width: int) -> float:
    t = time.perf_counter()
    be.execute(StepBatch((_row(0, ids, 0, width),)))
    return time.perf_counter() - t


def ours_decode(be: TorchBackend, batch: int, ctx: int, steps: int, width: int) -> float:
    prompts = [[3 + (i * 7 + s) % 4000 for i in range(ctx)] for s in range(batch)]
    be.execute(StepBatch(tuple(_row(s, p, 0, width) for s, p in enumerate(prompts))))
    toks = [5] * batch
    t = time.perf_counter()
    for n in range(steps):
        rows = tuple(_row(s, [toks[s]], ctx + n, width) for s in range(batch))
        toks = [int(x or 0) for x in be.execute(StepBatch(rows)).token_ids]
    return batch * steps / (time.perf_counter() - t)


def hf_prefill(hf: Any, ids: list[int]) -> float:
    t = time.perf_counter()
    with torch.no_grad():
        hf(torch.tensor([ids]))
    return time.perf_counter() - t


def hf_decode(hf: Any, batch: int, ctx: int, steps: int) -> float:
    """HF forward with its own cache, one token per step (what ``generate`` does, minus overhead)."""
    ids = torch.tensor([[3 + (i * 7 + s) % 4000 for i in range(ctx)] for s in range(batch)])
    with torch.no_grad():
        out = hf(ids, use_cache=True)
        cache = out.past_key_values
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        t = time.perf_counter()
        for _ in range(steps):
            out = hf(tok, cache=cache, use_cache=True)
            cache = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
    return batch * steps / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.model_speed", description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = tm.make_dense(Path(tmp) / "dense", layers=8)
        hf = tm.load_hf(path).to(args.device)
        be = TorchBackend.from_pretrained(path, device=args.device)
        width = -(-(max(args.prefill, args.ctx + args.decode) + 1) // BLOCK)
        be.allocate(
            num_kv_blocks=9 * width + 1, block_size=BLOCK, num_state_slots=10, num_snapshot_slots=1
        )
        ids = [3 + (i * 13) % 4000 for i in range(args.prefill)]
        res: dict[str, list[float]] = {}
        for _ in range(args.repeats):  # alternate so noise hits both sides alike
            res.setdefault("hf_prefill", []).append(args.prefill / hf_prefill(hf, ids))
            res.setdefault("ours_prefill", []).append(args.prefill / ours_prefill(be, ids, width))
            for b in (1, 8):
                res.setdefault(f"hf_decode_b{b}", []).append(
                    hf_decode(hf, b, args.ctx, args.decode)
                )
                res.setdefault(f"ours_decode_b{b}", []).append(
                    ours_decode(be, b, args.ctx, args.decode, width)
                )
    print(
        f"tiny dense 8L, {args.device}, {args.threads} threads, best of {args.repeats} (tokens/s)"
    )
    for key in ("prefill", "decode_b1", "decode_b8"):
        hf_v, ours_v = max(res[f"hf_{key}"]), max(res[f"ours_{key}"])
        print(
            f"{key:10s} hf {hf_v:9.1f}   torch backend {ours_v:9.1f}   ratio {ours_v / hf_v:5.2f}"
        )


if __name__ == "__main__":
    main()
