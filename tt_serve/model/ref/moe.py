"""Sparse MoE block: softmax router, top-k (optionally renormalised), plus a gated shared expert."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tt_serve.model.ref.layers import Linear, swiglu


@dataclass(frozen=True)
class MoeWeights:
    router: torch.Tensor  # [E, H]
    gate_up: torch.Tensor  # [E, 2I, H]
    down: torch.Tensor  # [E, H, I]
    shared_gate_up: Linear  # [2·Is, H]: the shared expert's gate and up, fused
    shared_down: Linear  # [H, Is]
    shared_expert_gate: torch.Tensor  # [1, H]
    top_k: int
    norm_topk_prob: bool


def moe_forward(x: torch.Tensor, w: MoeWeights) -> torch.Tensor:
    """x [T, H] -> [T, H]. Loops over the experts actually hit (tokens are gathered per expert)."""
    logits = F.linear(x, w.router)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    top_w, top_i = torch.topk(probs, w.top_k, dim=-1)
    if w.norm_topk_prob:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    top_w = top_w.to(x.dtype)

    out = torch.zeros_like(x)
    inter = w.gate_up.shape[1] // 2
    # One host sync for the list of experts hit; the per-expert work then runs on the device.
    for e in torch.unique(top_i).tolist():
        tok, slot = torch.where(top_i == e)
        xe = x[tok]
        gu = F.linear(xe, w.gate_up[e])
        he = F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], w.down[e])
        out.index_add_(0, tok, he * top_w[tok, slot, None])
    shared = swiglu(x, w.shared_gate_up, w.shared_down)
    return out + torch.sigmoid(F.linear(x, w.shared_expert_gate)) * shared
