"""Sparse MoE block on the device (mirrors ``ref/moe.py``): dense over the experts, batched.

Routing stays on the device: softmax, ``topk``, and a dense [N, E] weight that is the routed
probability on each token's top-k experts and 0 elsewhere (optionally renormalised). Every
expert then runs on every token and is weighted by its column: exact and trace-friendly (no
data-dependent shapes), at the cost of computing the unrouted experts. This is the dense path;
a sparse top-k dispatch (gathering each expert's tokens) is a later issue.

The experts run as a few batched ops per layer, whatever the expert count, in a transposed
orientation (tokens in the last dim) so that the weights need no broadcast copy of x:

* ``xT = x^T`` [1, 1, H, N] and ``rT`` = the routing weights as [1, E, 1, N];
* per group of G experts (:func:`expert_groups`), gate and up ``W [1, G, I, H] @ xT`` ->
  [1, G, I, N]: ttnn's batch-broadcast matmul (B's batch is 1, "BCMK*11KN=BCMN",
  ``limits.matmul``); ``h = silu(gate) * up * rT`` (row broadcast over I);
* down ``D [1, 1, H, G·I] @ h [1, 1, G·I, N]`` -> [1, 1, H, N], where D holds the experts'
  down projections side by side and ``h`` is the [1, G, I, N] tensor viewed as [G·I, N]: the
  sum over the experts happens in the matmul's K accumulation (unrouted experts add exact
  zeros), so no [E, N, H] intermediate exists;
* the groups' outputs are added, transposed back to [1, N, H].

Groups bound the activations: one group's [G·I, N] tensor is EXPERT_GROUP_ROWS rows, so a
256-token prefill chunk holds 16 MiB per tensor (Qwen3.6-35B-A3B: 4 groups of 64 experts).
Ops per layer: ~15 for routing, transposes and shared expert, ~9 per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tt_serve.model.tt.layers import swiglu
from tt_serve.model.tt.ops import Ops, Tensor

# Rows (experts x intermediate) of one group's matmuls: bounds each expert activation to
# 64 KiB per token in bf16 (2 MiB at a 32-row decode, 16 MiB at a 256-token prefill chunk).
EXPERT_GROUP_ROWS = 32768


def expert_groups(num_experts: int, intermediate: int) -> list[tuple[int, int]]:
    """[first, end) expert ranges of the stacked-weight groups: as many whole experts as fit
    in EXPERT_GROUP_ROWS rows (at least one), the last group possibly smaller."""
    size = max(1, EXPERT_GROUP_ROWS // max(intermediate, 1))
    return [(a, min(num_experts, a + size)) for a in range(0, num_experts, size)]


@dataclass(frozen=True)
class ExpertGroup:
    """Stacked weights of experts [first, first + count)."""

    gate: Tensor  # [1, G, I, H] (the checkpoint's [out, in] orientation: the matmul's A)
    up: Tensor  # [1, G, I, H]
    down: Tensor  # [1, 1, H, G·I]: column block g is expert g's down projection [H, I]
    first: int

    @property
    def count(self) -> int:
        return int(self.gate.shape[1])


@dataclass(frozen=True)
class MoeWeights:
    router: Tensor  # [H, E]
    experts: tuple[ExpertGroup, ...]
    shared: tuple[Tensor, Tensor, Tensor]
    shared_gate: Tensor  # [H, 1]
    top_k: int
    norm_topk_prob: bool
    compute: Any = None  # expert matmuls (fidelity of the experts' dtype)
    shared_compute: Any = None  # shared expert (the MLP dtype)
    exact: Any = None  # router and shared gate (bf16 weights)


def _routing(ops: Ops, x: Tensor, w: MoeWeights) -> Tensor:
    """x [1, N, H] -> the routing weights [1, N, E] (0 off each token's top-k), bf16."""
    n = x.shape[1]
    probs = ops.softmax(ops.typecast(ops.linear(x, w.router, w.exact), "float32"))  # [1, N, E]
    top_v, _ = ops.topk(probs, w.top_k)
    kth = ops.slice(top_v, [0, 0, w.top_k - 1], [1, n, w.top_k])
    routed = ops.mul(probs, ops.ge(probs, kth))
    if w.norm_topk_prob:
        routed = ops.mul(routed, ops.reciprocal(ops.sum(top_v, -1)))
    return ops.typecast(routed, "bfloat16")


def moe_forward(ops: Ops, x: Tensor, w: MoeWeights) -> Tensor:
    """x [1, N, H] -> [1, N, H]."""
    n, hidden = x.shape[1], x.shape[2]
    routed = _routing(ops, x, w)
    num_experts = routed.shape[2]
    r_t = ops.permute(ops.reshape(routed, [1, 1, n, num_experts]), [0, 3, 1, 2])  # [1, E, 1, N]
    x_t = ops.permute(ops.reshape(x, [1, 1, n, hidden]), [0, 1, 3, 2])  # [1, 1, H, N]
    out = None
    for g in w.experts:
        r = r_t
        if len(w.experts) > 1:
            r = ops.slice(r_t, [0, g.first, 0, 0], [1, g.first + g.count, 1, n])
        gate = ops.matmul(g.gate, x_t, w.compute, dtype="bfloat16")  # [1, G, I, N]
        up = ops.matmul(g.up, x_t, w.compute, dtype="bfloat16")
        h = ops.mul(ops.mul(ops.silu(gate), up), r)
        h = ops.reshape(h, [1, 1, g.count * h.shape[2], n])  # a view: I is tile-aligned
        y = ops.matmul(g.down, h, w.compute, dtype="bfloat16")  # [1, 1, H, N]
        out = y if out is None else ops.add(out, y)
    assert out is not None
    routed_out = ops.reshape(ops.permute(out, [0, 1, 3, 2]), [1, n, hidden])
    shared = swiglu(ops, x, *w.shared, w.shared_compute)
    shared = ops.mul(shared, ops.sigmoid(ops.linear(x, w.shared_gate, w.exact)))
    return ops.add(routed_out, shared)
