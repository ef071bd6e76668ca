"""Masked token mixers for one padded prefill row of fixed length T (the graphed prefill).

The eager mixers slice by host integers (the row's length and start position); here every shape
is fixed by the bucket and the row's extent arrives as device tensors (see ``inputs.py``):
attention reads the whole fixed-width block table and masks keys past each query's position;
the GDN scan sees zero k, v, beta and log decay on padding tokens, which leaves the recurrent
state exactly as the last valid token left it. On valid tokens the arithmetic is the eager
path's (same chunk grid, same formulas).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tt_serve.model.ref.attention import (
    AttentionWeights,
    attend,
    gated_output,
    gather_blocks,
    project_qkv,
)
from tt_serve.model.ref.gdn import (
    GdnWeights,
    chunk_gated_delta,
    fla_kernels,
    project_inputs,
    split_heads,
)
from tt_serve.model.ref.gdn import gated_output as gdn_output


@dataclass(frozen=True)
class PrefillRow:
    """Device views of one padded prefill row (all long): [T] ids, positions, valid, kv_blocks,
    kv_offsets; [W] table; [1] slot; [K-1] conv_idx; [1] last; plus the constant key positions
    [W·block_size]."""

    ids: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    kv_blocks: torch.Tensor
    kv_offsets: torch.Tensor
    table: torch.Tensor
    slot: torch.Tensor
    conv_idx: torch.Tensor
    last: torch.Tensor
    key_pos: torch.Tensor


def masked_attention(
    x: torch.Tensor,
    w: AttentionWeights,
    row: PrefillRow,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
) -> torch.Tensor:
    """x [T, H] -> [T, H]. Padding tokens sit at position 0 and write into PAD_BLOCK, so every
    query sees at least key 0 (no all-masked softmax row, no NaN)."""
    t, hd, kvh = x.shape[0], w.head_dim, w.num_kv_heads
    rep = w.num_heads // kvh
    q, gate, k, v = project_qkv(x, w, cos, sin)
    k_pool[row.kv_blocks, :, row.kv_offsets] = k.to(k_pool.dtype)
    v_pool[row.kv_blocks, :, row.kv_offsets] = v.to(v_pool.dtype)
    keys = gather_blocks(k_pool, row.table[None])[0].to(x.dtype)  # [kvh, W·bs, hd]
    vals = gather_blocks(v_pool, row.table[None])[0].to(x.dtype)
    qs = q.reshape(t, kvh, rep, hd).permute(1, 2, 0, 3).reshape(kvh, rep * t, hd)
    mask = row.key_pos[None, :] <= row.positions[:, None]  # [T, W·bs]
    o = attend(qs, keys, vals, mask.repeat(rep, 1))
    out = o.reshape(kvh, rep, t, hd).permute(2, 0, 1, 3)
    return gated_output(out, gate, w)


def masked_gdn(
    x: torch.Tensor,
    w: GdnWeights,
    row: PrefillRow,
    conv_state: torch.Tensor,
    rec_state: torch.Tensor,
) -> torch.Tensor:
    """x [T, H] -> [T, H]; advances the row's slot by its valid tokens only."""
    qkv, z, beta, g = project_inputs(x, w)
    history = conv_state.index_select(0, row.slot)[0]  # [C, K-1]
    full = torch.cat([history, qkv.float().T], dim=-1)  # [C, K-1+T]
    conv = F.conv1d(full[None], w.conv[:, None, :], groups=full.shape[0])[0]
    conv_state.index_copy_(0, row.slot, full.index_select(1, row.conv_idx)[None])
    q, k, v = split_heads(F.silu(conv).T, w)

    valid = row.valid != 0
    vt = valid[:, None]
    zero = torch.zeros((), dtype=torch.float32, device=x.device)
    q, k, v = (torch.where(vt[..., None], a, zero) for a in (q, k, v))
    g, beta = torch.where(vt, g, zero), torch.where(vt, beta, zero)
    state = rec_state.index_select(0, row.slot)[0]
    f = fla_kernels(x)  # flash-linear-attention's chunk kernel where it imports and agrees
    core, state = (chunk_gated_delta if f is None else f.chunk)(q, k, v, g, beta, state)
    rec_state.index_copy_(0, row.slot, state[None])
    return gdn_output(core, z, w, x.dtype)
