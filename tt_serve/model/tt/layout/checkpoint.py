"""Checkpoint tensors -> the device layouts the ttnn ops want (numpy only, testable without ttnn).

Canonical checkpoint tensors (``model/weights.py``) become host weights laid out the way the
device ops want them: linear weights transposed to [in, out] TILE in the group's precision, the
attention q projection split into its query and gate halves, Qwen RMSNorm weights stored as
``1 + w``, GDN conv taps as four [1, 1, 1, C] vectors (oldest first), the gate constants
``dt_bias`` and ``-exp(A_log)`` in fp32, embeddings ROW_MAJOR, MoE experts in sparse_matmul's
[1, E, in, out] layout (:func:`sparse_experts`; the dense reference path stacks them per group,
:func:`stacked_experts`). ``tests/tt_host`` checks this layout against the real ``ttnn.Tensor``.
"""

from __future__ import annotations

import numpy as np

from tt_serve.model.spec import FULL_ATTENTION, ModelSpec
from tt_serve.model.tt.layout.experts import DISPATCHES, MoeDispatch, expert_groups
from tt_serve.model.tt.layout.host import (
    HostWeight,
    concat_rows,
    contiguous,
    is_shape_only,
    shape_only_array,
)
from tt_serve.model.tt.ops import ROW_MAJOR, TILE
from tt_serve.model.tt.precision import Precision


def linear_t(w: np.ndarray) -> np.ndarray:
    """torch [out, in] -> ttnn [in, out]."""
    return contiguous(w.T)


def norm_weight(w: np.ndarray, *, plus_one: bool) -> np.ndarray:
    """[dim] -> [1, 1, dim/32, 32] ROW_MAJOR, the ttnn RMSNorm weight layout."""
    v = (1.0 + w) if plus_one else w
    return v.astype(np.float32).reshape(1, 1, -1, 32)


def split_q_gate(q_proj: np.ndarray, heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows come per head as [q | gate]; return (q [heads·hd, H], gate [heads·hd, H])."""
    per = q_proj.reshape(heads, 2 * head_dim, -1)
    h = q_proj.shape[-1]
    return per[:, :head_dim].reshape(-1, h), per[:, head_dim:].reshape(-1, h)


def conv_taps(conv: np.ndarray) -> list[np.ndarray]:
    """conv [C, K] -> K taps [1, 1, 1, C]; tap 0 multiplies the oldest input."""
    return [contiguous(conv[:, j]).reshape(1, 1, 1, -1) for j in range(conv.shape[1])]


def layout_weights(
    spec: ModelSpec,
    w: dict[str, np.ndarray],
    precision: Precision,
    moe_dispatch: MoeDispatch = "sparse",
) -> dict[str, HostWeight]:
    """Canonical float32 arrays -> device layouts (pure numpy); MoE experts as
    ``moe_dispatch``'s path reads them."""
    if moe_dispatch not in DISPATCHES:
        raise ValueError(f"moe_dispatch={moe_dispatch!r}; choose one of {DISPATCHES}")
    p = precision
    out: dict[str, HostWeight] = {
        "embed": HostWeight(w["embed_tokens.weight"], "bfloat16", ROW_MAJOR),
        "norm": HostWeight(norm_weight(w["norm.weight"], plus_one=True), "bfloat16", ROW_MAJOR),
        "lm_head": HostWeight(linear_t(w["lm_head.weight"]), p.lm_head, TILE),
    }

    def put(name: str, hw: HostWeight) -> None:
        if name in out:
            raise ValueError(f"two weights map to the device name {name!r}")
        out[name] = hw

    def lin(name: str, key: str, dtype: str) -> None:
        put(name, HostWeight(linear_t(w[key]), dtype, TILE))

    def norm(name: str, key: str, plus_one: bool = True) -> None:
        put(name, HostWeight(norm_weight(w[key], plus_one=plus_one), "bfloat16", ROW_MAJOR))

    for i, kind in enumerate(spec.layer_types):
        s, L = f"layers.{i}.", f"{i}."
        norm(L + "input_norm", s + "input_layernorm.weight")
        norm(L + "post_norm", s + "post_attention_layernorm.weight")
        if kind == FULL_ATTENTION:
            a = s + "self_attn."
            q, gate = split_q_gate(w[a + "q_proj.weight"], spec.num_attention_heads, spec.head_dim)
            # q, k, v fused as [q | k | v] columns: one matmul, and the layout
            # nlp_create_qkv_heads splits into head-major heads
            qkv = concat_rows([q, w[a + "k_proj.weight"], w[a + "v_proj.weight"]])
            put(L + "qkv", HostWeight(linear_t(qkv), p.attention, TILE))
            put(L + "gate", HostWeight(linear_t(gate), p.attention, TILE))
            lin(L + "o", a + "o_proj.weight", p.attention)
            norm(L + "q_norm", a + "q_norm.weight")
            norm(L + "k_norm", a + "k_norm.weight")
        else:
            g = s + "linear_attn."
            for n in ("qkv", "z", "b", "a"):
                lin(L + n, g + f"in_proj_{n}.weight", p.gdn)
            lin(L + "out", g + "out_proj.weight", p.gdn)
            norm(L + "gdn_norm", g + "norm.weight", plus_one=False)
            for j, tap in enumerate(conv_taps(w[g + "conv1d.weight"])):
                out[L + f"tap{j}"] = HostWeight(tap, "bfloat16", TILE)
            hv = spec.linear_num_value_heads
            dt = w[g + "dt_bias"].astype(np.float32).reshape(1, 1, hv)
            neg_a = (-np.exp(w[g + "A_log"].astype(np.float32))).reshape(1, 1, hv)
            out[L + "dt_bias"] = HostWeight(dt, "float32", TILE)
            out[L + "neg_a"] = HostWeight(neg_a, "float32", TILE)
        m = s + "mlp."
        if spec.is_moe_layer(i):
            _moe(out, w, m, L, spec, p, moe_dispatch)
        else:
            for n in ("gate", "up", "down"):
                lin(L + f"mlp.{n}", m + f"{n}_proj.weight", p.mlp)
    return out


def stacked_experts(
    gate_up: np.ndarray, down: np.ndarray, first: int, end: int, inter: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Experts [first, end) of the fused checkpoint tensors (gate_up [E, 2I, H], down [E, H, I])
    as the stacked operands of ``tt/runtime/moe.py``: gate and up [1, G, I, H] (the checkpoint's own
    [out, in] orientation: they are the matmul's A), down [1, 1, H, G·I] with expert g's [H, I]
    in column block g."""
    g, h = end - first, gate_up.shape[-1]
    if is_shape_only(gate_up):
        return (
            shape_only_array((1, g, inter, h)),
            shape_only_array((1, g, inter, h)),
            shape_only_array((1, 1, h, g * inter)),
        )
    gate = np.ascontiguousarray(gate_up[first:end, :inter])[None]
    up = np.ascontiguousarray(gate_up[first:end, inter:])[None]
    cat = np.ascontiguousarray(down[first:end].transpose(1, 0, 2)).reshape(1, 1, h, g * inter)
    return gate, up, cat


def sparse_experts(gate_up: np.ndarray, down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fused checkpoint tensors (gate_up [E, 2I, H], down [E, H, I]) as sparse_matmul's B
    operands ([in, out] per expert): gate_up [1, E, H, 2I] (columns [0, I) gate, [I, 2I) up) and
    down [1, E, I, H]; on a mesh both split on the expert dim (whole experts per chip)."""
    e, two_i, h = gate_up.shape
    if is_shape_only(gate_up):
        return shape_only_array((1, e, h, two_i)), shape_only_array((1, e, two_i // 2, h))
    return (
        np.ascontiguousarray(gate_up.transpose(0, 2, 1))[None],
        np.ascontiguousarray(down.transpose(0, 2, 1))[None],
    )


def _moe(
    out: dict[str, HostWeight],
    w: dict[str, np.ndarray],
    m: str,
    L: str,
    spec: ModelSpec,
    p: Precision,
    moe_dispatch: MoeDispatch,
) -> None:
    inter = spec.moe_intermediate_size
    out[L + "router"] = HostWeight(linear_t(w[m + "gate.weight"]), "bfloat16", TILE)
    gate_up, down = w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"]
    if moe_dispatch == "sparse":
        gu, dn = sparse_experts(gate_up, down)
        out[L + "experts.gate_up"] = HostWeight(gu, p.experts, TILE)
        out[L + "experts.down"] = HostWeight(dn, p.experts, TILE)
    for j, (first, end) in enumerate(
        expert_groups(spec.num_experts, inter) if moe_dispatch == "dense" else []
    ):
        gate, up, cat = stacked_experts(gate_up, down, first, end, inter)
        out[L + f"experts.{j}.gate"] = HostWeight(gate, p.experts, TILE)
        out[L + f"experts.{j}.up"] = HostWeight(up, p.experts, TILE)
        out[L + f"experts.{j}.down"] = HostWeight(cat, p.experts, TILE)
    for n in ("gate", "up", "down"):
        key = m + f"shared_expert.{n}_proj.weight"
        out[L + f"shared.{n}"] = HostWeight(linear_t(w[key]), p.mlp, TILE)
    out[L + "shared_gate"] = HostWeight(
        linear_t(w[m + "shared_expert_gate.weight"]), "bfloat16", TILE
    )
