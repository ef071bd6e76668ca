"""The tt backend on the virtual device with ``card_formats``: every stored value is what the card
would hold in its dtype, the ``mixed`` profile moves the logits off the float32 reference by far
more than fp32 reordering, and greedy still follows the reference wherever the reference's
top-2 margin is large against that error."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tests import numerics as nm
from tests.tt import harness as h
from tt_serve.model.formats import is_representable
from tt_serve.model.interface import Backend, StateCopy, StepBatch, StepRow
from tt_serve.model.tt.virtual.device import VirtualTTNN

DECODE = 24
# A flip needs the error of the runner-up minus the error of the winner to exceed the margin.
# Modelling the logit errors as independent with the standard deviation sigma measured at that
# position, that difference has standard deviation sqrt(2)*sigma; beyond 6 of those a flip has
# probability Phi(-6) ~ 1e-9 per position, so any flip there is a bug, not rounding.
SIGMAS = 6.0


def _logits(
    be: Backend, prompt: list[int], steps: int, follow: list[int] | None
) -> list[np.ndarray]:
    """Logits after the prompt and after each of ``steps - 1`` more tokens: ``follow``'s
    (teacher-forced) or, without it, each step's argmax (greedy)."""
    be.allocate(num_kv_blocks=16, block_size=h.BLOCK, num_state_slots=2, num_snapshot_slots=1)
    be.copy_states([StateCopy.reset(1)])
    tab = (1, 2, 3, 4)
    for s in range(0, len(prompt), h.CHUNK):
        last = s + h.CHUNK >= len(prompt)
        row = StepRow(1, tuple(prompt[s : s + h.CHUNK]), s, tab, 1, last, last)
        r = be.execute(StepBatch((row,)))
    out = [r.logits[0]]
    for k in range(steps - 1):
        t = int(np.argmax(out[-1])) if follow is None else follow[k]
        r = be.execute(StepBatch((StepRow(1, (t,), len(prompt) + k, tab, 1, True, True),)))
        out.append(r.logits[0])
    return out


def _stored_values_fit_their_dtypes(fake: VirtualTTNN) -> dict[str, list[bool]]:
    fits: dict[str, list[bool]] = {}
    for buf in fake._buffers:
        if buf.dtype is not None and buf.dtype.value in ("bfloat16", "bfloat8_b", "bfloat4_b"):
            fits.setdefault(buf.dtype.value, []).append(is_representable(buf.data, buf.dtype.value))
    return fits


def test_every_stored_value_fits_its_dtype_and_a_float32_store_is_caught(dense_dir: Path) -> None:
    """With card_formats each device buffer (weights, KV, activations, replays' writes) holds
    values of its dtype; without it the bfloat8_b weights are float32 values, which
    ``is_representable`` reports (what catches a bfloat8_b weight left in float32)."""
    prompt = h.prompt(150, 7)
    for formats in (True, False):
        fake = h.fake(card_formats=formats)
        be = h.tt_backend(dense_dir, fake, precision="bfp4-mlp")
        _logits(be, prompt, 4, None)
        fits = _stored_values_fit_their_dtypes(fake)
        assert {"bfloat16", "bfloat8_b", "bfloat4_b"} <= set(fits)
        if formats:
            assert all(all(v) for v in fits.values()), {k: v.count(False) for k, v in fits.items()}
        else:
            assert not any(fits["bfloat8_b"]) and not any(fits["bfloat4_b"])


def test_mixed_moves_logits_but_keeps_every_clear_greedy_choice(dense_dir: Path) -> None:
    prompt = h.prompt(180, 5)
    ref = _logits(h.torch_backend(dense_dir), prompt, DECODE + 1, None)
    follow = [int(np.argmax(z)) for z in ref]  # the reference's own greedy continuation
    got = _logits(h.tt_backend(dense_dir, h.fake(card_formats=True)), prompt, DECODE + 1, follow)
    assert len(got) == len(ref) == DECODE + 1
    dims = nm.model_dims(dense_dir)
    clear, moved = 0, 0.0
    for z_ref, z in zip(ref, got, strict=True):
        err = z.astype(np.float64) - z_ref
        moved = max(
            moved, float(np.abs(err).max()) / nm.logits_bound(float(np.abs(z_ref).max()), dims)
        )
        top2 = np.sort(z_ref)[-2:]
        if top2[1] - top2[0] > SIGMAS * math.sqrt(2) * float(err.std()):
            clear += 1
            assert int(np.argmax(z)) == int(np.argmax(z_ref))
    # The formats are on: the error is orders of magnitude past fp32 reordering (bfloat8_b keeps
    # 7 bits, ~2^-8 relative, against fp32's 2^-24 that the bound is built from).
    assert moved > 1e3, moved
    # Not vacuous: a good share of positions have a clear winner at this error (measured 12 of
    # 25; a badly wrong format would leave none).
    assert clear >= (DECODE + 1) // 4, clear
