"""Gated full attention over a paged KV pool.

K/V of every token are written to ``pool[block_table[pos // bs], :, pos % bs]``; each row then
attends over positions [0, end_pos) gathered through its block table. The pool layout is
``[num_blocks, kv_heads, block_size, head_dim]`` per layer; block 0 is the padding block that
padding rows write garbage into and that no real row reads (tables are cut to the row's length).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tt_serve.model.kernels import native
from tt_serve.model.ref.layers import Linear, apply_partial_rope, rms_norm
from tt_serve.model.ref.plan import StepPlan, as_index


@dataclass(frozen=True)
class AttentionWeights:
    qkv_proj: Linear  # [q_proj (2·heads·hd, per head [q | gate]) | k_proj | v_proj] x H fused
    qkv_splits: tuple[int, ...]
    o_proj: Linear
    q_norm: torch.Tensor  # [hd] norm_scale(w)
    k_norm: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float


def gather_blocks(pool: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """pool [N, kvh, bs, hd], tables [B, W] -> [B, kvh, W·bs, hd].

    ``index_select`` on the flattened table, not ``pool[tables]``: the same blocks at a
    fraction of advanced indexing's cost on the CPU (2 cores, demo pool: 32 decode rows of 5
    blocks 0.96 -> 0.39 ms, one 65-block prefill row 0.60 -> 0.52 ms)."""
    b, w = tables.shape
    g = pool.index_select(0, tables.reshape(-1)).view(b, w, *pool.shape[1:])
    return g.permute(0, 2, 1, 3, 4).reshape(b, pool.shape[1], w * pool.shape[2], pool.shape[3])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, kvh, rep·n.., hd] grouped per kv head; mask True where a key is visible."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return probs @ v


def attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """A prefill chunk's causal attention over its whole history, through torch's fused SDPA
    kernel (flash attention on the CPU: no [heads, n, end] score matrix; K/V heads shared by
    their query group in the kernel, ``enable_gqa``).

    q [n, heads, hd] at positions start .. start + n - 1; k, v [kvh, end, hd] -> [n, heads, hd].
    """
    n, end = q.shape[0], k.shape[1]
    # An additive float mask: a boolean one is converted to it inside SDPA on every call (two
    # `where` passes over [n, end], about a third of the kernel's own time at 256 x 2,048).
    # Every history key is visible; the chunk's own keys form the causal triangle.
    mask = torch.zeros(n, end, dtype=q.dtype, device=q.device)
    mask[:, start:] = _future(n, q.dtype, q.device)[:, : end - start]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask, enable_gqa=True
    )
    return out[0].transpose(0, 1)


def attend_last(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    end: int,
) -> torch.Tensor:
    """The last query of a chunk alone over every key up to it (all visible: no mask), read
    from the paged pools: the C decode kernel where it is compiled (the blocks where they lie),
    else a gather and torch's SDPA.

    q [heads, hd]; pools [N, kvh, bs, hd]; table [blocks] long; end: the keys' count."""
    nk = native.kernels()
    if nk is not None and nk.attends(q, k_pool, v_pool):
        lens = torch.tensor([end], dtype=torch.long)
        return nk.attn_decode(q[None], k_pool, v_pool, table[None], lens, q.shape[-1] ** -0.5)[0]
    k = gather_blocks(k_pool, table[None])[0, :, :end].to(q.dtype)
    v = gather_blocks(v_pool, table[None])[0, :, :end].to(q.dtype)
    out = F.scaled_dot_product_attention(q[None, :, None], k[None], v[None], enable_gqa=True)
    return out[0, :, 0]


@functools.cache
def _future(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[n, n]: -inf above the diagonal (key after query), 0 elsewhere; one per chunk size."""
    return torch.full((n, n), float("-inf"), dtype=dtype, device=device).triu(1)


def project_qkv(
    x: torch.Tensor, w: AttentionWeights, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, H] -> q [T, heads, hd] (normed, roped), gate [T, heads·hd], k, v [T, kvh, hd]."""
    t, hd, kvh = x.shape[0], w.head_dim, w.num_kv_heads
    qg, k, v = torch.split(w.qkv_proj(x), list(w.qkv_splits), dim=-1)
    qg = qg.reshape(t, w.num_heads, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(t, -1)
    q = apply_partial_rope(rms_norm(q, w.q_norm, w.eps), cos, sin)
    k = apply_partial_rope(rms_norm(k.reshape(t, kvh, hd), w.k_norm, w.eps), cos, sin)
    v = v.reshape(t, kvh, hd)
    return q, gate, k, v


def gated_output(out: torch.Tensor, gate: torch.Tensor, w: AttentionWeights) -> torch.Tensor:
    """Per-head attention output [T, heads, hd] -> sigmoid-gated, projected [T, H]."""
    attn = out.reshape(out.shape[0], w.num_heads * w.head_dim) * torch.sigmoid(gate)
    return w.o_proj(attn)


def attention_forward(
    x: torch.Tensor,
    w: AttentionWeights,
    plan: StepPlan,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    keep: Sequence[int] | None = None,
) -> torch.Tensor:
    """x [T, H] (normed) -> [T, H]; writes this step's K/V into the pools first.

    With ``keep`` (batch offsets, ascending) -> [len(keep), H]: only those tokens' queries
    attend. A prefill chunk none of whose tokens is kept only writes its K/V; one whose last
    token alone is kept attends with that query alone (``attend_last``)."""
    t, hd, kvh = x.shape[0], w.head_dim, w.num_kv_heads
    rep = w.num_heads // kvh
    q, gate, k, v = project_qkv(x, w, cos, sin)
    k_pool[plan.kv_blocks, :, plan.kv_offsets] = k.to(k_pool.dtype)
    v_pool[plan.kv_blocks, :, plan.kv_offsets] = v.to(v_pool.dtype)

    out = torch.empty(t, w.num_heads, hd, dtype=x.dtype, device=x.device)
    for sp in plan.spans:
        last = sp.offset + sp.n - 1
        kept = None if keep is None else [o for o in keep if sp.offset <= o <= last]
        if kept == []:
            continue
        end = sp.start_pos + sp.n
        if kept == [last]:
            out[last] = attend_last(q[last], k_pool, v_pool, sp.block_table, end)
            continue
        keys = gather_blocks(k_pool, sp.block_table[None])[0, :, :end].to(x.dtype)
        vals = gather_blocks(v_pool, sp.block_table[None])[0, :, :end].to(x.dtype)
        qs = q[sp.offset : sp.offset + sp.n]
        out[sp.offset : sp.offset + sp.n] = attend_chunk(qs, keys, vals, sp.start_pos)
    nk = native.kernels() if plan.num_decode else None
    if nk is not None and nk.attends(q, k_pool, v_pool):  # the blocks read where they lie
        qd = q[plan.dec_tokens]
        out[plan.dec_tokens] = nk.attn_decode(
            qd, k_pool, v_pool, plan.dec_tables, plan.dec_lens, hd**-0.5
        )
    elif plan.num_decode:
        b = plan.num_decode
        keys = gather_blocks(k_pool, plan.dec_tables).to(x.dtype)
        vals = gather_blocks(v_pool, plan.dec_tables).to(x.dtype)
        qd = q[plan.dec_tokens].reshape(b, kvh, rep, hd)
        pos = torch.arange(keys.shape[2], device=x.device)
        mask = (pos[None, :] < plan.dec_lens[:, None])[:, None, None, :]  # [B, 1, 1, L]
        out[plan.dec_tokens] = attend(qd, keys, vals, mask).reshape(b, w.num_heads, hd)
    if keep is not None:
        rows = as_index(keep, x.device)
        out, gate = out[rows], gate[rows]
    return gated_output(out, gate, w)
