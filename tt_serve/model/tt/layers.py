"""Small device building blocks shared by the ttnn layers (same formulas as ``ref/layers.py``)."""

from __future__ import annotations

from tt_serve.model.tt.ops import Ops, Tensor


def apply_rope(ops: Ops, x: Tensor, cos: Tensor, sin: Tensor, rot: Tensor) -> Tensor:
    """Partial rotate-half RoPE on x [1, N, heads, hd] with cos/sin [1, N, 1, hd].

    ``rot`` is the [hd, hd] rotate-half matrix, zero past the rotary channels, where cos is 1 and
    sin 0: one full-width formula, no slicing of head channels."""
    return ops.add(ops.mul(x, cos), ops.mul(ops.matmul(x, rot), sin))


def l2norm(ops: Ops, x: Tensor, eps: float = 1e-6) -> Tensor:
    """x · rsqrt(Σx² + eps) over the last dim (decode path; the chunked op normalises itself)."""
    return ops.mul(x, ops.rsqrt(ops.add(ops.sum(ops.mul(x, x), -1), eps)))


def swiglu(ops: Ops, x: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    return ops.linear(ops.mul(ops.silu(ops.linear(x, gate)), ops.linear(x, up)), down)
