"""Weights held as a Tenstorrent card holds them in bfloat8_b / bfloat4_b, for the CPU's
block-float projection kernel (``kernels/native.c`` ``tt_bfp_linear``).

The card stores a projection transposed, [in, out] TILE, so one shared exponent covers 16
consecutive *outputs* at one input position k (a face row). ``pack`` keeps exactly that: for
each panel of 16 outputs and each k, the 16 values' codes as the card's packer writes them
(``formats.encode_blocks``: sign | magnitude, 8 bits for bfloat8_b, 4 for bfloat4_b) and their
shared exponent byte. Only the arrangement differs from a card's buffer (panel by panel instead
of tile by tile); the bytes per weight are the card's, 1.0625 (bfloat8_b) and 0.5625
(bfloat4_b). No fp32 copy is kept.

``unpack`` reads the codes back; it equals ``formats.round_to`` of the weight's transpose bit
for bit (tests/model/test_blockfloat.py), which is the card's own round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tt_serve.model.formats import BLOCK, MANTISSA_BITS, encode_blocks

BLOCK_FLOATS = tuple(MANTISSA_BITS)
# Panels encoded at once: bounds the float64 temporaries to a few MB.
_VALUES_PER_CHUNK = 1 << 20


@dataclass(frozen=True)
class BlockFloatWeight:
    """A [out, in] weight in ``dtype``: ``codes`` [out / 16, in, 16] (bfloat8_b) or
    [out / 16, in, 8] (bfloat4_b, byte j holding output j in its low nibble and j + 8 in its
    high one), ``exps`` [out / 16, in]; ``out`` counts the zero rows padding it to 16."""

    dtype: str
    codes: torch.Tensor
    exps: torch.Tensor
    out_features: int  # before padding
    in_features: int

    @property
    def bits(self) -> int:
        return MANTISSA_BITS[self.dtype]

    @property
    def padded_out(self) -> int:
        return int(self.exps.shape[0]) * BLOCK

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + self.exps.numel()


def pack(weight: torch.Tensor, dtype: str) -> BlockFloatWeight:
    """fp32 (or any float) [out, in] -> its card codes in ``dtype``; ``out`` is padded with zero
    rows to a multiple of 16 (zeros never raise a shared exponent). Raises ValueError for a
    block whose shared exponent is below the magnitude width (all its values under 2^-120),
    which the card's packer reads back wrapped."""
    if dtype not in MANTISSA_BITS:
        raise ValueError(f"no block float {dtype!r}; choose one of {BLOCK_FLOATS}")
    if weight.dim() != 2:
        raise ValueError(f"pack takes a [out, in] weight, got shape {tuple(weight.shape)}")
    bits = MANTISSA_BITS[dtype]
    out, inp = (int(d) for d in weight.shape)
    w = weight.detach().to(device="cpu", dtype=torch.float32)
    pad = -out % BLOCK
    if pad:
        w = torch.cat([w, w.new_zeros(pad, inp)])
    panels = w.shape[0] // BLOCK
    codes = torch.empty(panels, inp, BLOCK, dtype=torch.uint8)
    exps = torch.empty(panels, inp, dtype=torch.uint8)
    step = max(1, _VALUES_PER_CHUNK // (inp * BLOCK))
    for p0 in range(0, panels, step):
        p1 = min(panels, p0 + step)
        # [p, 16, in] -> [p, in, 16]: one row per (panel, k), the 16 outputs along it
        rows = w[p0 * BLOCK : p1 * BLOCK].view(p1 - p0, BLOCK, inp).transpose(1, 2)
        negative, magnitude, shared = encode_blocks(rows.reshape(-1, BLOCK), bits)
        if bool(((shared < bits) & (magnitude > 0).any(dim=1, keepdim=True)).any()):
            raise ValueError(
                f"a block of 16 weights is entirely below 2^-120, which {dtype} cannot hold"
            )
        mag = magnitude.to(torch.uint8)
        sign = (negative & (mag > 0)).to(torch.uint8) << bits
        codes[p0:p1] = (sign | mag).view(p1 - p0, inp, BLOCK)
        exps[p0:p1] = shared.view(p1 - p0, inp).to(torch.uint8)
    if bits == 3:
        codes = codes[..., :8] | (codes[..., 8:] << 4)
    return BlockFloatWeight(dtype, codes.contiguous(), exps.contiguous(), out, inp)


def unpack(bw: BlockFloatWeight) -> torch.Tensor:
    """The fp32 [out, in] weight the codes read back as (the padding rows dropped)."""
    bits = bw.bits
    codes = bw.codes.to(torch.int32)
    if bits == 3:
        codes = torch.cat([codes & 0x0F, codes >> 4], dim=-1)
    magnitude = (codes & ((1 << bits) - 1)).to(torch.float32)
    negative = (codes >> bits) & 1 == 1
    e = bw.exps.to(torch.int64)
    unit = torch.where(e == 0, 0.0, torch.exp2((e - 127 - bits + 1).to(torch.float64))).to(
        torch.float32
    )
    values = magnitude * unit[..., None]
    values = torch.where(negative, -values, values)
    # [panels, in, 16] -> [out, in]
    full = values.transpose(1, 2).reshape(bw.padded_out, bw.in_features)
    return full[: bw.out_features].contiguous()
