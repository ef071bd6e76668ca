"""The torch backend's projection kernel, side by side: ``F.linear(x, W)`` (MKL, which repacks
its operand every call) against ``ref/layers.py`` ``Linear`` (the weight reordered once into
oneDNN's blocked layout), for every projection shape of a model as the backend runs it (fused
GDN in-projection, fused q/k/v, fused gate/up, the out / down projections, the LM head), at the
row counts of decode steps and of a prefill chunk, interleaved over rounds in one process. Also
checks the packed kernel's batch invariance (a row's result alone equals it inside the batch)
and its largest difference from ``F.linear``. One ledger line to
``bench/runs/linear-kernels.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.linear_kernels [--model DIR] [--rows 1 8 32 256]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.provenance import REPO_ROOT, append_ledger, arguments
from bench.timing import interleaved_ms
from tt_serve.model.ref.layers import Linear, packs
from tt_serve.model.spec import ModelSpec

LEDGER = REPO_ROOT / "bench" / "runs" / "linear-kernels.jsonl"


def projection_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """[out, in] of every distinct projection the torch backend multiplies (fused as it runs)."""
    h, hv = spec.hidden_size, spec.linear_num_value_heads
    hd, heads, kvh = spec.head_dim, spec.num_attention_heads, spec.num_kv_heads
    shapes = {
        "gdn.in_proj": (spec.conv_dim + spec.gdn_value_dim + 2 * hv, h),
        "gdn.out_proj": (h, spec.gdn_value_dim),
        "attn.qkv_proj": (2 * heads * hd + 2 * kvh * hd, h),
        "attn.o_proj": (h, heads * hd),
        "lm_head": (spec.vocab_size, h),
    }
    if spec.intermediate_size:
        shapes["mlp.gate_up"] = (2 * spec.intermediate_size, h)
        shapes["mlp.down"] = (h, spec.intermediate_size)
    return shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.linear_kernels", description=__doc__)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder; default: demo")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256])
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    if a.model is None:
        from tt_serve.demo import ensure_demo_model

        spec = ModelSpec.from_hf_dir(ensure_demo_model())
    else:
        spec = ModelSpec.from_hf_dir(a.model)
    gen = torch.Generator().manual_seed(0)
    if not packs(torch.empty(1, 1)):
        print("this torch has no oneDNN packed linear on the CPU: Linear is F.linear here")
    results: dict[str, dict[str, dict[str, float]]] = {}
    checks: dict[str, dict[str, float | bool]] = {}
    for name, (out, inp) in projection_shapes(spec).items():
        w = torch.randn(out, inp, generator=gen) * inp**-0.5
        packed = Linear(w)
        x_all = torch.randn(max(a.rows), inp, generator=gen)
        full = packed(x_all)
        checks[name] = {
            "batch_invariant": all(torch.equal(packed(x_all[:r]), full[:r]) for r in a.rows),
            "max_abs_diff_vs_f_linear": float((full - F.linear(x_all, w)).abs().max()),
        }
        results[name] = {}
        for rows in a.rows:
            x = x_all[:rows].contiguous()
            arms: dict[str, Callable[[], object]] = {
                "f_linear": lambda x=x, w=w: F.linear(x, w),
                "packed": lambda x=x, p=packed: p(x),
            }
            ms = interleaved_ms(arms, a.calls, a.rounds)
            speedup = ms["f_linear"] / ms["packed"]
            results[name][str(rows)] = {**ms, "speedup": speedup}
            print(
                f"{name:14s} [{out:6d} x {inp:4d}] rows {rows:3d}: F.linear {ms['f_linear']:8.3f}"
                f" ms, packed {ms['packed']:8.3f} ms (x{speedup:.2f})",
                flush=True,
            )
        print(f"{name:14s} {checks[name]}", flush=True)
    append_ledger(
        a.ledger,
        "linear_kernels",
        params={
            **arguments(a, "model"),
            "model": a.model.name if a.model else "demo",
        },
        threads=torch.get_num_threads(),
        results_ms=results,
        checks=checks,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
