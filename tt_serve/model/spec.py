"""ModelSpec: everything the backends and the engine need to know about a checkpoint's shape.

Built from a Hugging Face ``config.json`` for the hybrid Qwen family: ``qwen3_5`` /
``qwen3_5_text`` (dense), ``qwen3_5_moe`` / ``qwen3_5_moe_text`` (MoE; Qwen3.6 uses these too)
and ``qwen3_next``. The dataclass is frozen and does no I/O; ``ModelSpec.from_hf_dir`` reads the
folder and ``ModelSpec.from_config`` parses an already-loaded config dict.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


class UnsupportedModelError(ValueError):
    """The config names a model type or feature this project does not implement."""


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one hybrid GDN + gated-attention checkpoint (text part only)."""

    model_type: str  # as written at the top of config.json
    family: str  # "qwen3_5" | "qwen3_5_moe" | "qwen3_next"
    vocab_size: int
    hidden_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    # gated full attention
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    # Gated DeltaNet
    conv_kernel: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    # MLP / MoE (intermediate_size is 0 when no layer is dense)
    intermediate_size: int
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    model_id: str = ""  # identity of the checkpoint, usable as a cache salt

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def gdn_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.gdn_key_dim + self.gdn_value_dim

    @property
    def conv_state_len(self) -> int:
        # The causal conv needs only the previous K-1 inputs.
        return self.conv_kernel - 1

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)

    @property
    def num_attention_layers(self) -> int:
        return len(self.attention_layers)

    @property
    def num_gdn_layers(self) -> int:
        return len(self.gdn_layers)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` has a sparse MoE block (else a dense MLP)."""
        if self.num_experts <= 0 or layer in self.mlp_only_layers:
            return False
        return (layer + 1) % self.decoder_sparse_step == 0

    def kv_bytes_per_block(self, block_size: int, dtype_bytes: int) -> int:
        """Bytes of K and V for one paged block over all attention layers."""
        per_layer = 2 * self.num_kv_heads * block_size * self.head_dim * dtype_bytes
        return per_layer * self.num_attention_layers

    def resume_unit_bytes(self, tokens: int, block_size: int, dtype_bytes: int) -> int:
        """Bytes of one resume-point unit at ``tokens`` in the host and disk tiers
        (``cache/host_tier.py``): one GDN snapshot plus the KV of every block of [0, tokens).
        A conversation's later units share its earlier blocks, so an agent of context T costs
        about one unit at T: a tier of B bytes holds about B // this many such agents."""
        blocks = tokens // block_size
        return self.state_bytes_per_slot() + blocks * self.kv_bytes_per_block(
            block_size, dtype_bytes
        )

    def state_bytes_per_slot(self) -> int:
        """Bytes of one GDN state slot (conv + recurrent, fp32) over all GDN layers."""
        conv = self.conv_dim * self.conv_state_len
        rec = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        return 4 * (conv + rec) * self.num_gdn_layers

    # ---- construction ---------------------------------------------------------------------
    @staticmethod
    def from_hf_dir(path: str | Path) -> ModelSpec:
        """Read ``config.json`` (+ ``generation_config.json``) of a checkpoint folder."""
        root = Path(path)
        cfg_bytes = (root / "config.json").read_bytes()
        config = json.loads(cfg_bytes)
        gen_path = root / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
        digest = hashlib.sha256(cfg_bytes)
        for f in sorted(root.glob("*.safetensors")):
            digest.update(f"{f.name}:{f.stat().st_size};".encode())
        return ModelSpec.from_config(
            config, generation_config=gen, model_id=digest.hexdigest()[:16]
        )

    @staticmethod
    def from_config(
        config: dict[str, Any],
        *,
        generation_config: dict[str, Any] | None = None,
        model_id: str = "",
    ) -> ModelSpec:
        """Parse a config dict (nested ``text_config`` allowed)."""
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        text = dict(config.get("text_config") or config)
        family = "qwen3_next" if model_type == "qwen3_next" else model_type.removesuffix("_text")
        act = text.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"unsupported hidden_act {act!r} (only 'silu')")

        n_layers = int(text["num_hidden_layers"])
        layer_types = _layer_types(text, n_layers)
        theta, partial = _rope(text)
        moe = family in ("qwen3_5_moe", "qwen3_next") and int(text.get("num_experts", 0)) > 0
        tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
        return ModelSpec(
            model_type=model_type,
            family=family,
            vocab_size=int(text["vocab_size"]),
            hidden_size=int(text["hidden_size"]),
            num_layers=n_layers,
            layer_types=layer_types,
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=tied,
            max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
            eos_token_ids=_eos_ids(config, text, generation_config or {}),
            num_attention_heads=int(text["num_attention_heads"]),
            num_kv_heads=int(text["num_key_value_heads"]),
            head_dim=int(
                text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
            ),
            rope_theta=theta,
            partial_rotary_factor=partial,
            conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
            linear_num_key_heads=int(text.get("linear_num_key_heads", 16)),
            linear_num_value_heads=int(text.get("linear_num_value_heads", 32)),
            linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
            intermediate_size=int(text.get("intermediate_size") or 0),
            num_experts=int(text.get("num_experts", 0)) if moe else 0,
            num_experts_per_tok=int(text.get("num_experts_per_tok", 0)) if moe else 0,
            moe_intermediate_size=int(text.get("moe_intermediate_size", 0)) if moe else 0,
            shared_expert_intermediate_size=(
                int(text.get("shared_expert_intermediate_size", 0)) if moe else 0
            ),
            # Qwen3.5-MoE always renormalises the top-k weights; Qwen3-Next makes it optional.
            norm_topk_prob=bool(text.get("norm_topk_prob", True))
            if family == "qwen3_next"
            else True,
            decoder_sparse_step=int(text.get("decoder_sparse_step", 1))
            if family == "qwen3_next"
            else 1,
            mlp_only_layers=tuple(int(i) for i in text.get("mlp_only_layers") or ())
            if family == "qwen3_next"
            else (),
            model_id=model_id,
        )


def _layer_types(text: dict[str, Any], n_layers: int) -> tuple[str, ...]:
    types = text.get("layer_types")
    if types is None:
        interval = int(text.get("full_attention_interval", 4))
        types = [
            FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n_layers)
        ]
    if len(types) != n_layers:
        raise ValueError(f"layer_types has {len(types)} entries, num_hidden_layers is {n_layers}")
    bad = sorted({t for t in types if t not in (LINEAR_ATTENTION, FULL_ATTENTION)})
    if bad:
        raise UnsupportedModelError(f"unsupported layer types {bad}")
    return tuple(types)


def _rope(text: dict[str, Any]) -> tuple[float, float]:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    # Text-only multimodal RoPE (mrope) gives exactly the plain partial RoPE.
    if rope_type not in ("default", "mrope"):
        raise UnsupportedModelError(f"unsupported rope_type {rope_type!r}")
    theta = float(params.get("rope_theta", text.get("rope_theta", 10000.0)))
    partial = float(params.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0)))
    return theta, partial


def _eos_ids(config: dict[str, Any], text: dict[str, Any], gen: dict[str, Any]) -> tuple[int, ...]:
    out: list[int] = []
    for src in (config.get("eos_token_id"), text.get("eos_token_id"), gen.get("eos_token_id")):
        for tok in src if isinstance(src, list) else [src]:
            if isinstance(tok, int) and tok not in out:
                out.append(tok)
    return tuple(out)
