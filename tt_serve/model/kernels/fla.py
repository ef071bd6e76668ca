"""flash-linear-attention's gated delta rule kernels on CUDA (the optional ``cuda`` extra).

The field's GDN kernels (vLLM and SGLang run Qwen3.5's linear attention on them): the chunked
form for a prefill span and the fused recurrent form for decode rows, both from and to an fp32
state ``[Hv, dk, dv]`` (fla's ``[N, H, K, V]``, one per sequence). The callers pass what the
reference functions take (``ref/gdn.py``: q l2-normed and pre-scaled, k l2-normed, the log decay
g and beta per token and head), so fla runs with ``scale=1`` and no in-kernel normalisation; q,
k and v go in the layer's compute dtype (bfloat16 on a GPU) with g, beta and the state in fp32.

Used only on CUDA and only after a self-check at first use: fla's result on a small span and a
decode batch must agree with ``chunk_gated_delta`` / ``recurrent_gated_delta_step`` within the
bound its bfloat16 inputs allow (below); otherwise it is logged and the torch kernels run. Cold
and warm runs call the same kernel at the same cuts, so warm == cold holds as on the torch path.
``TT_SERVE_FLA=0`` turns it off.

A leaf like ``native.py``: it imports fla lazily and nothing from ``tt_serve.model``; the
reference functions it is checked against are passed in.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

# The pinned release (pyproject's ``cuda`` extra).
FLA_VERSION = "0.6.0"
# Agreement bound of the self-check, relative to the output's largest magnitude: q, k and v are
# rounded to bfloat16 (relative 2^-9 each) before a chunk's sums of products; over a 64-token
# chunk with decaying, unit-norm keys the rounding of the terms adds up to a few units of
# 2^-8 relative (the GPU first run measured 1e-3 absolute on outputs of magnitude ~0.3).
AGREEMENT = 2e-2

Step = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class FlaKernels:
    """fla's two entry points, called as ``chunk`` and ``recurrent`` below."""

    chunk_fn: Callable[..., Any]
    recurrent_fn: Callable[..., Any]
    dtype: torch.dtype  # what q, k and v are cast to

    def chunk(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence: q, k [T, Hv, dk], v [T, Hv, dv], g, beta [T, Hv], state [Hv, dk, dv]
        -> (out [T, Hv, dv] fp32, final state fp32)."""
        dt = self.dtype
        o, s = self.chunk_fn(
            q[None].to(dt),
            k[None].to(dt),
            v[None].to(dt),
            g[None].float(),
            beta[None].float(),
            scale=1.0,
            initial_state=state[None].float(),
            output_final_state=True,
        )
        return o[0].float(), s[0].float()

    def recurrent(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """B rows of one token: q, k [B, Hv, dk], v [B, Hv, dv], g, beta [B, Hv], state
        [B, Hv, dk, dv] -> (out [B, Hv, dv] fp32, new states)."""
        dt = self.dtype
        o, s = self.recurrent_fn(
            q[:, None].to(dt),
            k[:, None].to(dt),
            v[:, None].to(dt),
            g[:, None].float(),
            beta[:, None].float(),
            scale=1.0,
            initial_state=state.float(),
            output_final_state=True,
        )
        return o[:, 0].float(), s.float()


def _import() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    try:
        from fla.ops.gated_delta_rule import (  # type: ignore[import-not-found]
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except ImportError:
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def self_check(f: FlaKernels, chunk_ref: Step, step_ref: Step, device: torch.device) -> float:
    """The largest disagreement of ``f`` with the reference functions, relative to the
    reference output's magnitude, over a 100-token span (two chunks and a tail) from a nonzero
    state and a 3-row decode step."""
    gen = torch.Generator(device=device).manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    h, dk, dv, t = 4, 64, 64, 100
    unit = torch.nn.functional.normalize
    q, k = unit(rnd(t, h, dk), dim=-1) * dk**-0.5, unit(rnd(t, h, dk), dim=-1)
    v = rnd(t, h, dv)
    g = -torch.rand(t, h, generator=gen, device=device) * 0.5
    beta = torch.rand(t, h, generator=gen, device=device)
    state = rnd(h, dk, dv) * 0.1
    worst = 0.0
    for got, want in (
        (f.chunk(q, k, v, g, beta, state), chunk_ref(q, k, v, g, beta, state)),
        (
            f.recurrent(q[:3], k[:3], v[:3], g[:3], beta[:3], state.expand(3, h, dk, dv)),
            step_ref(q[:3], k[:3], v[:3], g[:3], beta[:3], state.expand(3, h, dk, dv).clone()),
        ),
    ):
        for a, b in zip(got, want, strict=True):
            scale = float(b.abs().max()) or 1.0
            worst = max(worst, float((a.float() - b.float()).abs().max()) / scale)
    return worst


@functools.cache
def kernels(
    device: torch.device, dtype: torch.dtype, chunk_ref: Step, step_ref: Step
) -> FlaKernels | None:
    """fla's kernels for ``device`` (CUDA only), once they pass the self-check; None where fla
    does not import, ``TT_SERVE_FLA=0``, or they disagree (logged)."""
    if device.type != "cuda" or os.environ.get("TT_SERVE_FLA", "1") == "0":
        return None
    fns = _import()
    if fns is None:
        return None
    f = FlaKernels(*fns, dtype=dtype)
    worst = self_check(f, chunk_ref, step_ref, device)
    if worst > AGREEMENT:
        log.warning(
            "flash-linear-attention's gated delta rule disagrees with the torch kernels "
            "(relative %.2g > %.2g): not used",
            worst,
            AGREEMENT,
        )
        return None
    log.info("GDN on flash-linear-attention's kernels (self-check: relative %.2g)", worst)
    return f
