"""One Gated DeltaNet layer of the torch backend, side by side: the fused C call
(``kernels/native_layers.c`` ``tt_gdn``: conv, norms, gates, the delta rule token by token, the output
norm) against the torch ops of ``ref/gdn.py`` (the chunked scan for spans, the recurrent step
for decode rows), both between the same two oneDNN projections, at the row shapes a step has:
decode batches and prefill spans. Interleaved over rounds in one process; the two arms'
outputs are checked close first. One ledger line to ``bench/runs/gdn-kernels.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.kernels.gdn [--hidden 256 --heads 2 4 64 64]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.common.provenance import REPO_ROOT, append_ledger, arguments
from bench.common.timing import interleaved_ms
from tt_serve.model.interface import StepBatch, StepRow
from tt_serve.model.ref.gdn import GdnWeights, fused_kernels, gdn_forward
from tt_serve.model.ref.plan import StepPlan

LEDGER = REPO_ROOT / "bench" / "runs" / "gdn-kernels.jsonl"
# (name, rows of (tokens)): decode batches of single tokens, prefill spans
SHAPES = {
    "decode_b1": (1,),
    "decode_b8": (1,) * 8,
    "decode_b32": (1,) * 32,
    "span_64": (64,),
    "span_256": (256,),
    "span_2048": (2048,),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.gdn", description=__doc__)
    ap.add_argument("--hidden", type=int, default=256)  # the demo model's
    ap.add_argument("--heads", type=int, nargs=4, default=[2, 4, 64, 64], help="Hk Hv dk dv")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    if fused_kernels() is None:
        raise SystemExit("the C kernels are not compiled here (tt-serve doctor says why)")
    hk, hv, dk, dv = a.heads
    w = GdnWeights.random(a.hidden, (hk, hv, dk, dv), seed=0)
    results = {}
    for name in a.shapes:
        lens = SHAPES[name]
        rows = tuple(
            StepRow(i, tuple(range(n)), 0, tuple(range(-(-n // 64))), i, sample=False)
            for i, n in enumerate(lens)
        )
        plan = StepPlan.build(StepBatch(rows), 64, torch.device("cpu"))
        x = torch.randn(sum(lens), a.hidden)
        conv = torch.zeros(len(lens), 2 * hk * dk + hv * dv, 3)
        rec = torch.zeros(len(lens), hv, dk, dv)
        fused = gdn_forward(x, w, plan, conv.clone(), rec.clone())
        ops = gdn_forward(x, w, plan, conv.clone(), rec.clone(), fused=False)
        if not torch.allclose(fused, ops, rtol=1e-3, atol=1e-4):
            raise SystemExit(f"{name}: the fused layer and the torch ops disagree")
        ms = interleaved_ms(
            {
                "fused_c": lambda x=x, p=plan, c=conv, r=rec: gdn_forward(x, w, p, c, r),
                "torch_ops": lambda x=x, p=plan, c=conv, r=rec: gdn_forward(
                    x, w, p, c, r, fused=False
                ),
            },
            a.calls,
            a.rounds,
        )
        tokens = sum(lens)
        us = {k: v * 1e3 / tokens for k, v in ms.items()}
        results[name] = {**ms, "us_per_token": us, "speedup": ms["torch_ops"] / ms["fused_c"]}
        print(
            f"{name:10s}: fused C {ms['fused_c']:7.3f} ms ({us['fused_c']:6.2f} us/token), "
            f"torch ops {ms['torch_ops']:7.3f} ms ({us['torch_ops']:6.2f} us/token), "
            f"x{ms['torch_ops'] / ms['fused_c']:.2f}",
            flush=True,
        )
    append_ledger(
        a.ledger,
        "gdn_kernels",
        params=arguments(a),
        threads=torch.get_num_threads(),
        results_ms=results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
