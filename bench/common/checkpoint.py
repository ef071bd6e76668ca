"""A random-weight checkpoint at a published model's layer shapes, as the benches that run one
write it (``bench.precision.cost``, ``bench.kernels.cpu_decode``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tt_serve.demo import _init_tensor, demo_tensor_shapes
from tt_serve.model.published import published_config


def write_checkpoint(out: Path, shape: str, layers: int, vocab: int, seed: int) -> Path:
    """``shape``'s first ``layers`` layers (3 GDN : 1 attention), ``vocab`` rows of embedding /
    head, context-sensitive init (``tt_serve.demo``), bf16 safetensors, flat text config."""
    text = dict(published_config(shape)["text_config"])
    text |= {
        "num_hidden_layers": layers,
        "layer_types": text["layer_types"][:layers],
        "vocab_size": vocab,
        "architectures": ["Qwen3_5ForCausalLM"],
        "eos_token_id": 248046,
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: _init_tensor(name, shp, gen).to(torch.bfloat16).contiguous()
        for name, shp in demo_tensor_shapes(text).items()
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(text))
    return out
