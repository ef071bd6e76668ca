"""Gated DeltaNet layer: causal conv + gated delta rule over slot-addressed state pools.

Multi-token rows run the chunked scan (chunk 64, grid aligned to the row's first token) from
the state in their slot; single-token rows run one recurrent step, batched over rows. Conv and
recurrent state are fp32 whatever the weight dtype. The delta rule for one v-head, per token t:
    S ← S·exp(g_t);  S ← S + k_t ⊗ β_t (v_t − Sᵀk_t);  o_t = Sᵀ q_t
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tt_serve.config.serve_config import GDN_CHUNK
from tt_serve.model.interface import StepBatch, StepRow
from tt_serve.model.kernels import fla, native
from tt_serve.model.ref.layers import Linear, fused, l2norm, rms_norm_gated
from tt_serve.model.ref.plan import StepPlan, as_index

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GdnWeights:
    in_proj: Linear  # [qkv C | z Hv·dv | b Hv | a Hv] x H fused, C = 2·Hk·dk + Hv·dv
    in_splits: tuple[int, ...]  # (C, Hv·dv, Hv, Hv)
    conv: torch.Tensor  # [C, K] fp32 (any strides; tap-major, [:, j] contiguous, is fastest)
    neg_a: torch.Tensor  # [Hv] fp32 -exp(A_log), the decay rate (computed once at load)
    dt_bias: torch.Tensor  # [Hv] fp32
    norm: torch.Tensor  # [dv]
    out_proj: Linear  # [H, Hv·dv]
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    eps: float

    @classmethod
    def random(
        cls,
        hidden: int,
        heads: tuple[int, int, int, int],
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        taps: int = 4,
    ) -> GdnWeights:
        """A layer of random weights at the scales of a trained one (heads: Hk, Hv, dk, dv):
        what the fused kernel's self-check and tests run."""
        hk, hv, dk, dv = heads
        g = torch.Generator().manual_seed(seed)
        conv_dim = 2 * hk * dk + hv * dv

        def w(*shape: int, scale: float = hidden**-0.5) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * scale).to(dtype)

        in_proj, in_splits = fused(
            w(conv_dim, hidden), w(hv * dv, hidden), w(hv, hidden), w(hv, hidden)
        )
        return cls(
            in_proj=in_proj,
            in_splits=in_splits,
            conv=(torch.randn(conv_dim, taps, generator=g) * 0.3).T.contiguous().T,
            neg_a=-(torch.rand(hv, generator=g) * 4).exp() / 8,
            dt_bias=torch.randn(hv, generator=g),
            norm=w(dv, scale=0.1) + 1,
            out_proj=Linear(w(hidden, hv * dv, scale=(hv * dv) ** -0.5)),
            num_k_heads=hk,
            num_v_heads=hv,
            head_k_dim=dk,
            head_v_dim=dv,
            eps=1e-6,
        )


def chunk_gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = GDN_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule for one sequence, fp32.

    q, k [T, Hv, dk] (normalised, q pre-scaled), v [T, Hv, dv], g (log decay), beta [T, Hv],
    state [Hv, dk, dv]. Returns (out [T, Hv, dv], final state). Within a chunk the delta-rule
    updates are folded with the UT transform: (I + tril(β K Kᵀ ⊙ D, -1)) U = β V.
    """
    t = q.shape[0]
    pad = (-t) % chunk
    if pad:  # zero padding (k = v = β = g = 0) leaves the state untouched
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    q, k, v, g, beta = (x.transpose(0, 1) for x in (q, k, v, g, beta))
    h, n = q.shape[0], (t + pad) // chunk
    q, k, v = (x.reshape(h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(h, n, chunk), beta.reshape(h, n, chunk)

    gc = g.cumsum(-1)  # log decay from chunk start to each position
    egc = gc.exp()[..., None]
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(_above(chunk, q.device), -math.inf)
    decay = decay.exp()
    kb = k * beta[..., None]
    vb = v * beta[..., None]
    ut = (kb @ k.transpose(-1, -2)) * decay
    # one triangular solve for both right-hand sides: U = T⁻¹ βV and W = T⁻¹ (βK ⊙ e^gc)
    dv = v.shape[-1]
    uw = torch.linalg.solve_triangular(
        ut, torch.cat([vb, kb * egc], -1), upper=False, unitriangular=True
    )
    u = uw[..., :dv]
    intra = (q @ k.transpose(-1, -2)) * decay
    # [W; Q ⊙ e^gc] against the state in one product per chunk (rows :chunk are W S)
    wq = torch.cat([uw[..., dv:], q * egc], -2)
    k_dec = k * (gc[..., -1:] - gc).exp()[..., None]
    chunk_decay = gc[..., -1].exp()[..., None, None]

    out = torch.empty_like(v)
    s = state
    for i in range(n):
        ws = wq[:, i] @ s
        v_new = u[:, i] - ws[:, :chunk]
        out[:, i] = ws[:, chunk:] + intra[:, i] @ v_new
        s = s * chunk_decay[:, i] + k_dec[:, i].transpose(-1, -2) @ v_new
    out = out.reshape(h, n * chunk, -1)[:, :t].transpose(0, 1)
    return out, s


@functools.cache
def _above(chunk: int, device: torch.device) -> torch.Tensor:
    """[chunk, chunk] bool, True above the diagonal (a later token): built once per device."""
    return torch.ones(chunk, chunk, dtype=torch.bool, device=device).triu(1)


def recurrent_gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for B rows: q, k [B, Hv, dk], v [B, Hv, dv], g, beta [B, Hv], state [B, Hv, dk, dv]."""
    s = state * g.exp()[..., None, None]
    kv_mem = (s * k[..., None]).sum(-2)
    delta = (v - kv_mem) * beta[..., None]
    s = s + k[..., None] * delta[..., None, :]
    return (s * q[..., None]).sum(-2), s


def fla_kernels(x: torch.Tensor, w: GdnWeights) -> fla.FlaKernels | None:
    """flash-linear-attention's kernels for the delta rule on ``x``'s CUDA device and compute
    dtype at ``w``'s head shapes, once they agree there with the two functions above
    (``model/kernels/fla.py``); None on the CPU, where fla does not import, or where they
    disagree."""
    if x.device.type != "cuda":
        return None
    heads = (w.num_v_heads, w.head_k_dim, w.head_v_dim)
    return fla.kernels(x.device, x.dtype, heads, chunk_gated_delta, recurrent_gated_delta_step)


def project_inputs(
    x: torch.Tensor, w: GdnWeights
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, H] -> qkv [T, C] (pre-conv), z [T, Hv·dv], beta [T, Hv] and log decay g (fp32)."""
    qkv, z, b, a = torch.split(w.in_proj(x), list(w.in_splits), dim=-1)
    beta = torch.sigmoid(b).float()
    g = w.neg_a * F.softplus(a.float() + w.dt_bias)
    return qkv, z, beta, g


def split_heads(
    mixed: torch.Tensor, w: GdnWeights
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Post-conv channels [T, C] -> q (l2-normed, scaled), k (l2-normed) [T, Hv, dk], v [T, Hv, dv]."""
    kd = w.num_k_heads * w.head_k_dim
    rep = w.num_v_heads // w.num_k_heads
    q, k, v = torch.split(mixed, [kd, kd, mixed.shape[-1] - 2 * kd], dim=-1)
    q = l2norm(q.reshape(-1, w.num_k_heads, w.head_k_dim)).repeat_interleave(rep, dim=1)
    k = l2norm(k.reshape(-1, w.num_k_heads, w.head_k_dim)).repeat_interleave(rep, dim=1)
    q = q * w.head_k_dim**-0.5
    v = v.reshape(-1, w.num_v_heads, w.head_v_dim)
    return q, k, v


def gated_output(
    core: torch.Tensor, z: torch.Tensor, w: GdnWeights, dtype: torch.dtype
) -> torch.Tensor:
    """Delta-rule output [T, Hv, dv] -> gated-normed, projected [T, H]."""
    zz = z.reshape(-1, w.num_v_heads, w.head_v_dim)
    o = rms_norm_gated(core.to(dtype), zz, w.norm, w.eps)
    return w.out_proj(o.reshape(core.shape[0], w.num_v_heads * w.head_v_dim))


def fused_core(
    k: native.NativeKernels,
    proj: torch.Tensor,
    w: GdnWeights,
    seqs: torch.Tensor,
    conv_state: torch.Tensor,
    rec_state: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The in-projection's rows [T, P] -> the gated-normed core output fp32 [T, Hv·dv]
    (``tt_gdn``: conv, norms, gates, the delta rule token by token, the output norm). The
    recurrent form over every token: about 1 us per token and layer on the demo model against
    9-11 for the chunked scan's small torch ops, and a state carried bit for bit across any
    chunking of a prompt."""
    return k.gdn(
        proj.float(),
        seqs,
        conv_state,
        w.conv.T.contiguous(),
        rec_state,
        (w.neg_a, w.dt_bias, w.norm.float()),
        (w.num_k_heads, w.num_v_heads, w.head_k_dim, w.head_v_dim),
        w.eps,
        dtype == torch.bfloat16,
    )


@functools.cache
def fused_kernels() -> native.NativeKernels | None:
    """native_layers.c's kernels for ``fused_core``, once they agree with the torch kernels on a small
    layer (a span, a cut of it and a decode row, in fp32); None (logged) where they do not or
    are not compiled."""
    k = native.kernels()
    if k is None:
        return None
    w = GdnWeights.random(64, (1, 2, 64, 64), seed=1)
    x = torch.randn(12, 64, generator=torch.Generator().manual_seed(2))
    rows = (_row(0, 7, 0, 0), _row(1, 4, 1, 7), _row(2, 1, 2, 0))
    plan = StepPlan.build(StepBatch(rows), 64, x.device)
    assert plan.seqs is not None
    outs = []
    for fuse in (True, False):
        conv, rec = torch.zeros(3, 256, 3), torch.zeros(3, 2, 64, 64)
        conv[2], rec[2] = 0.5, 0.01
        if fuse:
            o = w.out_proj(fused_core(k, w.in_proj(x), w, plan.seqs, conv, rec, x.dtype))
        else:
            o = gdn_forward(x, w, plan, conv, rec, fused=False)
        outs.append((o, conv, rec))
    (a, ca, ra), (b, cb, rb) = outs
    close = all(torch.allclose(p, q, rtol=1e-4, atol=1e-5) for p, q in ((a, b), (ca, cb), (ra, rb)))
    if not close:
        log.warning("the fused GDN kernel disagrees with the torch kernels: not used")
        return None
    return k


def _row(seq: int, n: int, slot: int, start: int) -> StepRow:
    return StepRow(seq, tuple(range(n)), start, tuple(range(4)), slot, sample=False)


def causal_conv(
    history: torch.Tensor, xs: torch.Tensor, conv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The depthwise causal conv of a prefill chunk, token-major (no transposed copies).

    history [C, K-1] (the row's last K-1 inputs), xs [n, C], conv [C, K] ->
    (silu(conv) [n, C] fp32, the new history [C, K-1]). Tap by tap, ``out += x[t+j] * w[:, j]``
    in ascending j: the order ``F.conv1d`` sums in on the CPU (bitwise equal, tested), at about
    half its time with the two transposes it needs."""
    n, taps = xs.shape[0], conv.shape[1]
    full = torch.cat([history.T, xs.float()])  # [K-1+n, C]
    out = full[:n] * conv[:, 0]
    for j in range(1, taps):
        out.addcmul_(full[j : j + n], conv[:, j])
    return F.silu(out), full[n:].T


def gdn_forward(
    x: torch.Tensor,
    w: GdnWeights,
    plan: StepPlan,
    conv_state: torch.Tensor,
    rec_state: torch.Tensor,
    keep: Sequence[int] | None = None,
    *,
    fused: bool = True,
) -> torch.Tensor:
    """x [T, H] (normed) -> [T, H], or [len(keep), H] of the tokens at batch offsets ``keep``
    (every token still updates the state); reads and updates conv_state [S, C, K-1],
    rec_state [S, Hv, dk, dv].

    On the CPU, where the C kernels are compiled (and ``fused``), everything between the two
    projections is one C call for all the step's rows (``fused_core``); elsewhere the torch
    kernels below."""
    if fused and plan.seqs is not None and x.device.type == "cpu":
        nk = fused_kernels()
        if nk is not None:
            o = fused_core(nk, w.in_proj(x), w, plan.seqs, conv_state, rec_state, x.dtype)
            if keep is not None:
                o = o[as_index(keep, x.device)]
            return w.out_proj(o.to(x.dtype))
    qkv, z, beta, g = project_inputs(x, w)
    mixed = torch.empty(qkv.shape, dtype=torch.float32, device=x.device)
    for sp in plan.spans:
        r = slice(sp.offset, sp.offset + sp.n)
        mixed[r], conv_state[sp.slot] = causal_conv(conv_state[sp.slot], qkv[r], w.conv)
    if plan.num_decode:
        slots = plan.dec_slots
        history = conv_state.index_select(0, slots)
        full = torch.cat([history, qkv[plan.dec_tokens].float()[..., None]], -1)
        conv_state.index_copy_(0, slots, full[..., 1:])
        mixed[plan.dec_tokens] = F.silu((full * w.conv).sum(-1))

    q, k, v = split_heads(mixed, w)
    core = torch.empty_like(v)
    f = fla_kernels(x, w)
    chunk = chunk_gated_delta if f is None else f.chunk
    step = recurrent_gated_delta_step if f is None else f.recurrent
    for sp in plan.spans:
        r = slice(sp.offset, sp.offset + sp.n)
        core[r], rec_state[sp.slot] = chunk(q[r], k[r], v[r], g[r], beta[r], rec_state[sp.slot])
    if plan.num_decode:
        d, slots = plan.dec_tokens, plan.dec_slots
        core[d], state = step(q[d], k[d], v[d], g[d], beta[d], rec_state.index_select(0, slots))
        rec_state.index_copy_(0, slots, state)

    if keep is not None:
        rows = as_index(keep, x.device)
        core, z = core[rows], z[rows]
    return gated_output(core, z, w, x.dtype)
