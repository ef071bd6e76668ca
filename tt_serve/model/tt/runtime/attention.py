"""Gated full attention on the device over the paged KV pool (mirrors ``ref/attention.py``).

Prefill (one row, T tokens, chunk start as a device tensor): K/V are written with
``paged_fill_cache`` through the chunk's own page-table slice, then ``chunked_scaled_dot_product_
attention`` reads [0, start + T) through the row's whole page table. Decode (one row per state
slot, slot s in row s): ``paged_update_cache`` at each row's position,
``paged_scaled_dot_product_attention_decode`` with ``cur_pos`` (-1 skips an idle row). The q
projection is pre-split into query and gate halves.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.runtime.layers import apply_rope, whole

HEAD_MAJOR = [0, 2, 1, 3]  # [1, heads, N, hd] -> [1, N, heads, hd]


@dataclass(frozen=True)
class SdpaConfigs:
    """Program and compute kernel configs of one SDPA call, built once by the model."""

    program: Any
    compute: Any


@dataclass(frozen=True)
class AttentionWeights:
    qkv: Tensor  # [H, (heads + 2 kv_heads)·hd]: [q | k | v] columns
    gate: Tensor  # [H, heads·hd]
    o: Tensor  # [heads·hd, H]
    q_norm: Tensor  # 1 + w
    k_norm: Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    compute: Any = None  # the projections' compute kernel config (fidelity of their dtype)
    exact: Any = None  # HiFi4, for the RoPE rotation matmul
    # qkv and gate outputs split over the mesh rows -> the column's whole projection
    # (``ccl.TensorParallelCCL.gather_rows``; identity on one row)
    rows: Callable[[Tensor], Tensor] = whole


def _decode_qkv(
    ops: Ops, x: Tensor, w: AttentionWeights, rope: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """Decode rows [1, S, H] -> q [1, S, nh, hd], k, v [1, S, nkv, hd], normed and rotated."""
    s, hd, nh, nkv = x.shape[1], w.head_dim, w.num_heads, w.num_kv_heads
    fused = w.rows(ops.linear(x, w.qkv, w.compute))  # [1, S, (nh + 2 nkv) hd]
    cuts = (0, nh * hd, (nh + nkv) * hd, (nh + 2 * nkv) * hd)
    q, k, v = (
        ops.reshape(ops.slice(fused, [0, 0, a], [1, s, e]), [1, s, (e - a) // hd, hd])
        for a, e in itertools.pairwise(cuts)
    )
    return _norm_rope(ops, q, k, w, rope) + (v,)


def _prefill_qkv(
    ops: Ops, x: Tensor, w: AttentionWeights, rope: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """A chunk [1, T, H] -> head-major q [1, nh, T, hd], k, v [1, nkv, T, hd], normed and
    rotated: ``nlp_create_qkv_heads`` splits the fused projection straight into heads."""
    t = x.shape[1]
    fused = w.rows(ops.linear(x, w.qkv, w.compute))
    fused = ops.reshape(fused, [1, 1, t, fused.shape[-1]])
    q, k, v = ops.create_qkv_heads(fused, w.num_heads, w.num_kv_heads)
    return _norm_rope(ops, q, k, w, rope) + (v,)


def _norm_rope(
    ops: Ops, q: Tensor, k: Tensor, w: AttentionWeights, rope: tuple[Tensor, Tensor, Tensor]
) -> tuple[Tensor, Tensor]:
    cos, sin, rot = rope
    q = apply_rope(ops, ops.rms_norm(q, w.q_norm, w.eps), cos, sin, rot, w.exact)
    k = apply_rope(ops, ops.rms_norm(k, w.k_norm, w.eps), cos, sin, rot, w.exact)
    return q, k


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
    (cos, sin [1, 1, T, hd], rotate-half matrix).

    Head-major from the projection on ([1, heads, T, hd], the layout ``paged_fill_cache`` and
    chunked SDPA take, made by ``nlp_create_qkv_heads`` as tt_transformers does): with heads on
    the tile-row axis a [1, T, 4, 256] K pads every token's 4 heads to 32 tile rows, so its norm
    and RoPE would touch 8x the data (2x for 16 q heads) and cos/sin [1, T, 1, hd] 32x;
    head-major pads only T, a multiple of 32 in every bucket."""
    t = x.shape[1]
    q, k, v = _prefill_qkv(ops, x, w, rope)
    gate = w.rows(ops.linear(x, w.gate, w.compute))
    ops.paged_fill_cache(k_cache, k, inp.fill_table)
    ops.paged_fill_cache(v_cache, v, inp.fill_table)
    attn = ops.chunked_sdpa(
        q,
        k_cache,
        v_cache,
        inp.page_table,
        inp.start,
        scale=w.head_dim**-0.5,
        program_config=sdpa.program,
        compute_config=sdpa.compute,
    )
    return _out(ops, ops.permute(attn, HEAD_MAJOR), gate, w, t)


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
    """x [1, S, H] (one row per state slot) -> [1, S, H]; ``rope`` is (cos, sin [1, S, 1, hd],
    rotation): decode keeps rows outermost ([1, S, heads, hd], one user per core in
    ``paged_update_cache``'s height shards and SDPA decode's Q)."""
    s = x.shape[1]
    q, k, v = _decode_qkv(ops, x, w, rope)
    gate = w.rows(ops.linear(x, w.gate, w.compute))
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
