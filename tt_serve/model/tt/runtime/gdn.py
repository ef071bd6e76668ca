"""Gated DeltaNet on the device (mirrors ``ref/gdn.py``).

Prefill (one row, T tokens): projections, then ``ttnn.experimental.kda.qkv_causal_conv1d_silu``
(4-tap depthwise causal conv + SiLU + q/k/v split) from the row's conv history, then
``ttnn.transformer.chunk_gated_delta_rule`` in its flat token-major form (q/k raw: the kernel
L2-normalises them and maps value heads to key heads; chunk 32) from the row's recurrent state.
The row's state lives in per-layer *working* buffers (copied in from its slot before the replay
and back after it), so the captured program never depends on the slot. Padding tokens of the
bucket get beta = g = 0 (identity update) and the new conv history is picked at the last valid
token by a one-hot matmul. The constant tiles are passed explicitly (the op would otherwise
upload them from the host on every call, illegal under trace).

Decode (one row per state slot, slot s in row s; in place on the pools): the 4-tap
conv as elementwise ops on [history; x], ``fused_recurrent_gated_delta_rule`` on the whole
recurrent pool, then both pools are overwritten in place by the ``where`` that selects per row
(no whole-pool ``copy``); idle rows keep their state bit for bit: the new conv history and
recurrent state are *selected* per row,
never blended by a 0/1 multiply, because an idle row's activations are undefined (paged SDPA
decode skips the row and leaves its output unwritten) and 0 x NaN = NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.runtime.layers import l2norm, whole

KERNEL_CHUNK = 32  # chunk_gated_delta_rule's own chunk: its flat (rank-3) path requires 32


@dataclass(frozen=True)
class GdnWeights:
    qkv: Tensor  # [H, C]
    z: Tensor  # [H, Hv·dv]
    b: Tensor  # [H, Hv]
    a: Tensor
    out: Tensor  # [Hv·dv, H]
    norm: Tensor  # w (not 1 + w)
    taps: tuple[Tensor, Tensor, Tensor, Tensor]  # [1, 1, 1, C], oldest first
    dt_bias: Tensor  # [1, 1, Hv] fp32
    neg_a: Tensor  # -exp(A_log) [1, 1, Hv] fp32
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    eps: float
    compute: Any = None  # the projections' compute kernel config (fidelity of their dtype)
    exact: Any = None  # HiFi4, for the one-hot conv-state selection matmul
    # qkv and z outputs split over the mesh rows -> the column's whole projection
    # (``ccl.TensorParallelCCL.gather_rows``; identity on one row)
    rows: Callable[[Tensor], Tensor] = whole

    @property
    def widths(self) -> tuple[int, int, int]:
        kd = self.num_k_heads * self.head_k_dim
        return kd, kd, self.num_v_heads * self.head_v_dim


def _gates(ops: Ops, x: Tensor, w: GdnWeights, mask: Tensor) -> tuple[Tensor, Tensor]:
    """beta = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias), both fp32; 0 where ``mask`` is
    0 (an identity update; selected, so undefined inputs of those rows cannot leak)."""
    beta = ops.where(mask, ops.sigmoid(ops.typecast(ops.linear(x, w.b, w.compute), "float32")), 0.0)
    a = ops.add(ops.typecast(ops.linear(x, w.a, w.compute), "float32"), w.dt_bias)
    g = ops.where(mask, ops.mul(ops.softplus(a), w.neg_a), 0.0)
    return beta, g


def _output(ops: Ops, core: Tensor, z: Tensor, w: GdnWeights, n: int) -> Tensor:
    """core [1, N, Hv, dv] -> out_proj(w · norm(core) · silu(z))."""
    hv, dv = w.num_v_heads, w.head_v_dim
    normed = ops.rms_norm(ops.typecast(core, "bfloat16"), w.norm, w.eps)
    gated = ops.mul(normed, ops.silu(ops.reshape(z, [1, n, hv, dv])))
    return ops.linear(ops.reshape(gated, [1, n, hv * dv]), w.out, w.compute)


def gdn_prefill(
    ops: Ops,
    x: Tensor,
    w: GdnWeights,
    inp: Any,
    conv_work: Tensor,
    rec_work: Tensor,
    consts: tuple[Tensor, Tensor, Tensor, Tensor],
    conv_config: Any,
) -> Tensor:
    """x [1, T, H] -> [1, T, H]; reads and rewrites conv_work [1, K-1, C] (ROW_MAJOR) and
    rec_work [1, Hv, dk, dv] (fp32)."""
    t = x.shape[1]
    if w.head_k_dim != w.head_v_dim:
        raise ValueError("the flat chunked GDN op needs head_k_dim == head_v_dim")
    qkv = w.rows(ops.linear(x, w.qkv, w.compute))  # [1, T, C]
    z = w.rows(ops.linear(x, w.z, w.compute))
    beta, g = _gates(ops, x, w, inp.gate_mask)
    q, k, v = ops.qkv_causal_conv1d_silu(
        qkv, conv_work, w.taps, w.widths, start=inp.start_u32, program_config=conv_config
    )
    history = ops.concat([ops.to_tile(conv_work), qkv], 1)  # [1, K-1+T, C]
    # [1, K-1, C] at the last valid token
    new_conv = ops.matmul(inp.conv_select, history, w.exact)
    core, final = ops.chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        state=rec_work,
        scale=w.head_k_dim**-0.5,
        chunk_size=KERNEL_CHUNK,
        consts=consts,
    )
    ops.copy(final, rec_work)
    ops.copy(ops.to_row_major(new_conv), conv_work)
    return _output(ops, ops.to_tile(core), z, w, t)


def gdn_decode(
    ops: Ops,
    x: Tensor,
    w: GdnWeights,
    inp: Any,
    conv_pool: Tensor,
    rec_pool: Tensor,
    rows_per_call: int,
) -> Tensor:
    """x [1, S, H] -> [1, S, H]; conv_pool [S, 1, K-1, C], rec_pool [S, Hv, dk, dv] in place.

    The recurrence runs on at most ``rows_per_call`` rows at a time, so that rows x value heads
    never exceed the worker grid (one core per (row, head) in the fused op)."""
    s = x.shape[1]
    kd, _, vd = w.widths
    c = 2 * kd + vd
    qkv = w.rows(ops.linear(x, w.qkv, w.compute))
    z = w.rows(ops.linear(x, w.z, w.compute))
    beta, g = _gates(ops, x, w, inp.gate_mask)
    full = ops.concat([conv_pool, ops.reshape(qkv, [s, 1, 1, c])], 2)  # [S, 1, K, C]
    kernel = len(w.taps)
    conv = None
    for j, tap in enumerate(w.taps):
        term = ops.mul(ops.slice(full, [0, 0, j, 0], [s, 1, j + 1, c]), tap)
        conv = term if conv is None else ops.add(conv, term)
    mixed = ops.reshape(ops.silu(conv), [s, 1, c])
    shifted = ops.slice(full, [0, 0, 1, 0], [s, 1, kernel, c])
    hk, hv, dk, dv = w.num_k_heads, w.num_v_heads, w.head_k_dim, w.head_v_dim
    q = l2norm(ops, ops.reshape(ops.slice(mixed, [0, 0, 0], [s, 1, kd]), [s, 1, hk, dk]))
    k = l2norm(ops, ops.reshape(ops.slice(mixed, [0, 0, kd], [s, 1, 2 * kd]), [s, 1, hk, dk]))
    v = ops.reshape(ops.slice(mixed, [0, 0, 2 * kd], [s, 1, c]), [s, 1, hv, dv])
    g, beta = ops.reshape(g, [s, 1, hv]), ops.reshape(beta, [s, 1, hv])
    cores: list[Tensor] = []
    finals: list[Tensor] = []
    for a in range(0, s, rows_per_call):
        b = min(s, a + rows_per_call)

        def rows(t: Tensor, a: int = a, b: int = b) -> Tensor:
            shape = list(t.shape)  # a ttnn.Shape indexes but does not slice
            return t if b - a == s else ops.slice(t, [a] + [0] * (len(shape) - 1), [b, *shape[1:]])

        part, fin = ops.fused_recurrent_gated_delta_rule(
            rows(q), rows(k), rows(v), rows(g), rows(beta), state=rows(rec_pool), scale=dk**-0.5
        )
        cores.append(part)
        finals.append(fin)
    core = cores[0] if len(cores) == 1 else ops.concat(cores, 0)
    final = finals[0] if len(finals) == 1 else ops.concat(finals, 0)
    keep_new = ops.reshape(inp.gate_mask, [s, hv, 1, 1])  # per (row, value head): scalar bcast
    ops.where(keep_new, final, rec_pool, out=rec_pool)
    ops.where(inp.conv_mask, shifted, conv_pool, out=conv_pool)  # [S,1,1,1] selects per row
    return _output(ops, ops.reshape(core, [1, s, hv, dv]), z, w, s)
