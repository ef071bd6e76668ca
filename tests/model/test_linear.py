"""The torch backend's projection kernel (``ref/layers.py`` ``Linear``): native.c's AVX2 kernel
or oneDNN's packed GEMM on the CPU, ``F.linear`` elsewhere; same products up to the summation
order, and on either CPU kernel a row's result does not depend on how many rows share the call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tt_serve.model.kernels import native
from tt_serve.model.ref.layers import Linear, fused, packs

needs_packing = pytest.mark.skipif(
    not packs(torch.empty(1, 1)), reason="this torch has no oneDNN packed linear on the CPU"
)


def _weights(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, inp, generator=torch.Generator().manual_seed(seed)) * inp**-0.5


@pytest.fixture(params=["onednn", "native"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each CPU fp32 kernel ``Linear`` can run (``TT_SERVE_LINEAR``), where it can run here."""
    if request.param == "onednn" and not packs(torch.empty(1, 1)):
        pytest.skip("this torch has no oneDNN packed linear on the CPU")
    if request.param == "native":
        k = native.kernels()
        if k is None or not k.linear_compiled:
            pytest.skip("the projection kernel needs a C compiler and an AVX2 + FMA CPU")
    monkeypatch.setenv("TT_SERVE_LINEAR", request.param)
    return str(request.param)


@pytest.mark.parametrize("shape", [(784, 256), (256, 512), (16, 256), (248320 // 32, 256)])
def test_packed_equals_f_linear_up_to_summation_order(kernel: str, shape: tuple[int, int]) -> None:
    w = _weights(*shape)
    lin = Linear(w)
    assert lin.kernel == kernel and lin.weight is None  # the plain copy is not kept
    for rows in (37, 1, 6, 7, 300):  # decode rows, one micro-kernel's, k- and row-blocked
        x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(lin(x), F.linear(x, w), rtol=1e-5, atol=1e-5)
    # leading dims are kept, like F.linear
    x3 = torch.randn(2, 5, shape[1])
    assert lin(x3).shape == (2, 5, shape[0])
    assert lin(torch.empty(0, shape[1])).shape == (0, shape[0])


def test_a_row_gives_the_same_bits_alone_and_in_any_batch(kernel: str) -> None:
    w = _weights(768, 600)  # more than one k-block of the native kernel
    lin = Linear(w)
    assert lin.kernel == kernel
    x = torch.randn(256, 600, generator=torch.Generator().manual_seed(2))
    full = lin(x)
    for rows in (1, 2, 5, 6, 7, 8, 31, 32, 97, 100):
        assert torch.equal(lin(x[:rows]), full[:rows]), rows
    assert torch.equal(lin(x[5:6]), full[5:6])  # a row in the middle of the batch, alone
    assert torch.equal(lin(x[200:203]), full[200:203])  # and a few from the last row block


def test_linear_kernel_choice_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TT_SERVE_LINEAR", "mkl")
    with pytest.raises(ValueError, match="TT_SERVE_LINEAR"):
        Linear(_weights(16, 8))
    monkeypatch.setenv("TT_SERVE_LINEAR", "native")
    assert Linear(_weights(24, 8)).kernel != "native"  # 24 outputs: not 16-blocked
    assert Linear(_weights(16, 8).bfloat16()).kernel != "native"  # fp32 only


@needs_packing
def test_bf16_weights_pack_and_stay_close() -> None:
    w = _weights(512, 256)
    lin = Linear(w.bfloat16())
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    got = lin(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x, w.bfloat16()).float(), rtol=2e-2, atol=2e-2)


def test_fused_projection_splits_into_the_separate_ones() -> None:
    parts = [_weights(n, 256, seed=n) for n in (512, 256, 4, 4)]
    lin, splits = fused(*parts)
    assert splits == (512, 256, 4, 4)
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(4))
    for got, w in zip(torch.split(lin(x), list(splits), dim=-1), parts, strict=True):
        torch.testing.assert_close(got, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_plain_kernel_off_the_cpu_packing_rules() -> None:
    """Integer or float64 weights (and any non-CPU device) take F.linear unchanged."""
    w = _weights(64, 32).double()
    lin = Linear(w)
    assert lin.kernel == "torch" and lin.weight is w
    x = torch.randn(3, 32, dtype=torch.float64)
    assert torch.equal(lin(x), F.linear(x, w))
