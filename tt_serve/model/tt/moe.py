"""Sparse MoE block on the device (mirrors ``ref/moe.py``).

Routing stays on the device: softmax, ``topk``, and a dense [N, E] weight that is the routed
probability on each token's top-k experts and 0 elsewhere (optionally renormalised). Every
expert then runs on every token and is weighted by its column: exact and trace-friendly (no
data-dependent shapes), at the cost of computing unused experts — fine for small expert counts;
large MoE checkpoints want a sparse dispatch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tt_serve.model.tt.layers import swiglu
from tt_serve.model.tt.ops import Ops, Tensor


@dataclass(frozen=True)
class MoeWeights:
    router: Tensor  # [H, E]
    experts: tuple[tuple[Tensor, Tensor, Tensor], ...]  # (gate, up, down) per expert
    shared: tuple[Tensor, Tensor, Tensor]
    shared_gate: Tensor  # [H, 1]
    top_k: int
    norm_topk_prob: bool
    compute: Any = None  # expert matmuls (fidelity of the experts' dtype)
    shared_compute: Any = None  # shared expert (the MLP dtype)
    exact: Any = None  # router and shared gate (bf16 weights)


def moe_forward(ops: Ops, x: Tensor, w: MoeWeights) -> Tensor:
    """x [1, N, H] -> [1, N, H]."""
    n = x.shape[1]
    probs = ops.softmax(ops.typecast(ops.linear(x, w.router, w.exact), "float32"))  # [1, N, E]
    top_v, _ = ops.topk(probs, w.top_k)
    kth = ops.slice(top_v, [0, 0, w.top_k - 1], [1, n, w.top_k])
    routed = ops.mul(probs, ops.ge(probs, kth))
    if w.norm_topk_prob:
        routed = ops.mul(routed, ops.reciprocal(ops.sum(top_v, -1)))
    routed = ops.typecast(routed, "bfloat16")
    out = None
    for e, (gate, up, down) in enumerate(w.experts):
        weight = ops.slice(routed, [0, 0, e], [1, n, e + 1])
        y = ops.mul(swiglu(ops, x, gate, up, down, w.compute), weight)
        out = y if out is None else ops.add(out, y)
    shared = swiglu(ops, x, *w.shared, w.shared_compute)
    shared = ops.mul(shared, ops.sigmoid(ops.linear(x, w.shared_gate, w.exact)))
    assert out is not None
    return ops.add(out, shared)
