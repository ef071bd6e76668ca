"""The published Qwen3.5 / Qwen3.6 sizes as ``config.json`` dicts, for planning without weights.

``tt-serve plan --model qwen3.5-9b`` plans a released model before anything is downloaded: the
config is rebuilt here from the few numbers that differ between sizes (hidden size, layers,
heads, GDN value heads, the MLP or MoE block, tied embeddings); everything else is shared by the
whole family. The numbers are the released configs' (tt-metal's ``model_params/Qwen3.5-9B`` and
``Qwen3.5-27B`` copies, the HF model cards, and training frameworks' registries), collected with
their sources in the design notes; 2B's tied embeddings and MTP count come from one registry
only. Qwen3.6-27B and Qwen3.6-35B-A3B reuse the Qwen3.5 architecture and model types.

Only ``ModelSpec.from_config`` reads these dicts; they are the release layout (outer
``qwen3_5`` / ``qwen3_5_moe`` with a ``text_config``), so the same parser handles both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Size:
    """What distinguishes one released size; ``experts`` 0 means a dense MLP of ``inter``."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    v_heads: int
    inter: int = 0
    experts: int = 0
    top_k: int = 0
    expert_inter: int = 0
    tied: bool = False


SIZES: dict[str, Size] = {
    "qwen3.5-0.8b": Size(1024, 24, 8, 2, 16, inter=3584, tied=True),
    "qwen3.5-2b": Size(2048, 24, 8, 2, 16, inter=6144, tied=True),
    "qwen3.5-4b": Size(2560, 32, 16, 4, 32, inter=9216, tied=True),
    "qwen3.5-9b": Size(4096, 32, 16, 4, 32, inter=12288),
    "qwen3.5-27b": Size(5120, 64, 24, 4, 48, inter=17408),
    "qwen3.5-35b-a3b": Size(2048, 40, 16, 2, 32, experts=256, top_k=8, expert_inter=512),
    "qwen3.5-122b-a10b": Size(3072, 48, 32, 2, 64, experts=256, top_k=8, expert_inter=1024),
    "qwen3.5-397b-a17b": Size(4096, 60, 32, 2, 64, experts=512, top_k=10, expert_inter=1024),
    "qwen3.6-27b": Size(5120, 64, 24, 4, 48, inter=17408),
    "qwen3.6-35b-a3b": Size(2048, 40, 16, 2, 32, experts=256, top_k=8, expert_inter=512),
}

# Shared by every size: head_dim 256, GDN 16 key heads of 128 (values 128 wide), conv kernel 4,
# one full-attention layer in four, vocab 248320, 262144 positions, partial RoPE (0.25) at 1e7.
FULL_ATTENTION_INTERVAL = 4


def published_config(name: str) -> dict[str, Any]:
    """The release ``config.json`` of ``name`` (case-insensitive, e.g. ``Qwen3.5-9B``)."""
    size = SIZES.get(name.strip().lower())
    if size is None:
        raise ValueError(f"unknown published model {name!r}; known: {', '.join(SIZES)}")
    moe = size.experts > 0
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * (
        size.layers // FULL_ATTENTION_INTERVAL
    )
    text: dict[str, Any] = {
        "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "hidden_size": size.hidden,
        "num_hidden_layers": size.layers,
        "vocab_size": 248320,
        "num_attention_heads": size.heads,
        "num_key_value_heads": size.kv_heads,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": size.v_heads,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "layer_types": layer_types,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "hidden_act": "silu",
        "attn_output_gate": True,
        "tie_word_embeddings": size.tied,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "mtp_num_hidden_layers": 1,
        "mamba_ssm_dtype": "float32",
    }
    if moe:
        text |= {
            "num_experts": size.experts,
            "num_experts_per_tok": size.top_k,
            "moe_intermediate_size": size.expert_inter,
            "shared_expert_intermediate_size": size.expert_inter,
            "mlp_only_layers": [],
            "router_aux_loss_coef": 0.001,
        }
    else:
        text["intermediate_size"] = size.inter
    return {
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "architectures": [
            "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
        ],
        "tie_word_embeddings": size.tied,
        "text_config": text,
    }


def write_published_config(name: str, folder: Path) -> Path:
    """A folder holding only ``config.json`` of ``name`` (what ``tt-serve plan`` accepts)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(published_config(name), indent=1))
    return folder
