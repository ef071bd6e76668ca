"""Tiny random Qwen3.5 / Qwen3.5-MoE / Qwen3-Next checkpoints for tests, written at test time.

Every builder creates the HF model from a config dict and a seed, applies the
*context-sensitive* init (HF's default init makes late tokens nearly independent of early ones,
so prefix-state bugs would not change any greedy token), and saves it with ``save_pretrained``.
No weights are committed; building one takes well under a second.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_GDN_DIMS: dict[str, Any] = {
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
}


def _layer_types(layers: int) -> list[str]:
    # 3 GDN layers then 1 full-attention layer, repeated (the release pattern).
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]


def _base_config(*, vocab: int, layers: int, hidden: int, tied: bool) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": tied,
        "layer_types": _layer_types(layers),
        "bos_token_id": 1,
        "eos_token_id": 2,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        **_GDN_DIMS,
    }


@torch.no_grad()
def context_sensitive_init(model: torch.nn.Module, *, seed: int, hidden: int, tied: bool) -> None:
    """Re-initialise every parameter so outputs depend strongly on distant context."""
    gen = torch.Generator().manual_seed(seed)

    def normal(p: torch.Tensor, mean: float, std: float) -> None:
        p.copy_(torch.randn(p.shape, generator=gen) * std + mean)

    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("embed_tokens.weight"):
            normal(p, 0.0, 0.2 if tied else 1.0)
        elif name == "lm_head.weight":
            normal(p, 0.0, 0.2)
        elif name.endswith("conv1d.weight"):
            normal(p, 0.0, 0.3)
        elif name.endswith("norm.weight"):
            normal(p, 0.0, 0.1)
        elif name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(0.01, 1.0, generator=gen).log())
        elif name.endswith("dt_bias"):
            normal(p, -2.0, 0.5)
        else:
            normal(p, 0.0, hidden**-0.5)


def _save(model: torch.nn.Module, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)  # type: ignore[operator]
    return path


def make_dense(
    path: Path,
    *,
    seed: int = 0,
    vocab: int = 4096,
    layers: int = 4,
    hidden: int = 256,
    intermediate: int = 512,
    tied: bool = False,
) -> Path:
    """A dense ``qwen3_5_text`` checkpoint (Qwen3_5ForCausalLM)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(
        **_base_config(vocab=vocab, layers=layers, hidden=hidden, tied=tied),
        intermediate_size=intermediate,
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    context_sensitive_init(model, seed=seed, hidden=hidden, tied=tied)
    if tied:
        model.tie_weights()
    return _save(model, Path(path))


def make_moe(
    path: Path,
    *,
    seed: int = 0,
    vocab: int = 4096,
    layers: int = 4,
    hidden: int = 256,
    tied: bool = False,
) -> Path:
    """A ``qwen3_5_moe_text`` checkpoint: 8 experts, top-2, plus a gated shared expert."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(
        **_base_config(vocab=vocab, layers=layers, hidden=hidden, tied=tied),
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
    )
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(cfg).eval()
    context_sensitive_init(model, seed=seed, hidden=hidden, tied=tied)
    return _save(model, Path(path))


def make_next(
    path: Path,
    *,
    seed: int = 0,
    vocab: int = 4096,
    layers: int = 4,
    hidden: int = 256,
    norm_topk_prob: bool = True,
) -> Path:
    """A ``qwen3_next`` checkpoint: fused in_proj_qkvz/ba, MoE except on ``mlp_only_layers``."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    base = _base_config(vocab=vocab, layers=layers, hidden=hidden, tied=False)
    del base["layer_types"]
    cfg = Qwen3NextConfig(
        **base,
        full_attention_interval=4,
        intermediate_size=384,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        norm_topk_prob=norm_topk_prob,
    )
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(cfg).eval()
    context_sensitive_init(model, seed=seed, hidden=hidden, tied=False)
    return _save(model, Path(path))


def make_release_layout(src: Path, dst: Path, *, seed: int = 0) -> Path:
    """Rewrite a flat ``qwen3_5[_moe]_text`` checkpoint the way release checkpoints look.

    Top-level ``qwen3_5``/``qwen3_5_moe`` config with ``text_config``, weights under
    ``model.language_model.*``, extra ``mtp.*`` and ``model.visual.*`` keys, fused MoE experts,
    and the weights split over two shards with ``model.safetensors.index.json``.
    """
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    text_cfg = json.loads((src / "config.json").read_text())
    moe = text_cfg["model_type"] == "qwen3_5_moe_text"
    top = {
        "architectures": [
            "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
        ],
        "model_type": "qwen3_5_moe" if moe else "qwen3_5",
        "tie_word_embeddings": text_cfg.get("tie_word_embeddings", False),
        "text_config": text_cfg,
    }
    (dst / "config.json").write_text(json.dumps(top, indent=2))
    gen_cfg = src / "generation_config.json"
    if gen_cfg.exists():
        (dst / "generation_config.json").write_text(gen_cfg.read_text())

    flat = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in flat.items():
        new = (
            name.replace("model.", "model.language_model.", 1)
            if name.startswith("model.")
            else name
        )
        if ".mlp.experts." in new and new.split(".mlp.experts.")[1][0].isdigit():
            prefix, rest = new.split(".mlp.experts.")
            idx, proj = rest.split(".")[:2]
            experts.setdefault(prefix, {}).setdefault(int(idx), {})[proj] = t
            continue
        out[new] = t
    for prefix, per in experts.items():
        ids = sorted(per)
        gate_up = [torch.cat([per[e]["gate_proj"], per[e]["up_proj"]], dim=0) for e in ids]
        out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        out[f"{prefix}.mlp.experts.down_proj"] = torch.stack([per[e]["down_proj"] for e in ids])
    gen = torch.Generator().manual_seed(seed)
    out["mtp.fc.weight"] = torch.randn(8, 8, generator=gen)
    out["mtp.layers.0.input_layernorm.weight"] = torch.randn(8, generator=gen)
    out["model.visual.patch_embed.proj.weight"] = torch.randn(4, 4, generator=gen)

    names = sorted(out)
    shards = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: out[n].contiguous() for n in shard}, str(dst / fname))
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {}, "weight_map": weight_map}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return dst


def load_hf(path: Path) -> Any:
    """The HF reference model for a checkpoint folder, fp32, eval mode, eager attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    ).eval()


def greedy_hf(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """HF ``generate`` greedy continuation (new tokens only)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def prefill_hf(model: Any, prompt: list[int], splits: list[int]) -> torch.Tensor:
    """HF logits [T, vocab] at every position, prefilled in chunks cut at ``splits``: each chunk
    resumes from the cache the previous one left (GDN conv/recurrent state and KV)."""
    from transformers import DynamicCache

    ids = torch.tensor([prompt])
    cache = DynamicCache(config=model.config)
    cuts = [0, *splits, len(prompt)]
    with torch.no_grad():
        parts = [
            model(ids[:, a:b], cache=cache, use_cache=True).logits[0].float()
            for a, b in itertools.pairwise(cuts)
        ]
    return torch.cat(parts)


def assert_varied_greedy(model: Any, prompt: list[int], *, n: int = 40, distinct: int = 10) -> None:
    """Fail unless greedy decoding gives ``distinct`` different tokens in ``n``."""
    toks = greedy_hf(model, prompt, n)
    assert len(set(toks)) >= distinct, f"degenerate test model: {toks}"


# The per-layer dimensions a real-dims checkpoint takes from the published Qwen3.5-9B config.
REAL_LAYER_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_parameters",
)


def make_real_dims(
    path: Path,
    *,
    seed: int = 0,
    vocab: int | None = None,
    intermediate: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """A 2-layer ``qwen3_5_text`` checkpoint at Qwen3.5-9B layer dimensions (from
    ``tt_serve.model.published``): one GDN layer (16 key / 32 value heads of 128, conv kernel 4)
    then one gated full-attention layer (16 q / 4 kv heads of 256), hidden 4096,
    context-sensitive init. ``vocab`` and ``intermediate`` default to the 9B's (248320, 12288);
    tests on CPU shrink them (no device rule looks at either). Saved in ``dtype`` (bf16: what
    release checkpoints ship, half the bytes of fp32 at a 248k vocabulary)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from tt_serve.model.published import published_config

    real = published_config("qwen3.5-9b")["text_config"]
    hidden = real["hidden_size"]
    base = _base_config(vocab=vocab or real["vocab_size"], layers=2, hidden=hidden, tied=False)
    base.update({k: real[k] for k in REAL_LAYER_KEYS})
    base["layer_types"] = ["linear_attention", "full_attention"]
    cfg = Qwen3_5TextConfig(**base, intermediate_size=intermediate or real["intermediate_size"])
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).eval()
    context_sensitive_init(model, seed=seed, hidden=hidden, tied=False)
    return _save(model.to(dtype), Path(path))
