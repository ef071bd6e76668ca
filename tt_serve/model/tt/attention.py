"""Gated full attention on the device over the paged KV pool (mirrors ``ref/attention.py``).

Prefill (one row, T tokens, chunk start as a device tensor): K/V are written with
``paged_fill_cache`` through the chunk's own page-table slice, then ``chunked_scaled_dot_product_
attention`` reads [0, start + T) through the row's whole page table. Decode (one row per state
slot, slot s in row s): ``paged_update_cache`` at each row's position,
``paged_scaled_dot_product_attention_decode`` with ``cur_pos`` (-1 skips an idle row). The q
projection is pre-split into query and gate halves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tt_serve.model.tt.layers import apply_rope
from tt_serve.model.tt.ops import Ops, Tensor


@dataclass(frozen=True)
class SdpaConfigs:
    """Program and compute kernel configs of one SDPA call, built once by the model."""

    program: Any
    compute: Any


@dataclass(frozen=True)
class AttentionWeights:
    q: Tensor  # [H, heads·hd]
    gate: Tensor  # [H, heads·hd]
    k: Tensor
    v: Tensor
    o: Tensor  # [heads·hd, H]
    q_norm: Tensor  # 1 + w
    k_norm: Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    compute: Any = None  # the projections' compute kernel config (fidelity of their dtype)
    exact: Any = None  # HiFi4, for the RoPE rotation matmul


def _qkv(
    ops: Ops, x: Tensor, w: AttentionWeights, n: int, cos: Tensor, sin: Tensor, rot: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    hd, c = w.head_dim, w.compute
    q = ops.reshape(ops.linear(x, w.q, c), [1, n, w.num_heads, hd])
    q = apply_rope(ops, ops.rms_norm(q, w.q_norm, w.eps), cos, sin, rot, w.exact)
    k = ops.reshape(ops.linear(x, w.k, c), [1, n, w.num_kv_heads, hd])
    k = apply_rope(ops, ops.rms_norm(k, w.k_norm, w.eps), cos, sin, rot, w.exact)
    v = ops.reshape(ops.linear(x, w.v, c), [1, n, w.num_kv_heads, hd])
    return q, k, v, ops.linear(x, w.gate, c)


def _out(ops: Ops, attn: Tensor, gate: Tensor, w: AttentionWeights, n: int) -> Tensor:
    attn = ops.reshape(attn, [1, n, w.num_heads * w.head_dim])
    return ops.linear(ops.mul(attn, ops.sigmoid(gate)), w.o, w.compute)


def attention_prefill(
    ops: Ops,
    x: Tensor,
    w: AttentionWeights,
    inp: Any,
    k_cache: Tensor,
    v_cache: Tensor,
    rope: tuple[Tensor, Tensor, Tensor],
    sdpa: SdpaConfigs,
) -> Tensor:
    """x [1, T, H] -> [1, T, H]; ``inp`` holds the bucket's persistent inputs, ``rope`` is
    (cos, sin [1, T, 1, hd], rotate-half matrix)."""
    t = x.shape[1]
    q, k, v, gate = _qkv(ops, x, w, t, *rope)
    head_major = [0, 2, 1, 3]
    ops.paged_fill_cache(k_cache, ops.permute(k, head_major), inp.fill_table)
    ops.paged_fill_cache(v_cache, ops.permute(v, head_major), inp.fill_table)
    attn = ops.chunked_sdpa(
        ops.permute(q, head_major),
        k_cache,
        v_cache,
        inp.page_table,
        inp.start,
        scale=w.head_dim**-0.5,
        program_config=sdpa.program,
        compute_config=sdpa.compute,
    )
    return _out(ops, ops.permute(attn, head_major), gate, w, t)


def attention_decode(
    ops: Ops,
    x: Tensor,
    w: AttentionWeights,
    inp: Any,
    k_cache: Tensor,
    v_cache: Tensor,
    rope: tuple[Tensor, Tensor, Tensor],
    sdpa: SdpaConfigs,
) -> Tensor:
    """x [1, S, H] (one row per state slot) -> [1, S, H]; ``rope`` as in prefill."""
    s = x.shape[1]
    q, k, v, gate = _qkv(ops, x, w, s, *rope)
    ops.paged_update_cache(k_cache, ops.height_sharded(k, s), inp.write_pos, inp.page_table)
    ops.paged_update_cache(v_cache, ops.height_sharded(v, s), inp.write_pos, inp.page_table)
    attn = ops.paged_sdpa_decode(
        q,
        k_cache,
        v_cache,
        inp.page_table,
        inp.cur_pos,
        scale=w.head_dim**-0.5,
        program_config=sdpa.program,
        compute_config=sdpa.compute,
    )
    # The op pads the head axis to a whole tile; keep the real heads.
    attn = ops.slice(attn, [0, 0, 0, 0], [1, s, w.num_heads, w.head_dim])
    return _out(ops, attn, gate, w, s)
