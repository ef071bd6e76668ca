"""The torch backend's LM-head kernel, side by side: ``F.linear(x, W)`` on the checkpoint's
[vocab, H] weight, ``x @ W_t`` on a contiguous [H, vocab] copy, the weight packed once the way
``torch/model.py`` ``LmHead`` keeps it on the CPU (oneDNN's blocked layout, or native.c's
projection kernel's on a CPU with AVX2 and no AVX512; the ledger names which), and the int8 screen
(``torch/screen.py``: a greedy pick, and a top-20 draw, from the candidates alone, with its int8
GEMV in the C kernel of ``kernels/native.c`` where it is compiled and on oneDNN; the packed
arm's time is what the full head costs such a pick before its argmax or draw), at the row
counts a decode step has, interleaved over rounds in one process. The screen's picks are
checked equal to the packed head's first. One ledger line to
``bench/runs/lm-head-layout.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.kernels.lm_head_layout [--hidden 256 --vocab 248320]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common.provenance import REPO_ROOT, append_ledger, arguments
from bench.common.timing import interleaved_ms
from tt_serve.model.interface import RowSampling, StepRow
from tt_serve.model.torch import screen as screen_mod
from tt_serve.model.torch.model import LmHead
from tt_serve.model.torch.outputs import pick_on_device, pick_screened
from tt_serve.model.torch.screen import ScreenedHead

LEDGER = REPO_ROOT / "bench" / "runs" / "lm-head-layout.jsonl"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.lm_head_layout", description=__doc__)
    ap.add_argument("--hidden", type=int, default=256)  # the demo model's
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16, 32])
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    w = torch.randn(a.vocab, a.hidden) * a.hidden**-0.5
    w_t = w.t().contiguous()
    packed = LmHead(w)
    # the full head's kernel: native.c's projection kernel on an AVX2-only CPU, else oneDNN's
    kernel = packed.packed.kernel if packed.packed is not None else "matmul"
    screen = packed.screened
    results = {}
    for rows in a.rows:
        x = torch.randn(rows, a.hidden)
        arms: dict[str, Callable[[], object]] = {
            "linear_vocab_major": lambda x=x: F.linear(x, w),
            "matmul_hidden_major": lambda x=x: x @ w_t,
            "packed": lambda x=x: packed(x),
        }
        if screen is not None:
            greedy, top20 = _rows(rows, 0), _rows(rows, 20)
            for r in (greedy, top20):
                if not torch.equal(pick_screened(screen, x, r), pick_on_device(packed(x), r)):
                    raise SystemExit("the screened head picked other tokens than the full one")
            arms["screen_greedy"] = lambda x=x, r=greedy: pick_screened(screen, x, r)
            arms["screen_top20"] = lambda x=x, r=top20: pick_screened(screen, x, r)
            if screen.native is not None:  # the same picks with oneDNN's GEMV in the C one's place
                arms["screen_greedy_onednn"] = lambda x=x, r=greedy: _onednn(screen, x, r)
                arms["screen_top20_onednn"] = lambda x=x, r=top20: _onednn(screen, x, r)
        ms = interleaved_ms(arms, a.calls, a.rounds)
        ratio = ms["linear_vocab_major"] / ms["matmul_hidden_major"]
        packed_ratio = ms["matmul_hidden_major"] / ms["packed"]
        results[str(rows)] = {**ms, "speedup": ratio, "packed_over_matmul": packed_ratio}
        shown = "".join(
            f", {k} {ms[k]:6.2f} ms"
            for k in (
                "screen_greedy",
                "screen_top20",
                "screen_greedy_onednn",
                "screen_top20_onednn",
            )
            if k in ms
        )
        print(
            f"rows {rows:3d}: [V,H] linear {ms['linear_vocab_major']:6.2f} ms, "
            f"[H,V] matmul {ms['matmul_hidden_major']:6.2f} ms, "
            f"packed ({kernel}) {ms['packed']:6.2f} ms (x{packed_ratio:.2f} vs matmul)" + shown,
            flush=True,
        )
    append_ledger(
        a.ledger,
        "lm_head_layout",
        params=arguments(a),
        threads=torch.get_num_threads(),
        packed_kernel=kernel,
        results_ms=results,
    )
    return 0


def _onednn(screen: ScreenedHead, x: torch.Tensor, rows: list[StepRow]) -> torch.Tensor | None:
    """``pick_screened`` with the screen's int8 GEMV on oneDNN (its C kernel off)."""
    saved, screen_mod.NATIVE_ROWS = screen_mod.NATIVE_ROWS, 0
    try:
        return pick_screened(screen, x, rows)
    finally:
        screen_mod.NATIVE_ROWS = saved


def _rows(n: int, top_k: int) -> list[StepRow]:
    """n decode rows: greedy (top_k 0) or drawn at temperature 0.7, top-p 0.9, that top-k."""
    return [
        StepRow(
            seq_id=i,
            token_ids=(1,),
            start_pos=1,
            block_table=(1,),
            state_slot=i,
            sample=True,
            sampling=RowSampling(0.7, top_k, 0.9, 0.0, (i + 0.5) / n) if top_k else None,
        )
        for i in range(n)
    ]


if __name__ == "__main__":
    raise SystemExit(main())
