"""Context-sensitive random weights (the demo checkpoint's and the golden tier's): with a flat
init the output hardly depends on distant tokens, so prefix-cache or state bugs would change no
greedy token."""

from __future__ import annotations

import math

import torch


def init_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Context-sensitive init: with HF's default init the output hardly depends on distant
    tokens, so prefix-cache bugs would not change any greedy token."""
    if name == "model.embed_tokens.weight":
        # Tied embeddings at N(0, 1) make each token's own embedding dominate the logits and
        # greedy decoding repeats one token; N(0, 0.2) keeps the output varied.
        return torch.randn(shape, generator=gen) * 0.2
    if name == "lm_head.weight":
        return torch.randn(shape, generator=gen) * 0.2
    if name.endswith("conv1d.weight"):
        return torch.randn(shape, generator=gen) * 0.3
    if name.endswith("A_log"):
        return torch.log(torch.rand(shape, generator=gen) * 0.99 + 0.01)
    if name.endswith("dt_bias"):
        return torch.randn(shape, generator=gen) * 0.5 - 2.0
    if name.endswith("linear_attn.norm.weight"):
        # RMSNormGated multiplies by w directly (HF starts it at 1); the other norms use (1 + w).
        return 1.0 + torch.randn(shape, generator=gen) * 0.1
    if name.endswith("norm.weight"):
        return torch.randn(shape, generator=gen) * 0.1
    return torch.randn(shape, generator=gen) * (1.0 / math.sqrt(shape[-1]))
