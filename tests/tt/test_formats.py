"""``tt_serve/model/formats.py`` in the main venv: hand-computed block-float values, padding,
idempotence and ``is_representable``. (Bit equality with tt-metal's own packer is
``tests/tt_host/test_formats_host.py``, in the ttnn venv.)"""

from __future__ import annotations

import pytest
import torch

from tt_serve.model.formats import block_float, is_representable, round_to


def _row(values: list[float]) -> torch.Tensor:
    return torch.tensor([values + [0.0] * (16 - len(values))])


def test_bfloat8_b_rounds_to_nearest_even_on_the_shared_exponent_and_clamps() -> None:
    # The row's largest exponent is 1.0's, so magnitudes are multiples of 2^-6 up to 127 * 2^-6.
    x = _row([1.0, 2**-7, 3 * 2**-7, 1.999, -0.3, 1e-30])
    got = round_to(x, "bfloat8_b")[0, :6].tolist()
    # 2^-7 = 0.5 ulp: a tie to the even 0; 3 * 2^-7 = 1.5 ulp: a tie up to 2; 1.999 = 127.94 ulp
    # rounds to 128, clamped to 127 (no carry into the exponent); -0.3 = -19.2 ulp -> -19;
    # 1e-30 shifts out entirely and drops its sign.
    assert got == [1.0, 0.0, 2 * 2**-6, 127 * 2**-6, -19 * 2**-6, 0.0]


def test_bfloat4_b_keeps_three_bits() -> None:
    got = round_to(_row([1.0, 0.3, 1.9, -0.625]), "bfloat4_b")[0, :4].tolist()
    # multiples of 2^-2 up to 7 * 2^-2: 0.3 -> 1, 1.9 -> 7.6 -> 8 clamped to 7, -0.625 = -2.5
    # -> the even -2
    assert got == [1.0, 0.25, 1.75, -0.5]


def test_bfloat16_is_round_to_nearest_even() -> None:
    x = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20])
    assert round_to(x, "bfloat16").tolist() == [1.0, 1.0 + 2**-6, 1.0 + 2**-7]


def test_each_16_column_group_of_a_row_has_its_own_exponent() -> None:
    x = torch.full((2, 32), 2**-10)
    x[0, 0] = 1.0  # raises row 0, columns 0..15 only
    y = round_to(x, "bfloat4_b")
    assert y[0, 1:16].eq(0).all() and y[0, 16:].eq(2**-10).all() and y[1].eq(2**-10).all()


def test_unaligned_shapes_round_as_if_zero_padded() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 21, generator=g)
    padded = torch.nn.functional.pad(x, (0, 11))
    assert torch.equal(block_float(x, 7), block_float(padded, 7)[..., :21])


@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat8_b", "bfloat4_b"])
def test_rounding_is_idempotent_and_representability_follows(dtype: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 96, generator=g) * torch.exp(torch.randn(64, 96, generator=g) * 2)
    y = round_to(x, dtype)
    assert torch.equal(round_to(y, dtype), y)
    assert is_representable(y, dtype) and not is_representable(x, dtype)
    assert is_representable(x, "float32")


def test_a_bfloat16_value_is_not_a_bfloat8_b_one() -> None:
    """What the golden tier uses to catch a bfloat8_b weight left in a wider format: bf16 values
    of a weight row almost never all fit 7 bits on one shared exponent."""
    g = torch.Generator().manual_seed(2)
    w = round_to(torch.randn(32, 64, generator=g), "bfloat16")
    assert not is_representable(w, "bfloat8_b")
    assert is_representable(round_to(w, "bfloat8_b"), "bfloat16")  # 7 bits fit in bf16's 8


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="bfloat8"):
        round_to(torch.zeros(2), "float8")
