"""Safetensors loading and name mapping onto one canonical layout.

Accepts a single ``model.safetensors`` or shards listed in ``model.safetensors.index.json``;
weights under ``model.`` or ``model.language_model.`` (release checkpoints); per-expert
(``mlp.experts.{e}.{gate,up,down}_proj.weight``) or fused (``mlp.experts.gate_up_proj``
[E, 2I, H] + ``mlp.experts.down_proj`` [E, H, I]) MoE experts; and Qwen3-Next's fused
``in_proj_qkvz`` / ``in_proj_ba``, de-interleaved here so one GDN implementation serves all.
``mtp.*`` and ``model.visual.*`` tensors are ignored. Anything missing, unexpected or of the
wrong shape is an error naming the tensor.

Canonical names (no ``model.`` prefix): ``embed_tokens.weight``, ``norm.weight``,
``lm_head.weight`` (the embedding itself when tied), and per layer ``layers.{i}.`` +
``input_layernorm.weight``, ``post_attention_layernorm.weight``, ``linear_attn.{in_proj_qkv,
in_proj_z, in_proj_b, in_proj_a, out_proj, norm}.weight``, ``linear_attn.conv1d.weight`` [C, K],
``linear_attn.{A_log, dt_bias}``, ``self_attn.{q,k,v,o}_proj.weight``,
``self_attn.{q,k}_norm.weight``, ``mlp.{gate,up,down}_proj.weight`` (dense),
``mlp.gate.weight``, ``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``,
``mlp.shared_expert.{gate,up,down}_proj.weight``, ``mlp.shared_expert_gate.weight`` (MoE).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tt_serve.model.spec import FULL_ATTENTION, ModelSpec

if TYPE_CHECKING:  # torch only where tensors are loaded: the ttnn host venv reads shapes
    import torch

IGNORED_PREFIXES = ("mtp.", "model.visual.", "visual.")
_PREFIXES = ("model.language_model.", "model.")


class CheckpointError(ValueError):
    """A checkpoint does not match its config (missing, unexpected or misshaped tensors)."""


def _tensor_files(root: Path) -> dict[str, Path]:
    """Checkpoint tensor name -> file holding it."""
    from safetensors import safe_open

    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return {name: root / fname for name, fname in weight_map.items()}
    single = root / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {root}")
    with safe_open(str(single), "pt") as f:
        return dict.fromkeys(f.keys(), single)


def checkpoint_files(path: str | Path) -> list[Path]:
    """The files a checkpoint folder's tensors are read from, sorted, with the shard index when
    there is one: what a converted-weight cache keys the checkpoint's content on."""
    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return sorted({index, *(root / f for f in weight_map.values())})
    single = root / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {root}")
    return [single]


def _strip(name: str) -> str | None:
    """Checkpoint name -> name relative to the text model, or None when ignored."""
    if name.startswith(IGNORED_PREFIXES):
        return None
    if name == "lm_head.weight":
        return name
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name  # not ours: reported as unexpected


def expected_shapes(spec: ModelSpec, present: set[str]) -> dict[str, tuple[int, ...]]:
    """Shapes of every stripped checkpoint name this spec needs, in the layout ``present`` uses."""
    h, s = spec.hidden_size, spec
    out: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (s.vocab_size, h),
        "norm.weight": (h,),
    }
    if not s.tie_word_embeddings or "lm_head.weight" in present:
        out["lm_head.weight"] = (s.vocab_size, h)
    for i, kind in enumerate(s.layer_types):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        if kind == FULL_ATTENTION:
            a, kv, d = s.num_attention_heads, s.num_kv_heads, s.head_dim
            out[p + "self_attn.q_proj.weight"] = (2 * a * d, h)
            out[p + "self_attn.k_proj.weight"] = (kv * d, h)
            out[p + "self_attn.v_proj.weight"] = (kv * d, h)
            out[p + "self_attn.o_proj.weight"] = (h, a * d)
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
        else:
            la = p + "linear_attn."
            hv = s.linear_num_value_heads
            if la + "in_proj_qkvz.weight" in present:
                out[la + "in_proj_qkvz.weight"] = (2 * s.gdn_key_dim + 2 * s.gdn_value_dim, h)
                out[la + "in_proj_ba.weight"] = (2 * hv, h)
            else:
                out[la + "in_proj_qkv.weight"] = (s.conv_dim, h)
                out[la + "in_proj_z.weight"] = (s.gdn_value_dim, h)
                out[la + "in_proj_b.weight"] = (hv, h)
                out[la + "in_proj_a.weight"] = (hv, h)
            out[la + "conv1d.weight"] = (s.conv_dim, 1, s.conv_kernel)
            out[la + "A_log"] = (hv,)
            out[la + "dt_bias"] = (hv,)
            out[la + "norm.weight"] = (s.linear_value_head_dim,)
            out[la + "out_proj.weight"] = (h, s.gdn_value_dim)
        m = p + "mlp."
        if s.is_moe_layer(i):
            e, inter, sh = s.num_experts, s.moe_intermediate_size, s.shared_expert_intermediate_size
            out[m + "gate.weight"] = (e, h)
            if m + "experts.gate_up_proj" in present:
                out[m + "experts.gate_up_proj"] = (e, 2 * inter, h)
                out[m + "experts.down_proj"] = (e, h, inter)
            else:
                for j in range(e):
                    out[m + f"experts.{j}.gate_proj.weight"] = (inter, h)
                    out[m + f"experts.{j}.up_proj.weight"] = (inter, h)
                    out[m + f"experts.{j}.down_proj.weight"] = (h, inter)
            out[m + "shared_expert.gate_proj.weight"] = (sh, h)
            out[m + "shared_expert.up_proj.weight"] = (sh, h)
            out[m + "shared_expert.down_proj.weight"] = (h, sh)
            out[m + "shared_expert_gate.weight"] = (1, h)
        else:
            inter = s.intermediate_size
            out[m + "gate_proj.weight"] = (inter, h)
            out[m + "up_proj.weight"] = (inter, h)
            out[m + "down_proj.weight"] = (h, inter)
    return out


def _name_list(names: list[str], limit: int = 5) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def load_weights(
    path: str | Path, spec: ModelSpec, *, dtype: str | torch.dtype = "float32"
) -> dict[str, torch.Tensor]:
    """Load and validate a checkpoint folder into canonical tensors (on CPU, in ``dtype``)."""
    import torch
    from safetensors import safe_open

    from tt_serve.model.dtypes import torch_dtype

    root, tdtype = Path(path), torch_dtype(dtype)
    files = _tensor_files(root)
    stripped: dict[str, str] = {}
    for name in files:
        short = _strip(name)
        if short is not None:
            stripped[short] = name
    expected = expected_shapes(spec, set(stripped))
    missing = sorted(n for n in expected if n not in stripped)
    if missing:
        raise CheckpointError(f"checkpoint {root} is missing tensors: {_name_list(missing)}")
    unexpected = sorted(stripped[n] for n in stripped if n not in expected)
    if unexpected:
        raise CheckpointError(f"checkpoint {root} has unexpected tensors: {_name_list(unexpected)}")

    raw: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for short in expected:
        by_file.setdefault(files[stripped[short]], []).append(short)
    for fpath, shorts in by_file.items():
        with safe_open(str(fpath), "pt") as f:
            for short in shorts:
                t = f.get_tensor(stripped[short])
                if tuple(t.shape) != expected[short]:
                    raise CheckpointError(
                        f"tensor {stripped[short]} has shape {tuple(t.shape)}, "
                        f"expected {expected[short]}"
                    )
                # A_log/dt_bias feed fp32 gate math; keep them fp32 whatever the weight dtype.
                keep32 = short.endswith(("A_log", "dt_bias"))
                raw[short] = t.to(torch.float32 if keep32 else tdtype)
    return _canonicalise(raw, spec)


def _canonicalise(raw: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    import torch

    out = dict(raw)
    if "lm_head.weight" not in out or spec.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    for i in spec.gdn_layers:
        la = f"layers.{i}.linear_attn."
        out[la + "conv1d.weight"] = out[la + "conv1d.weight"][:, 0, :].contiguous()
        if la + "in_proj_qkvz.weight" in out:
            qkv, z, b, a = _split_qwen3_next(
                out.pop(la + "in_proj_qkvz.weight"), out.pop(la + "in_proj_ba.weight"), spec
            )
            out[la + "in_proj_qkv.weight"], out[la + "in_proj_z.weight"] = qkv, z
            out[la + "in_proj_b.weight"], out[la + "in_proj_a.weight"] = b, a
    for i in range(spec.num_layers):
        m = f"layers.{i}.mlp.experts."
        if spec.is_moe_layer(i) and m + "gate_up_proj" not in out:
            ids = range(spec.num_experts)
            gate_up = [
                torch.cat([out.pop(f"{m}{e}.gate_proj.weight"), out.pop(f"{m}{e}.up_proj.weight")])
                for e in ids
            ]
            out[m + "gate_up_proj"] = torch.stack(gate_up)
            out[m + "down_proj"] = torch.stack([out.pop(f"{m}{e}.down_proj.weight") for e in ids])
    return out


def _split_qwen3_next(
    qkvz: torch.Tensor, ba: torch.Tensor, spec: ModelSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """De-interleave Qwen3-Next's per-k-head-group fused rows into the Qwen3.5 layout.

    Rows of ``in_proj_qkvz`` come as Hk groups of [q(dk) | k(dk) | v(r·dv) | z(r·dv)] with
    r = Hv/Hk; ``in_proj_ba`` as Hk groups of [b(r) | a(r)]. Qwen3.5 wants all q rows, then all
    k rows, then all v rows (the conv channel order), and z, b, a by v-head.
    """
    import torch

    hk, dk, dv = spec.linear_num_key_heads, spec.linear_key_head_dim, spec.linear_value_head_dim
    r = spec.linear_num_value_heads // hk
    h = qkvz.shape[-1]
    g = qkvz.reshape(hk, 2 * dk + 2 * r * dv, h)
    q, k, v, z = torch.split(g, [dk, dk, r * dv, r * dv], dim=1)
    qkv = torch.cat([q.reshape(-1, h), k.reshape(-1, h), v.reshape(-1, h)]).contiguous()
    b, a = torch.split(ba.reshape(hk, 2 * r, h), [r, r], dim=1)
    return (
        qkv,
        z.reshape(-1, h).contiguous(),
        b.reshape(-1, h).contiguous(),
        a.reshape(-1, h).contiguous(),
    )
