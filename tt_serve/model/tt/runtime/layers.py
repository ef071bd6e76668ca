"""Small device building blocks shared by the ttnn layers (same formulas as ``ref/layers.py``)."""

from __future__ import annotations

from typing import Any

from tt_serve.model.tt.ops import Ops, Tensor


def apply_rope(
    ops: Ops, x: Tensor, cos: Tensor, sin: Tensor, rot: Tensor, exact: Any = None
) -> Tensor:
    """Partial rotate-half RoPE on x [1, N, heads, hd] with cos/sin [1, N, 1, hd], or head-major
    x [1, heads, N, hd] with cos/sin [1, 1, N, hd] (cos/sin broadcast over the heads axis).

    ``rot`` is the [hd, hd] rotate-half matrix, zero past the rotary channels, where cos is 1 and
    sin 0: one full-width formula, no slicing of head channels. ``exact``: a HiFi4 compute
    config (the default HiFi2 drops x's lowest mantissa bit in ``x @ rot``)."""
    return ops.add(ops.mul(x, cos), ops.mul(ops.matmul(x, rot, exact), sin))


def l2norm(ops: Ops, x: Tensor, eps: float = 1e-6) -> Tensor:
    """x · rsqrt(Σx² + eps) over the last dim (decode path; the chunked op normalises itself)."""
    return ops.mul(x, ops.rsqrt(ops.add(ops.sum(ops.mul(x, x), -1), eps)))


def swiglu(
    ops: Ops, x: Tensor, gate: Tensor, up: Tensor, down: Tensor, compute: Any = None
) -> Tensor:
    hidden = ops.mul(ops.silu(ops.linear(x, gate, compute)), ops.linear(x, up, compute))
    return ops.linear(hidden, down, compute)


def whole(t: Tensor) -> Tensor:
    """A projection already whole on its chip (no row pieces to gather: one mesh row)."""
    return t
