"""The torch backend's projection kernels, side by side: ``F.linear(x, W)`` (MKL, which repacks
its operand every call) against ``ref/layers.py`` ``Linear`` on each CPU kernel it can run here
(oneDNN's packed GEMM, and native.c's projection kernel where it is compiled: AVX2 + FMA), for
every projection shape of a model as the backend runs it (fused GDN in-projection, fused q/k/v,
fused gate/up, the out / down projections, the LM head), at the row counts of decode steps and
of a prefill chunk, interleaved over rounds in one process. Also checks each kernel's batch
invariance (a row's result alone equals it inside the batch) and its largest difference from
``F.linear``. One ledger line to ``bench/runs/linear-kernels.jsonl``.

    OMP_NUM_THREADS=2 python -m bench.kernels.linear [--model DIR | --shape qwen3.5-0.8b]
        [--rows 1 8 32 256]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common.provenance import REPO_ROOT, append_ledger, arguments
from bench.common.timing import interleaved_ms
from tt_serve.model.kernels import native
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
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.linear", description=__doc__)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint folder; default: demo")
    ap.add_argument("--shape", default=None, help="a published model's shapes (no weights)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256])
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    if a.shape is not None:
        from tt_serve.model.published import write_published_config

        with tempfile.TemporaryDirectory() as tmp:
            spec = ModelSpec.from_hf_dir(write_published_config(a.shape, Path(tmp)))
    elif a.model is None:
        from tt_serve.demo import ensure_demo_model

        spec = ModelSpec.from_hf_dir(ensure_demo_model())
    else:
        spec = ModelSpec.from_hf_dir(a.model)
    gen = torch.Generator().manual_seed(0)
    kernels = ["onednn"] if packs(torch.empty(1, 1)) else []
    k = native.kernels()
    if k is not None and k.linear_compiled:
        kernels.append("native")
    if not kernels:
        print("no packed CPU kernel here (no oneDNN, no AVX2): Linear is F.linear")
    results: dict[str, dict[str, dict[str, float]]] = {}
    checks: dict[str, dict[str, dict[str, float | bool | str]]] = {}
    for name, (out, inp) in projection_shapes(spec).items():
        w = torch.randn(out, inp, generator=gen) * inp**-0.5
        lins = {kern: _linear(w, kern) for kern in kernels}
        x_all = torch.randn(max(a.rows), inp, generator=gen)
        checks[name] = {}
        for kern, lin in lins.items():
            full = lin(x_all)
            checks[name][kern] = {
                "kernel": lin.kernel,  # native needs 16-row blocks: else oneDNN's runs
                "batch_invariant": all(torch.equal(lin(x_all[:r]), full[:r]) for r in a.rows),
                "max_abs_diff_vs_f_linear": float((full - F.linear(x_all, w)).abs().max()),
            }
        results[name] = {}
        for rows in a.rows:
            x = x_all[:rows].contiguous()
            arms: dict[str, Callable[[], object]] = {"f_linear": lambda x=x, w=w: F.linear(x, w)}
            arms |= {kern: lambda x=x, p=lin: p(x) for kern, lin in lins.items()}
            ms = interleaved_ms(arms, a.calls, a.rounds)
            results[name][str(rows)] = ms
            shown = "".join(
                f", {kern} {ms[kern]:8.3f} ms (x{ms['f_linear'] / ms[kern]:.2f})" for kern in lins
            )
            print(
                f"{name:14s} [{out:6d} x {inp:4d}] rows {rows:3d}: F.linear {ms['f_linear']:8.3f}"
                f" ms{shown}",
                flush=True,
            )
        print(f"{name:14s} {checks[name]}", flush=True)
    append_ledger(
        a.ledger,
        "linear_kernels",
        params={
            **arguments(a, "model"),
            "model": a.shape or (a.model.name if a.model else "demo"),
        },
        threads=torch.get_num_threads(),
        results_ms=results,
        checks=checks,
    )
    return 0


@contextlib.contextmanager
def linear_kernel(kernel: str) -> Iterator[None]:
    """``Linear``s built inside run on ``kernel`` (``TT_SERVE_LINEAR``, read at construction)."""
    os.environ["TT_SERVE_LINEAR"] = kernel
    try:
        yield
    finally:
        os.environ.pop("TT_SERVE_LINEAR")


def _linear(w: torch.Tensor, kernel: str) -> Linear:
    with linear_kernel(kernel):
        return Linear(w)


if __name__ == "__main__":
    raise SystemExit(main())
