"""Small numeric building blocks shared by the reference layers (formulas match HF exactly)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5 RMSNorm: ``x * rsqrt(mean(x²) + eps) * (1 + w)``, computed in fp32."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).to(x.dtype)


def rms_norm_gated(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """GDN output norm: ``w * norm(x) * silu(z)`` over the last dim (one v-head)."""
    dtype = x.dtype
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return ((weight * normed) * F.silu(gate.float())).to(dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return (1.0 / (theta**exponents)).to(device)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, rotary_dim] for integer positions [T] (rotate-half layout)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` channels of x [T, heads, head_dim]; pass the rest."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    half = rd // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((rot * c + rotated * s, rest), dim=-1)


def swiglu(
    x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_w: torch.Tensor
) -> torch.Tensor:
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)
