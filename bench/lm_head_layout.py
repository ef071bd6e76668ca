"""The torch backend's LM-head kernel, side by side: ``F.linear(x, W)`` on the checkpoint's
[vocab, H] weight, ``x @ W_t`` on a contiguous [H, vocab] copy, and the weight reordered once
into oneDNN's blocked layout (``ref/model.py`` ``LmHead`` on the CPU), at the row counts a
decode step has, interleaved over rounds in one process. One ledger line to
``bench/runs/lm-head-layout.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.lm_head_layout [--hidden 256 --vocab 248320]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.provenance import REPO_ROOT, append_ledger
from bench.timing import interleaved_ms
from tt_serve.model.ref.model import LmHead

LEDGER = REPO_ROOT / "bench" / "runs" / "lm-head-layout.jsonl"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lm_head_layout", description=__doc__)
    ap.add_argument("--hidden", type=int, default=256)  # the demo model's
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16, 32])
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    w = torch.randn(a.vocab, a.hidden)
    w_t = w.t().contiguous()
    packed = LmHead(w)
    results = {}
    for rows in a.rows:
        x = torch.randn(rows, a.hidden)
        arms: dict[str, Callable[[], object]] = {
            "linear_vocab_major": lambda x=x: F.linear(x, w),
            "matmul_hidden_major": lambda x=x: x @ w_t,
            "onednn_packed": lambda x=x: packed(x),
        }
        ms = interleaved_ms(arms, a.calls, a.rounds)
        ratio = ms["linear_vocab_major"] / ms["matmul_hidden_major"]
        packed_ratio = ms["matmul_hidden_major"] / ms["onednn_packed"]
        results[str(rows)] = {**ms, "speedup": ratio, "packed_over_matmul": packed_ratio}
        print(
            f"rows {rows:3d}: [V,H] linear {ms['linear_vocab_major']:6.2f} ms, "
            f"[H,V] matmul {ms['matmul_hidden_major']:6.2f} ms, "
            f"oneDNN packed {ms['onednn_packed']:6.2f} ms (x{packed_ratio:.2f} vs matmul)",
            flush=True,
        )
    append_ledger(
        a.ledger,
        "lm_head_layout",
        params={k: v for k, v in vars(a).items() if k != "ledger"},
        threads=torch.get_num_threads(),
        results_ms=results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
