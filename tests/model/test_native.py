"""The torch backend's C kernels (``kernels/native.py``; ``kernels/native.c``,
``native_layers.c`` and ``native.h``): the screen GEMV equals its torch reference bit for bit,
the block layout is what the kernel reads, the library is keyed by every source and header, and
a machine without a compiler (or with the kernels switched off) gets None and a logged reason,
never an error."""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
from pathlib import Path

import pytest
import torch

from tt_serve.model.kernels import native


def _kernels() -> native.NativeKernels:
    k = native.kernels()
    if k is None or not k.screen_levels:
        pytest.skip("the screen GEMV needs a C compiler and an AVX2 or AVX512-VNNI CPU")
    return k


def _cpu_has(flag: str) -> bool:
    with open("/proc/cpuinfo") as f:
        return flag in next((line for line in f if line.startswith("flags")), "").split()


@functools.cache
def _avx2_kernels() -> native.NativeKernels:
    """The kernels built for AVX2 without AVX512 (x86-64-v3), whatever this CPU's best: the
    7-bit path a CPU without VNNI runs, checked on every x86 machine that runs AVX2."""
    cc = native._compiler()
    if platform.machine() != "x86_64" or cc is None or not _cpu_has("avx2"):
        pytest.skip("needs an x86-64 CPU with AVX2 and a C compiler")
    k = native.NativeKernels(ctypes.CDLL(str(native._build(cc, march="x86-64-v3"))))
    assert k.screen_levels == 127
    return k


def _check_gemv(k: native.NativeKernels, vocab: int, hidden: int, rows: int) -> None:
    levels = k.screen_levels
    g = torch.Generator().manual_seed(vocab + rows)
    w = torch.randint(-128, 128, (vocab, hidden), dtype=torch.int8, generator=g)
    w[0], w[-1] = 127, -128  # the largest products (and int16 pair sums) of either sign
    scales = torch.rand(vocab, generator=g) * 1e-2 + 1e-4
    qx = torch.randint(0, levels + 1, (rows, hidden), dtype=torch.uint8, generator=g)
    qx[0] = levels
    for zx, sx in ((0, 1.0), (levels // 2 + 1, 0.013), (levels, 3.7e-3)):
        got = k.screen_gemv(qx, k.screen_pack(w), w.sum(-1, dtype=torch.int32), scales, zx, sx)
        assert torch.equal(got, native.screen_reference(qx, w, scales, zx, sx))


SHAPES = [(16, 4), (64, 32), (4096, 256), (160, 1028)]


@pytest.mark.parametrize(("vocab", "hidden"), SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9, 16])
def test_screen_gemv_is_its_reference(vocab: int, hidden: int, rows: int) -> None:
    _check_gemv(_kernels(), vocab, hidden, rows)


@pytest.mark.parametrize(("vocab", "hidden"), SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 16])
def test_avx2_screen_gemv_is_its_reference(vocab: int, hidden: int, rows: int) -> None:
    _check_gemv(_avx2_kernels(), vocab, hidden, rows)


def test_screen_pack_puts_four_bytes_of_sixteen_tokens_together() -> None:
    k = _kernels()
    w = torch.arange(32 * 8, dtype=torch.int64).reshape(32, 8).remainder(251).sub(125)
    w = w.to(torch.int8)
    packed = k.screen_pack(w).reshape(2, 2, 16, 4)  # [blocks, groups of 4, tokens, 4]
    for b, grp, t in ((0, 0, 0), (0, 1, 15), (1, 0, 3), (1, 1, 9)):
        assert torch.equal(packed[b, grp, t], w[16 * b + t, 4 * grp : 4 * grp + 4])


def test_screen_rejects_shapes_it_cannot_block() -> None:
    k = _kernels()
    assert not k.screen_fits(5003, 64) and not k.screen_fits(64, 30)
    with pytest.raises(ValueError):
        k.screen_pack(torch.zeros(24, 8, dtype=torch.int8))


def test_no_compiler_means_no_kernels_and_a_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.kernels.__wrapped__() is None
    assert "native kernels unavailable" in caplog.text
    assert not list(tmp_path.rglob("*.so"))


def test_a_failing_compile_means_no_kernels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cc = tmp_path / "cc"
    cc.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo fake-cc && exit 0\necho boom >&2\nexit 1\n'
    )
    cc.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(cc))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.kernels.__wrapped__() is None
    assert "boom" in caplog.text  # the compiler's own message is logged
    assert not [f for f in tmp_path.rglob("*") if f.is_file() and f != cc]  # no partial build


def test_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TT_SERVE_NATIVE", "0")
    assert native.kernels.__wrapped__() is None


def test_the_library_is_keyed_by_the_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A cache copied to a machine with other CPU flags builds anew (-march=native)."""
    _kernels()
    cc = native._compiler()
    assert cc is not None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native, "_cpu_flags", lambda: "flags : a")
    first = native._build(cc)
    monkeypatch.setattr(native, "_cpu_flags", lambda: "flags : b")
    second = native._build(cc)
    assert first != second and first.exists() and second.exists()
    assert native._build(cc) == second  # and reuses what it built


def test_every_kernel_file_is_built_and_keyed() -> None:
    """Every C source and header beside native.py is in ``SOURCES`` or ``HEADERS``, so none
    is left out of the build or of the cache key."""
    here = Path(native.__file__).parent
    files = {f.name for f in here.iterdir() if f.suffix in (".c", ".h")}
    assert files == {f.name for f in (*native.SOURCES, *native.HEADERS)}
    assert all(f.parent == here for f in (*native.SOURCES, *native.HEADERS))


def test_an_edit_to_any_source_or_header_rebuilds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cache key covers every source and header, and the one compiler call gets every
    source (a fake compiler writes its arguments where the library goes)."""
    cc = tmp_path / "cc"
    cc.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo fake-cc && exit 0\n'
        'for a; do [ "$prev" = -o ] && out="$a"; prev="$a"; done\necho "$@" > "$out"\n'
    )
    cc.chmod(0o755)
    src = tmp_path / "src"
    src.mkdir()
    for f in (*native.SOURCES, *native.HEADERS):
        (src / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(native, "SOURCES", tuple(src / f.name for f in native.SOURCES))
    monkeypatch.setattr(native, "HEADERS", tuple(src / f.name for f in native.HEADERS))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    built = [native._build(str(cc))]
    args = built[0].read_text().split()
    assert [a for a in args if a.endswith(".c")] == [str(f) for f in native.SOURCES]
    assert [a for a in args if a.startswith("-") and a != "-o"] == [*native.FLAGS, "-march=native"]
    for f in (*native.SOURCES, *native.HEADERS):
        f.write_bytes(f.read_bytes() + b"\n/* edited */\n")
        built.append(native._build(str(cc)))
    assert len(set(built)) == len(built) and all(b.exists() for b in built)
    assert native._build(str(cc)) == built[-1]  # unchanged sources: the same library
    assert sorted(f.name for f in (tmp_path / "cache").rglob("*") if f.is_file()) == sorted(
        b.name for b in built
    )  # no temporary left behind


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_rms_norm_is_the_torch_norm_and_each_row_its_own(dtype: torch.dtype, rows: int) -> None:
    """``tt_rms_norm`` against layers.py's torch form (the mean summed in another order: a few
    ulps in fp32, a bf16 rounding either way in bf16), the residual add bit for bit, and a row
    gives the same bits alone as in any batch (what warm == cold needs of every layer)."""
    from tt_serve.model.ref.layers import torch_rms_norm

    k = native.kernels()
    if k is None:
        pytest.skip("no C compiler")
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 256, generator=g) * 3).to(dtype)
    h = torch.randn(rows, 256, generator=g).to(dtype)
    scale = 1 + torch.randn(256, generator=g) * 0.1
    y, out = k.rms_norm(x, scale, 1e-6, res=h)
    assert torch.equal(y, x + h)
    want = torch_rms_norm(x + h, scale, 1e-6).float()
    # fp32: the mean's reordering (numerics.py, n = 256); bf16: one rounding either way
    rel = 2.0**-23 * (4 + 16) if dtype == torch.float32 else 2.0**-7
    assert ((out.float() - want).abs() <= rel * want.abs()).all()
    assert torch.equal(k.rms_norm(x + h, scale, 1e-6)[1], out)
    assert torch.equal(k.rms_norm(x[-1:], scale, 1e-6, res=h[-1:])[1], out[-1:])
    with pytest.raises(ValueError):
        k.rms_norm(x.T, scale, 1e-6)  # not contiguous rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kvh", "hd"), [(4, 2, 64), (8, 2, 128), (3, 1, 40)])
def test_decode_attention_reads_the_blocks_where_they_lie(
    dtype: torch.dtype, heads: int, kvh: int, hd: int
) -> None:
    """``tt_attn_decode`` against attention.py's gather + ``attend`` (scores and probabilities
    rounded as the torch form rounds them), rows of different lengths over scattered blocks,
    each row's result its own; a table entry or length outside the pool writes nothing."""
    from tt_serve.model.ref.attention import attend, gather_blocks

    k = native.kernels()
    if k is None:
        pytest.skip("no C compiler")
    g = torch.Generator().manual_seed(heads * hd)
    bs, blocks = 16, 40
    k_pool = torch.randn(blocks, kvh, bs, hd, generator=g).to(dtype)
    v_pool = torch.randn(blocks, kvh, bs, hd, generator=g).to(dtype)
    lens = torch.tensor([1, 37, 16, 130])
    tables = torch.randperm(blocks - 1, generator=g)[: 4 * 9].reshape(4, 9) + 1
    q = (torch.randn(4, heads, hd, generator=g) * 2).to(dtype)
    got = k.attn_decode(q, k_pool, v_pool, tables, lens, hd**-0.5)
    keys, vals = gather_blocks(k_pool, tables), gather_blocks(v_pool, tables)
    mask = (torch.arange(keys.shape[2])[None, :] < lens[:, None])[:, None, None, :]
    want = attend(q.reshape(4, kvh, heads // kvh, hd), keys, vals, mask).reshape(4, heads, hd)
    # fp32: a softmax-weighted sum over up to 130 keys in another order; bf16: one rounding
    scale = want.float().abs().max().item()
    tol = 2.0**-23 * (4 + 130**0.5) * 4 * scale if dtype == torch.float32 else 2.0**-6 * scale
    assert (got.float() - want.float()).abs().max().item() <= tol
    alone = k.attn_decode(q[2:3], k_pool, v_pool, tables[2:3], lens[2:3], hd**-0.5)
    assert torch.equal(alone, got[2:3])
    for bad_tables, bad_lens in ((tables.clone().fill_(blocks), lens), (tables, lens + 200)):
        with pytest.raises(ValueError, match="outside"):
            k.attn_decode(q, k_pool, v_pool, bad_tables, bad_lens, hd**-0.5)
