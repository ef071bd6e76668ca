"""The number formats a Tenstorrent card stores, as torch round trips: float32 in, the value the
card would hold out (still float32), so a CPU run can carry the card's storage rounding.

* ``bfloat16``: round to nearest, ties to even, as ``torch.Tensor.to(torch.bfloat16)`` does.
  ttnn 0.81.1 gets there the same way: ``ttnn.from_torch`` hands a float32 tensor to the host
  conversion, which rounds to nearest even (checked against the wheel in
  ``tests/tt_host/test_formats_host.py``), and the golden function of ``ttnn.typecast``
  (``ttnn/ttnn/operations/core.py``) is ``tensor.to(torch.bfloat16)``.
* ``bfloat8_b`` / ``bfloat4_b``: tt-metal's block floats. A TILE tensor is 32x32 tiles of four
  16x16 faces; each face row (16 consecutive values of one row, aligned to 16 columns) shares one
  8-bit exponent, the largest biased float32 exponent in the row. Each value keeps a sign and a
  7-bit (bfloat8_b) or 3-bit (bfloat4_b) magnitude that includes the hidden one: its 24-bit
  significand is shifted right (truncating) by the distance to the shared exponent, then rounded
  to nearest, ties to even, to the kept width and clamped at the largest magnitude (no carry into
  the exponent). float32 subnormals (exponent field 0) are stored as zero, and a zero magnitude
  drops the sign: both measured on the ttnn 0.81.1 wheel, whose packer flushes subnormal inputs
  (the source read flushes only exact zeros; the wheel is what runs, so the wheel wins). This is the definition of tt-metal's host
  packer (``tt_metal/impl/data_format/blockfloat_common.cpp``, ``convert_u32_to_bfp`` without
  truncation, ``is_exp_a=false`` for the ``_b`` formats, and ``convert_bfp_to_u32`` to read back),
  written here from that definition; the tests compare it bit for bit with the wheel's own
  ``from_torch`` / ``to_torch``.

Padding: a tensor whose last dim is not a multiple of 16 is padded with zeros, as ttnn pads TILE
tensors; zeros never raise a row's shared exponent, so the padded values do not matter.

What this module does not model: math fidelity (LoFi/HiFi2 multiply with fewer mantissa bits of
each operand) and bf16 accumulation in the FPU's destination registers; see ``README``
"Precision profiles".
"""

from __future__ import annotations

import torch

FORMATS = ("float32", "bfloat16", "bfloat8_b", "bfloat4_b")
BLOCK = 16  # values sharing one exponent: one row of a 16x16 face
# magnitude bits kept per value, the hidden one included
MANTISSA_BITS = {"bfloat8_b": 7, "bfloat4_b": 3}
# 16-value rows rounded at once: bounds the int64 temporaries to a few MB each
_CHUNK = 1 << 16


def round_to(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """``t`` (any float dtype) as the card stores it in ``dtype``, returned as float32.
    Block floats group the last dim (the TILE row); integer dtypes are not handled here."""
    x = t.detach().to(torch.float32)
    if dtype == "float32":
        return x
    if dtype == "bfloat16":
        return x.to(torch.bfloat16).to(torch.float32)
    if dtype in MANTISSA_BITS:
        return block_float(x, MANTISSA_BITS[dtype])
    raise ValueError(f"no storage format {dtype!r}; choose one of {FORMATS}")


def is_representable(t: torch.Tensor, dtype: str) -> bool:
    """Whether every value of ``t`` (laid out as a TILE tensor with this shape) survives storage
    in ``dtype`` unchanged: a tensor that claims ``dtype`` but holds values it cannot (e.g. a
    bfloat8_b weight left in float32) gives False. NaNs compare by bit pattern."""
    x = t.detach().to(torch.float32)
    return bool(torch.equal(round_to(x, dtype).view(torch.int32), x.view(torch.int32)))


def block_float(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The block-float round trip of float32 ``x`` with ``bits`` magnitude bits per value."""
    shape = x.shape
    width = shape[-1] if x.dim() else 1
    flat = x.reshape(-1, width)
    pad = -width % BLOCK
    if pad:
        flat = torch.nn.functional.pad(flat, (0, pad))
    rows = flat.reshape(-1, BLOCK)
    out = torch.empty_like(rows)
    for s in range(0, rows.shape[0], _CHUNK):
        out[s : s + _CHUNK] = _round_blocks_fast(rows[s : s + _CHUNK], bits)
    return out.reshape(flat.shape)[:, :width].reshape(shape)


def encode_blocks(rows: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[n, 16] float32 -> what the packer stores of each row: (negative [n, 16] bool, magnitude
    [n, 16] float64 holding integers 0 .. 2^bits - 1, shared exponent [n, 1] int64, the largest
    biased float32 exponent of the row). Computed in float64 arithmetic: with the value scaled
    to units of the row's last kept bit (exact: a power-of-two scale), flooring at
    2^-(24 - bits) is the packer's truncating alignment to its 24-bit register and
    ``torch.round`` its ties-to-even. A value reads back as magnitude x 2^(shared - 127 -
    (bits - 1)) with its sign, except in rows whose shared exponent is below ``bits``
    (``_decode`` wraps their exponent, as the packer's uint32 arithmetic does)."""
    exp = (rows.contiguous().view(torch.int32) >> 23) & 0xFF
    shared = exp.amax(dim=1, keepdim=True).to(torch.int64)
    x = rows.to(torch.float64)
    unit = torch.exp2((shared - 127 - bits + 1).to(torch.float64))  # [n, 1]: the kept last bit
    q = torch.floor(x.abs() / unit * 2.0 ** (24 - bits))
    m = torch.round(q * 2.0 ** (bits - 24))
    m = m.clamp_(max=(1 << bits) - 1).masked_fill_(exp == 0, 0.0)
    return x < 0, m, shared


def _round_blocks_fast(rows: torch.Tensor, bits: int) -> torch.Tensor:
    """``_round_blocks`` through ``encode_blocks``, ~4x fewer passes; the few rows whose shared
    exponent is below ``bits`` go through the integer path."""
    negative, m, shared = encode_blocks(rows, bits)
    unit = torch.exp2((shared - 127 - bits + 1).to(torch.float64))
    out = torch.where(negative, -(m * unit), m * unit)
    out = out.masked_fill(m == 0, 0.0).to(torch.float32)
    low = (shared < bits).squeeze(1)
    if bool(low.any()):
        out[low] = _round_blocks(rows[low], bits)
    return out


def _round_blocks(rows: torch.Tensor, bits: int) -> torch.Tensor:
    """[n, 16] float32 -> [n, 16] float32: encode each row with one shared exponent, decode."""
    u = rows.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exp = (u >> 23) & 0xFF
    shared = exp.amax(dim=1, keepdim=True)
    sign = u >> 31
    mant = (u & 0x7FFFFF) | (1 << 23)
    mant = mant >> (shared - exp).clamp(max=31)  # >= 24 leaves 0 either way
    shift = 24 - bits
    rest = mant & ((1 << shift) - 1)
    mant = mant >> shift
    tie = 1 << (shift - 1)
    up = (rest > tie) | ((rest == tie) & (mant & 1 == 1))
    mant = (mant + up.to(torch.int64)).clamp(max=(1 << bits) - 1)
    mant = torch.where(exp == 0, torch.zeros_like(mant), mant)  # zeros and subnormals: 0
    return _decode(sign, mant, shared, bits)


def _decode(
    sign: torch.Tensor, mant: torch.Tensor, shared: torch.Tensor, bits: int
) -> torch.Tensor:
    """The float32 a (sign, magnitude, shared exponent) triple reads back as: the magnitude is
    normalised to a leading one, the exponent lowered by the shift (wrapping as the packer's
    uint32 arithmetic does when the shared exponent is too small), the hidden bit dropped."""
    # index of the highest set bit of mant (exact: mant < 2^bits is a small float32 integer)
    lead = torch.frexp(mant.to(torch.float32)).exponent.to(torch.int64) - 1
    shift = (bits - 1) - lead
    frac = (mant << (shift + 1)) & ((1 << bits) - 1)
    e = shared - shift
    word = (sign << 31) | ((e << 23) & 0xFFFFFFFF) | (frac << (23 - bits))
    word = torch.where(mant == 0, torch.zeros_like(word), word)
    word = torch.where(word >= 1 << 31, word - (1 << 32), word)
    return word.to(torch.int32).view(torch.float32)
