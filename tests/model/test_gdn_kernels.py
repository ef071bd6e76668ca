"""Our GDN chunked/recurrent kernels against HF's torch reference functions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from tests import numerics as nm
from tt_serve.model.ref.gdn import causal_conv, chunk_gated_delta, recurrent_gated_delta_step
from tt_serve.model.ref.layers import l2norm


def _inputs(t: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hk, hv, dk, dv = 2, 4, 32, 16
    q, k = torch.randn(1, t, hk, dk, generator=g), torch.randn(1, t, hk, dk, generator=g)
    v = torch.randn(1, t, hv, dv, generator=g)
    gate = -torch.rand(1, t, hv, generator=g)
    beta = torch.rand(1, t, hv, generator=g)
    s0 = torch.randn(1, hv, dk, dv, generator=g) * 0.1
    return q, k, v, gate, beta, s0


def _ours(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rep = 2
    qq = l2norm(q[0]).repeat_interleave(rep, dim=1) * q.shape[-1] ** -0.5
    return qq, l2norm(k[0]).repeat_interleave(rep, dim=1)


@pytest.mark.parametrize("t", [1, 37, 64, 200])
def test_chunk_matches_hf(t: int) -> None:
    q, k, v, g, beta, s0 = _inputs(t, seed=t)
    ref, ref_s = torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    qq, kk = _ours(q, k)
    out, s = chunk_gated_delta(qq, kk, v[0], g[0], beta[0], s0[0])
    # Same math, possibly another rounding order: the longest chain accumulates dk products per
    # token over t tokens (numerics.py). Measured 0 here; re-chunking at 32 stays within it, while
    # a 1% error in the decay or beta moves outputs by 1e-4..2e-3 (over 100x the bound).
    n = t * q.shape[-1]
    assert (out - ref[0]).abs().max().item() <= nm.reorder_bound(ref.abs().max().item(), n)
    assert (s - ref_s[0]).abs().max().item() <= nm.reorder_bound(ref_s.abs().max().item(), n)


def test_recurrent_step_matches_hf() -> None:
    q, k, v, g, beta, s0 = _inputs(1, seed=3)
    ref, ref_s = torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    qq, kk = _ours(q, k)
    out, s = recurrent_gated_delta_step(qq, kk, v[0], g[0], beta[0], s0)
    # One token: chains of dk products (numerics.py). Measured 3.7e-9 (1 ulp) and 0 here.
    n = q.shape[-1]
    assert (out[0] - ref[0, 0]).abs().max().item() <= nm.reorder_bound(ref.abs().max().item(), n)
    assert (s - ref_s).abs().max().item() <= nm.reorder_bound(ref_s.abs().max().item(), n)


@pytest.mark.parametrize("n", [1, 3, 64, 256, 301])
@pytest.mark.parametrize("tap_major", [False, True])
def test_causal_conv_is_bitwise_the_depthwise_conv1d(n: int, tap_major: bool) -> None:
    """Token-major taps give exactly F.conv1d's numbers (the order it sums in), and the new
    history is the last K-1 inputs, whatever the weight's strides."""
    g = torch.Generator().manual_seed(n)
    c, k = 96, 4
    xs, history = torch.randn(n, c, generator=g), torch.randn(c, k - 1, generator=g)
    conv = torch.randn(c, k, generator=g)
    full = torch.cat([history, xs.T], dim=-1)
    want = F.silu(F.conv1d(full[None], conv[:, None, :], groups=c)[0]).T
    weight = conv.T.contiguous().T if tap_major else conv
    out, new_history = causal_conv(history, xs, weight)
    assert torch.equal(out, want)
    assert torch.equal(new_history, full[:, -(k - 1) :])
