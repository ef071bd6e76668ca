"""Block-float weights on the CPU (model/blockfloat.py, native.c ``tt_bfp_linear``): the packed
codes read back as the card's values, the kernel's sums are the fp32 kernel's on those values
bit for bit (so a flipped code bit or a wrong exponent shows), a row's bits do not depend on its
batch, and a precision profile on the torch backend keeps warm == cold."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tt_serve import LLM, SamplingParams
from tt_serve.model import blockfloat, formats
from tt_serve.model.kernels import native
from tt_serve.model.precision import PROFILES, Precision
from tt_serve.model.ref.layers import Linear, fused
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.table import checkpoint_dtypes

FORMATS = blockfloat.BLOCK_FLOATS
KERNELS = native.kernels()
needs_kernel = pytest.mark.skipif(
    KERNELS is None or not KERNELS.linear_compiled, reason="no AVX2 + FMA build of native.c"
)


def bfp(bw: blockfloat.BlockFloatWeight, x: torch.Tensor) -> torch.Tensor:
    assert KERNELS is not None
    return KERNELS.bfp_linear(bw.codes, bw.exps, bw.bits, x)


def weight(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    """Unit-scale weights with a wide spread of magnitudes per block, exact zeros, ties."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=g) * inp**-0.5
    w *= torch.exp2(torch.randint(-6, 3, (out, 1), generator=g).float())  # rows of other scales
    w[0, :5] = 0.0
    w[1, 3] = -0.0
    w[2, 2] = 2.0**-3 * (1 + 2**-7 + 2**-8)  # a tie below bfloat8_b's last kept bit
    return w


def card_values(w: torch.Tensor, dtype: str) -> torch.Tensor:
    """The card's round trip of a projection: it stores [in, out], blocks along out."""
    return formats.round_to(w.T.contiguous(), dtype).T.contiguous()


@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("shape", [(48, 300), (100, 64), (16, 17)])
def test_codes_read_back_as_the_cards_values(dtype: str, shape: tuple[int, int]) -> None:
    w = weight(*shape)
    bw = blockfloat.pack(w, dtype)
    got = blockfloat.unpack(bw)
    assert torch.equal(got.view(torch.int32), card_values(w, dtype).view(torch.int32))
    per_weight = bw.nbytes / (bw.padded_out * bw.in_features)
    assert per_weight == {"bfloat8_b": 1.0625, "bfloat4_b": 0.5625}[dtype]


@pytest.mark.parametrize("dtype", FORMATS)
def test_codes_are_sign_magnitude_with_the_shared_exponent(dtype: str) -> None:
    """Each code, read by hand: sign bit over the magnitude, the exponent byte the largest
    biased exponent of its 16 outputs at that k."""
    w = weight(32, 40, seed=3)
    bw = blockfloat.pack(w, dtype)
    bits = formats.MANTISSA_BITS[dtype]
    ref = card_values(w, dtype)
    r = random.Random(0)
    for _ in range(50):
        o, k = r.randrange(32), r.randrange(40)
        p, j = divmod(o, 16)
        e = int(bw.exps[p, k])
        assert e == max((int(v.view(torch.int32)) >> 23) & 0xFF for v in w[16 * p : 16 * p + 16, k])
        if bits == 7:
            code = int(bw.codes[p, k, j])
        else:
            byte = int(bw.codes[p, k, j % 8])
            code = byte & 0x0F if j < 8 else byte >> 4
        magnitude = code & ((1 << bits) - 1)
        value = magnitude * 2.0 ** (e - 127 - bits + 1) * (-1 if code >> bits else 1)
        assert value == float(ref[o, k])
        assert magnitude or not code >> bits  # a zero drops its sign, as the card's packer


@needs_kernel
@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 100])
def test_kernel_has_the_fp32_kernels_bits_on_the_cards_values(dtype: str, rows: int) -> None:
    assert KERNELS is not None
    w = weight(48, 300)  # k spans two of the prefill path's 256-wide blocks
    bw = blockfloat.pack(w, dtype)
    x = torch.randn(rows, 300, generator=torch.Generator().manual_seed(rows))
    got = bfp(bw, x)
    want = KERNELS.linear(KERNELS.linear_pack(blockfloat.unpack(bw)), x)
    assert torch.equal(got, want)
    assert torch.allclose(got, x @ card_values(w, dtype).T, rtol=1e-4, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", FORMATS)
@pytest.mark.parametrize("fault", ["mantissa", "sign", "exponent"])
@pytest.mark.parametrize("rows", [1, 9])
def test_a_wrong_code_or_exponent_changes_the_result(dtype: str, fault: str, rows: int) -> None:
    """The exact comparison above is sharp: one flipped bit of one weight shows."""
    assert KERNELS is not None
    w = weight(32, 64, seed=5)
    bw = blockfloat.pack(w, dtype)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1))
    want = KERNELS.linear(KERNELS.linear_pack(card_values(w, dtype)), x)
    assert torch.equal(bfp(bw, x), want)
    codes, exps = bw.codes.clone(), bw.exps.clone()
    p, k, j = 1, 10, 3
    if fault == "exponent":
        exps[p, k] += 1
    else:
        bit = {"mantissa": 0, "sign": formats.MANTISSA_BITS[dtype]}[fault]
        codes[p, k, j] ^= 1 << bit
    bad = blockfloat.BlockFloatWeight(dtype, codes, exps, bw.out_features, bw.in_features)
    assert not torch.equal(bfp(bad, x), want)


@needs_kernel
@pytest.mark.parametrize("dtype", FORMATS)
def test_a_rows_bits_do_not_depend_on_its_batch(dtype: str) -> None:
    lin = Linear(weight(64, 200), dtype)
    assert lin.kernel == dtype
    x = torch.randn(40, 200, generator=torch.Generator().manual_seed(2))
    full = lin(x)
    for n in (1, 3, 6, 7, 8, 32, 40):
        assert torch.equal(lin(x[:n]), full[:n])
    for i in (0, 17, 39):
        assert torch.equal(lin(x[i : i + 1]), full[i : i + 1])
        assert torch.equal(lin(x[[i, 2, 5]])[0], full[i])


@pytest.mark.parametrize("dtype", FORMATS)
def test_fused_parts_keep_their_own_blocks(dtype: str) -> None:
    """Parts of a fused projection that are not a multiple of 16 (the demo's GDN b and a) are
    padded, so each keeps the card's blocks: the fused result equals the parts' own."""
    parts = [weight(40, 64, seed=s) for s in range(3)] + [weight(4, 64, seed=9)]
    lin, splits = fused(*parts, storage=dtype)
    assert splits == (40, 40, 40, 4) and lin.out_features == 124
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4))
    got = torch.split(lin(x), splits, dim=-1)
    for part, y in zip(parts, got, strict=True):
        assert torch.allclose(y, x @ card_values(part, dtype).T, rtol=1e-5, atol=1e-6)


def test_bfloat16_storage_and_bf16_inputs() -> None:
    w, x = weight(32, 48), torch.randn(3, 48)
    lin = Linear(w, "bfloat16", bf16_inputs=True)
    want = x.to(torch.bfloat16).float() @ w.to(torch.bfloat16).float().T
    assert torch.allclose(lin(x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="weight storage"):
        Linear(w, "fp8")


def test_pack_refuses_what_the_card_wraps() -> None:
    w = torch.zeros(16, 16)
    w[3, 0] = 2.0**-124  # a block whose largest value sits below 2^-120
    with pytest.raises(ValueError, match="below 2\\^-120"):
        blockfloat.pack(w, "bfloat8_b")


@pytest.mark.parametrize("profile", PROFILES)
def test_profiles_read_the_ttnn_table(dense_dir: Path, profile: str) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    dtypes = checkpoint_dtypes(spec, Precision.named(profile))
    p = Precision.named(profile)
    assert dtypes["lm_head.weight"] == p.lm_head
    assert dtypes["embed_tokens.weight"] == "bfloat16"
    attn = spec.attention_layers[0]
    assert dtypes[f"layers.{attn}.self_attn.q_proj.weight"] == p.attention
    assert dtypes["layers.0.mlp.down_proj.weight"] == p.mlp
    assert dtypes["layers.0.linear_attn.A_log"] == "float32"


@needs_kernel
@pytest.mark.parametrize("profile", PROFILES)
def test_profile_warm_equals_cold(dense_dir: Path, profile: str) -> None:
    """A prefix-cache hit gives the cold answer in a block-float profile, as in fp32."""
    path = dense_dir
    r = random.Random(7)
    head = [r.randrange(3, 4096) for _ in range(300)]
    prompt = head + [r.randrange(3, 4096) for _ in range(40)]
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3)
    opts = dict(block_size=16, prefill_chunk=64, kv_blocks=256, snapshot_slots=8)
    warm = LLM(path, precision=profile, **opts)
    warm.generate([head + [5, 6, 7]], sp)
    (w,) = warm.generate([prompt], sp)
    (c,) = LLM(path, precision=profile, prefix_caching=False, **opts).generate([prompt], sp)
    (f,) = LLM(path, prefix_caching=False, **opts).generate([prompt], sp)
    assert w.cached_tokens >= 256 and c.cached_tokens == 0
    assert w.token_ids == c.token_ids
    assert w.logprobs is not None and c.logprobs is not None and f.logprobs is not None
    assert w.logprobs[0] == c.logprobs[0]  # the same bits: fixed reduction order
    assert w.logprobs[0] != f.logprobs[0]  # the profile did change the weights
