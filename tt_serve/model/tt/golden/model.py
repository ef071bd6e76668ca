"""The models the golden tier runs: a published size cut to a few layers (and, for the checks
that must stay fast, a smaller vocabulary or fewer experts), with context-sensitive random
weights (``context_init.init_tensor``: with a flat init a wrong state changes no greedy token)."""

from __future__ import annotations

from typing import Any

import torch

from tt_serve.model.context_init import init_tensor
from tt_serve.model.published import published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.weights import _canonicalise, expected_shapes


def cut_spec(
    name: str,
    *,
    layers: int,
    vocab: int | None = None,
    experts: int | None = None,
    dims: dict[str, Any] | None = None,
) -> ModelSpec:
    """``name``'s release config with its first ``layers`` layers (the published pattern: three
    GDN layers then one full-attention layer), every head count, head dim, hidden and
    intermediate size kept; ``vocab`` / ``experts`` shrink the LM head and the expert count
    (no per-layer shape depends on either; top-k stays the published one when it fits);
    ``dims`` overrides text-config keys (the tests' tiny model)."""
    cfg = published_config(name)
    text: dict[str, Any] = cfg["text_config"]
    text["num_hidden_layers"] = layers
    text["layer_types"] = text["layer_types"][:layers]
    text.update(dims or {})
    if vocab is not None:
        text["vocab_size"] = vocab
    if experts is not None and "num_experts" in text:
        text["num_experts"] = experts
        text["num_experts_per_tok"] = min(text["num_experts_per_tok"], experts)
    return ModelSpec.from_config(cfg, model_id=f"{name}[:{layers}]")


def draw_weights(spec: ModelSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """Canonical fp32 weights of ``spec`` (the names ``load_weights`` gives), drawn with the
    demo checkpoint's context-sensitive init."""
    gen = torch.Generator().manual_seed(seed)
    raw = {}
    for name, shape in expected_shapes(spec, set()).items():
        full = name if name == "lm_head.weight" else f"model.{name}"
        raw[name] = init_tensor(full, shape, gen).float()
    # The LM head (the embedding when tied) is drawn at N(0, 0.2): logits of std
    # 0.2·sqrt(hidden), 3 at the demo's hidden 256 but 6-9 at published widths, where greedy
    # decoding repeats one token and "greedy tokens equal" says little. Rescaled to logit std 3.
    head = "embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
    raw[head] = raw[head] * (3.0 / (0.2 * spec.hidden_size**0.5))
    return _canonicalise(raw, spec)
