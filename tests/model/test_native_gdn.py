"""The fused GDN layer (``tt_gdn`` in kernels/native_layers.c, ``gdn.fused_core``) against the
torch kernels of gdn.py (which test_gdn_kernels checks against HF's): outputs and states to
rounding order, the conv history bit for bit, the same bits whatever the cut of a prompt into
chunks (what warm == cold rests on), and a step whose rows point outside the state pools writes
nothing."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tests import numerics as nm
from tt_serve.model.interface import StepBatch, StepRow
from tt_serve.model.kernels import native
from tt_serve.model.ref.gdn import GdnWeights, fused_core, fused_kernels, gdn_forward
from tt_serve.model.ref.plan import StepPlan

HIDDEN = 96
SLOTS = 6


def _kernels() -> native.NativeKernels:
    k = fused_kernels()
    if k is None:
        pytest.skip("the fused GDN kernel needs a C compiler")
    return k


def _row(seq: int, n: int, slot: int, start: int = 0) -> StepRow:
    return StepRow(seq, tuple(range(n)), start, tuple(range(64)), slot, sample=False)


def _states(heads: tuple[int, int, int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    hk, hv, dk, dv = heads
    g = torch.Generator().manual_seed(seed)
    conv = torch.randn(SLOTS, 2 * hk * dk + hv * dv, 3, generator=g)
    rec = torch.randn(SLOTS, hv, dk, dv, generator=g) * 0.05
    return conv, rec


def _run(
    w: GdnWeights, rows: tuple[StepRow, ...], x: torch.Tensor, fuse: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    heads = (w.num_k_heads, w.num_v_heads, w.head_k_dim, w.head_v_dim)
    conv, rec = _states(heads, seed)
    plan = StepPlan.build(StepBatch(rows), 8, x.device)
    return gdn_forward(x, w, plan, conv, rec, fused=fuse), conv, rec


STEPS = {
    "decode": (_row(0, 1, 2), _row(1, 1, 0), _row(2, 1, 5)),
    "span": (_row(0, 64, 1),),
    "mixed": (_row(0, 200, 3), _row(1, 1, 0), _row(2, 1, 5), _row(3, 37, 4)),
}


@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize(
    "heads",
    [(2, 4, 64, 64), (1, 2, 128, 128), (2, 2, 32, 48)],  # demo; Qwen3.5's head dims; generic C
    ids=["demo", "d128", "generic"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layer_is_the_torch_layer(
    step: str, heads: tuple[int, int, int, int], dtype: torch.dtype
) -> None:
    _kernels()
    w = GdnWeights.random(HIDDEN, heads, dtype, seed=len(step))
    rows = STEPS[step]
    t = sum(len(r.token_ids) for r in rows)
    x = torch.randn(t, HIDDEN, generator=torch.Generator().manual_seed(t)).to(dtype)
    (a, conv_a, rec_a), (b, conv_b, rec_b) = (_run(w, rows, x, f, seed=t) for f in (True, False))
    # The conv history is a copy of inputs: bit for bit.
    assert torch.equal(conv_a, conv_b)
    # The recurrence against the chunked scan: chains of dk products per token over the longest
    # row, plus the output projection's width (numerics.py).
    longest = max(len(r.token_ids) for r in rows)
    n = longest * heads[2] + heads[1] * heads[3]
    assert (rec_a - rec_b).abs().max() <= nm.reorder_bound(rec_b.abs().max().item(), n)
    scale = b.float().abs().max().item()
    if dtype == torch.float32:
        assert (a - b).abs().max() <= nm.reorder_bound(scale, n)
    else:  # a bf16 rounding may land on either side: one bf16 ulp of the largest value
        assert (a.float() - b.float()).abs().max() <= 2.0 ** (math.floor(math.log2(scale)) - 7)


@pytest.mark.parametrize("cuts", [(64, 128, 192), (1, 2, 3, 100), (37, 38, 250)])
def test_any_cut_of_a_prompt_gives_the_same_bits(cuts: tuple[int, ...]) -> None:
    """A prefix-cache hit resumes from the state a cold run saved at a chunk boundary: the
    token-by-token recurrence makes the result independent of where the prompt was cut."""
    k = _kernels()
    w = GdnWeights.random(HIDDEN, (2, 4, 64, 64), seed=3)
    t = 300
    proj = w.in_proj(torch.randn(t, HIDDEN, generator=torch.Generator().manual_seed(4)))
    results = []
    for bounds in ((0, t), (0, *cuts, t)):
        conv, rec = _states((2, 4, 64, 64), seed=5)
        parts = []
        for lo, hi in itertools.pairwise(bounds):
            seqs = torch.tensor([[0], [hi - lo], [2]])
            parts.append(fused_core(k, proj[lo:hi], w, seqs, conv, rec, torch.float32))
        results.append((torch.cat(parts), conv, rec))
    (a, conv_a, rec_a), (b, conv_b, rec_b) = results
    assert torch.equal(a, b) and torch.equal(conv_a, conv_b) and torch.equal(rec_a, rec_b)


@pytest.mark.parametrize(
    "seqs",
    [[[0], [5], [SLOTS]], [[0], [5], [-1]], [[3], [5], [0]], [[0], [0], [0]], [[-1], [2], [0]]],
    ids=["slot-past-pool", "negative-slot", "rows-past-step", "empty", "negative-offset"],
)
def test_a_step_outside_its_rows_or_slots_writes_nothing(seqs: list[list[int]]) -> None:
    k = _kernels()
    w = GdnWeights.random(HIDDEN, (2, 4, 64, 64), seed=6)
    proj = w.in_proj(torch.randn(6, HIDDEN))
    conv, rec = _states((2, 4, 64, 64), seed=7)
    before = conv.clone(), rec.clone()
    with pytest.raises(ValueError, match="outside"):
        fused_core(k, proj, w, torch.tensor(seqs), conv, rec, torch.float32)
    assert torch.equal(conv, before[0]) and torch.equal(rec, before[1])


def test_a_non_finite_input_stays_non_finite() -> None:
    """The LM head sends a non-finite hidden state to the full head: the kernel's exp must not
    turn a NaN into a number."""
    k = _kernels()
    w = GdnWeights.random(HIDDEN, (2, 4, 64, 64), seed=8)
    proj = w.in_proj(torch.randn(3, HIDDEN))
    proj[1, 0] = float("nan")
    conv, rec = _states((2, 4, 64, 64), seed=9)
    out = fused_core(
        k, proj, w, torch.tensor([[0, 1, 2], [1, 1, 1], [0, 1, 2]]), conv, rec, torch.float32
    )
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[2]).all()
    assert torch.isnan(out[1]).any()
