"""The published Qwen3.5-9B config.json (numbers from shared/design/notes/qwen-configs.md), for
real-size runs on the shape-only device model: no weights, only the config."""

from __future__ import annotations

import json
from pathlib import Path

LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 8  # 24 GDN + 8 full


def write_qwen35_9b_config(folder: Path) -> Path:
    text = {
        "model_type": "qwen3_5_text",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "vocab_size": 248320,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "intermediate_size": 12288,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "layer_types": LAYER_TYPES,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "hidden_act": "silu",
        "attn_output_gate": True,
        "tie_word_embeddings": False,
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
    config = {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "tie_word_embeddings": False,
        "text_config": text,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
