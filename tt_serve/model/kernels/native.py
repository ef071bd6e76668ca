"""The torch backend's C kernels (``native.c``, ``native_layers.c`` and their shared
``native.h``), compiled at first use into one library and called via ctypes.

``kernels()`` compiles ``SOURCES`` with the machine's C compiler (``$CC``, else ``cc`` or
``gcc``: ``-O3 -march=native -fopenmp``) into the user cache
(``$XDG_CACHE_HOME``/tt-serve/native/, keyed by every source and header, the compiler's
version, the flags and the CPU's feature flags, so a copied cache never runs on a CPU it was
not built for), loads it, checks it against a reference on a small input, and returns None,
logging why once, when any of that fails: no compiler (a NixOS unit without one in its PATH),
a read-only cache, a failed self-check, or ``TT_SERVE_NATIVE=0``. Callers keep their torch
path for that case, so the kernels are a speed-up, never a requirement. Compiling takes about
half a second.

torch is imported before the library is loaded: the library's OpenMP then binds to the runtime
torch already carries (one thread pool).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tt_serve.user_cache import user_cache_dir

log = logging.getLogger(__name__)

ABI = 7  # native.c's tt_native_abi()
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11")  # and -march (``_build``)
_DIR = Path(__file__).parent
# What the library is compiled from (one compiler call, one .so), and the headers they include:
# the cache key covers every one of them, so an edit to any rebuilds.
SOURCES = (_DIR / "native.c", _DIR / "native_layers.c")
HEADERS = (_DIR / "native.h",)
_P = ctypes.c_void_p
_I64 = ctypes.c_int64


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


def _build(cc: str, march: str = "native") -> Path:
    """The compiled library for these sources and headers, compiler, flags and CPU (compiling
    it if needed), for ``-march=<march>`` (tests build other instruction sets than the
    machine's best); raises OSError or subprocess.CalledProcessError."""
    flags = (*FLAGS, f"-march={march}")
    files = [f.name.encode() + b"\0" + f.read_bytes() for f in (*SOURCES, *HEADERS)]
    version = subprocess.run([cc, "--version"], capture_output=True, check=True, timeout=60).stdout
    parts = [
        *files,
        version,
        " ".join(flags).encode(),
        _cpu_flags().encode(),
        platform.machine().encode(),
    ]
    digest = hashlib.sha256()
    for part in parts:  # each length-prefixed: no two lists of parts hash alike
        digest.update(len(part).to_bytes(8, "little") + part)
    key = digest.hexdigest()[:20]
    out = user_cache_dir() / "native" / f"tt_serve_native-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run(
            [cc, *flags, *map(str, SOURCES), "-o", tmp],
            capture_output=True,
            check=True,
            timeout=300,
        )
        os.replace(tmp, out)  # atomic: a concurrent build of the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


class NativeKernels:
    """The loaded library. ``screen_levels``: the largest u8 activation code the int8 screen
    GEMV is compiled for (255 with AVX512-VNNI, 127 with AVX2, 0: not compiled)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.tt_native_abi.restype = ctypes.c_int
        lib.tt_screen_levels.restype = ctypes.c_int
        lib.tt_screen_pack.argtypes = [_P, _I64, _I64, _P]
        lib.tt_screen_pack.restype = None
        lib.tt_screen_gemv.argtypes = [
            _P,
            _I64,
            _P,
            _P,
            _P,
            _I64,
            _I64,
            ctypes.c_int32,
            ctypes.c_float,
            _P,
        ]
        lib.tt_screen_gemv.restype = None
        lib.tt_gdn.argtypes = [_P, _I64, _I64, _I64, _P, _P, _P, _I64, _P, _P, _I64, _P, _P, _P]
        lib.tt_gdn.argtypes += [_P, *[_I64] * 4, ctypes.c_float, ctypes.c_int32, _P, _P]
        lib.tt_gdn.restype = ctypes.c_int
        lib.tt_rms_norm.argtypes = [_P, _P, _P, _I64, _I64, _P, ctypes.c_float, ctypes.c_int32, _P]
        lib.tt_rms_norm.restype = None
        lib.tt_attn_decode.argtypes = [_P, _P, _P, _I64, _P, _I64, _P, *[_I64] * 5]
        lib.tt_attn_decode.argtypes += [ctypes.c_float, ctypes.c_int32, _P]
        lib.tt_attn_decode.restype = ctypes.c_int
        lib.tt_screen_best.argtypes = [_P, _I64, _I64, _I64, _I64, _P, _P]
        lib.tt_screen_best.restype = ctypes.c_int
        _D = ctypes.c_double
        lib.tt_screen_candidates.argtypes = [_P, _I64, _I64, _I64, _P, _P, _P, _P, _D, _D]
        lib.tt_screen_candidates.argtypes += [ctypes.c_int32, _P, _P, _P, _P, _I64, _P, _P, _P]
        lib.tt_screen_candidates.restype = _I64
        lib.tt_linear_compiled.restype = ctypes.c_int
        lib.tt_linear_preferred.restype = ctypes.c_int
        lib.tt_linear_pack.argtypes = [_P, _I64, _I64, _P]
        lib.tt_linear_pack.restype = None
        lib.tt_linear.argtypes = [_P, _P, _I64, _I64, _I64, _P]
        lib.tt_linear.restype = ctypes.c_int
        lib.tt_bfp_linear.argtypes = [_P, _P, ctypes.c_int32, _P, _I64, _I64, _I64, _P]
        lib.tt_bfp_linear.restype = ctypes.c_int
        if lib.tt_native_abi() != ABI:
            raise RuntimeError(f"native library ABI {lib.tt_native_abi()} is not {ABI}")
        self.screen_levels = int(lib.tt_screen_levels())
        # The AVX2 projection kernel: compiled in, and the default (no AVX512F: oneDNN's packed
        # GEMM keeps the CPUs it was measured faster on).
        self.linear_compiled = bool(lib.tt_linear_compiled())
        self.linear_preferred = bool(lib.tt_linear_preferred())

    @staticmethod
    def screen_fits(vocab: int, hidden: int) -> bool:
        """Whether a [vocab, hidden] weight has the screen's block shape."""
        return vocab % 16 == 0 and hidden % 4 == 0

    def screen_pack(self, q: torch.Tensor) -> torch.Tensor:
        """int8 [vocab, hidden] (contiguous CPU) -> the GEMV's blocked copy (same bytes)."""
        vocab, hidden = q.shape
        if q.dtype != torch.int8 or q.device.type != "cpu" or not self.screen_fits(vocab, hidden):
            raise ValueError("screen_pack takes a CPU int8 [16·n, 4·m] weight")
        q = q.contiguous()
        out = torch.empty(vocab * hidden, dtype=torch.int8)
        self.lib.tt_screen_pack(q.data_ptr(), vocab, hidden, out.data_ptr())
        return out

    @staticmethod
    def linear_fits(weight: torch.Tensor) -> bool:
        """Whether ``tt_linear`` takes ``weight``: fp32 on the CPU, [16·n, m]."""
        return (
            weight.device.type == "cpu"
            and weight.dtype == torch.float32
            and weight.dim() == 2
            and weight.shape[0] % 16 == 0
            and weight.shape[1] > 0
        )

    def linear_pack(self, weight: torch.Tensor) -> torch.Tensor:
        """fp32 [out, in] -> the projection kernel's blocked copy [out / 8, in, 8]."""
        if not self.linear_compiled or not self.linear_fits(weight):
            raise ValueError("linear_pack takes a CPU fp32 [16·n, m] weight (AVX2 + FMA)")
        out, inp = weight.shape
        weight = weight.contiguous()
        blocked = torch.empty(out // 8, inp, 8, dtype=torch.float32)
        self.lib.tt_linear_pack(weight.data_ptr(), out, inp, blocked.data_ptr())
        return blocked

    def linear(self, blocked: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """fp32 x [rows, in] · wᵀ -> [rows, out] on ``linear_pack``'s copy of w: each output
        one FMA chain over k ascending, so a row's bits do not depend on the other rows."""
        blocks, inp, _ = blocked.shape
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != inp or x.device.type != "cpu":
            raise ValueError(f"linear: fp32 CPU rows of {inp} values, got {tuple(x.shape)}")
        x = x.contiguous()
        y = torch.empty(x.shape[0], blocks * 8, dtype=torch.float32)
        if self.lib.tt_linear(blocked.data_ptr(), x.data_ptr(), x.shape[0], blocks * 8, inp,
                              y.data_ptr()):  # fmt: skip
            raise RuntimeError("tt_linear refused its shapes (or ran out of memory)")
        return y

    def bfp_linear(
        self, codes: torch.Tensor, exps: torch.Tensor, bits: int, x: torch.Tensor
    ) -> torch.Tensor:
        """fp32 x [rows, in] · wᵀ -> [rows, 16 · panels] on a block-float weight as
        ``model/blockfloat.py`` packs it (``codes`` [panels, in, 16 or 8] uint8, ``exps``
        [panels, in] uint8, ``bits`` 7 or 3), decoded in the kernel: the bits of ``linear`` on
        the unpacked weight."""
        panels, inp = (int(d) for d in exps.shape)
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != inp or x.device.type != "cpu":
            raise ValueError(f"bfp_linear: fp32 CPU rows of {inp} values, got {tuple(x.shape)}")
        if not self.linear_compiled:
            raise ValueError("bfp_linear needs the AVX2 + FMA build of the kernels")
        x = x.contiguous()
        y = torch.empty(x.shape[0], panels * 16, dtype=torch.float32)
        if self.lib.tt_bfp_linear(codes.data_ptr(), exps.data_ptr(), bits, x.data_ptr(),
                                  x.shape[0], panels * 16, inp, y.data_ptr()):  # fmt: skip
            raise RuntimeError("tt_bfp_linear refused its shapes (or ran out of memory)")
        return y

    def screen_gemv(
        self,
        qx: torch.Tensor,
        packed: torch.Tensor,
        wsum: torch.Tensor,
        scales: torch.Tensor,
        zx: int,
        sx: float,
    ) -> torch.Tensor:
        """fp32 [rows, vocab] = ((qx - zx) · w_j) * (sx * scales[j]), the integer sum exact:
        qx u8 [rows, hidden] of codes up to ``screen_levels``, ``packed`` from ``screen_pack``,
        wsum int32 [vocab] (each row's sum), scales fp32 [vocab]."""
        if not self.screen_levels:
            raise RuntimeError("the screen GEMV was compiled without AVX512-VNNI or AVX2")
        rows, hidden = qx.shape
        vocab = scales.shape[0]
        if (
            qx.dtype != torch.uint8
            or wsum.dtype != torch.int32
            or scales.dtype != torch.float32
            or packed.numel() != vocab * hidden
            or wsum.shape[0] != vocab
        ):
            raise ValueError("screen_gemv: u8 activations, a packed int8 weight, int32 sums")
        qx = qx.contiguous()
        out = torch.empty(rows, vocab, dtype=torch.float32)
        self.lib.tt_screen_gemv(
            qx.data_ptr(),
            rows,
            packed.data_ptr(),
            wsum.data_ptr(),
            scales.data_ptr(),
            vocab,
            hidden,
            zx,
            sx,
            out.data_ptr(),
        )
        return out

    @staticmethod
    def norms(x: torch.Tensor, scale: torch.Tensor) -> bool:
        """Whether ``rms_norm`` takes x (contiguous fp32 or bf16 on the CPU) and scale."""
        return (
            x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.bfloat16)
            and x.is_contiguous()
            and scale.dtype == torch.float32
            and scale.is_contiguous()
            and x.dim() >= 1
            and scale.shape == x.shape[-1:]
        )

    def rms_norm(
        self, x: torch.Tensor, scale: torch.Tensor, eps: float, res: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, RMSNorm(y) * scale) over the last dimension, y = x + res (or x): ``tt_rms_norm``,
        the rounding steps of layers.py's torch form. x (and res, same shape and dtype)
        contiguous fp32 or bf16, scale fp32 [n] (``norms``)."""
        if not self.norms(x, scale) or (
            res is not None and (res.shape != x.shape or res.dtype != x.dtype)
        ):
            raise ValueError("rms_norm: contiguous fp32 or bf16 rows and an fp32 scale")
        n = x.shape[-1]
        out = torch.empty_like(x)
        y = x
        if res is not None:
            res = res.contiguous()
            y = torch.empty_like(x)
        self.lib.tt_rms_norm(
            x.data_ptr(),
            None if res is None else res.data_ptr(),
            None if res is None else y.data_ptr(),
            x.numel() // max(n, 1),
            n,
            scale.data_ptr(),
            eps,
            int(x.dtype == torch.bfloat16),
            out.data_ptr(),
        )
        return y, out

    @staticmethod
    def attends(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> bool:
        """Whether ``attn_decode`` takes these: CPU, fp32 or bf16, pools of the query's dtype."""
        return (
            q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.bfloat16)
            and k_pool.dtype == q.dtype == v_pool.dtype
            and k_pool.is_contiguous()
            and v_pool.is_contiguous()
        )

    def attn_decode(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        tables: torch.Tensor,
        lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Single-token rows' attention over the paged KV where it lies (``tt_attn_decode``):
        q [B, heads, hd], pools [N, kvh, bs, hd] (``attends``), tables long [B, W], lens long
        [B] (each row's positions, from block 0 of its table) -> [B, heads, hd]."""
        b, heads, hd = q.shape
        n, kvh, bs, phd = k_pool.shape
        if (
            not self.attends(q, k_pool, v_pool)
            or v_pool.shape != k_pool.shape
            or phd != hd
            or heads % kvh
            or tables.dtype != torch.long
            or lens.dtype != torch.long
            or tables.shape[0] != b
            or lens.shape != (b,)
        ):
            raise ValueError("attn_decode: a query and pools of one dtype and head size")
        q, tables, lens = q.contiguous(), tables.contiguous(), lens.contiguous()
        out = torch.empty_like(q)
        bad = self.lib.tt_attn_decode(
            q.data_ptr(),
            k_pool.data_ptr(),
            v_pool.data_ptr(),
            n,
            tables.data_ptr(),
            tables.shape[1],
            lens.data_ptr(),
            b,
            heads,
            kvh,
            bs,
            hd,
            scale,
            int(q.dtype == torch.bfloat16),
            out.data_ptr(),
        )
        if bad:
            raise ValueError("attn_decode: a row's length or block lies outside its table or pool")
        return out

    def screen_best(
        self, approx: torch.Tensor, fine: int, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """approx fp32 [R, vocab] (contiguous) in slices of ``fine`` tokens -> (each row's slice
        maxima fp32 [R, vocab / fine], its n tokens with the largest values long [R, n], by
        descending value; ties either way)."""
        rows, vocab = approx.shape
        if approx.dtype != torch.float32 or not approx.is_contiguous():
            raise ValueError("screen_best takes contiguous fp32 approximate logits")
        maxima = torch.empty(rows, vocab // max(fine, 1), dtype=torch.float32)
        best = torch.empty(rows, n, dtype=torch.long)
        bad = self.lib.tt_screen_best(
            approx.data_ptr(), rows, vocab, fine, n, maxima.data_ptr(), best.data_ptr()
        )
        if bad:
            raise ValueError(f"screen_best: {n} best of slices of {fine} in {vocab} (code {bad})")
        return maxima, best

    def screen_candidates(
        self,
        approx: torch.Tensor,
        maxima: torch.Tensor,
        floor: torch.Tensor,
        coeffs: tuple[torch.Tensor, torch.Tensor, float, float],
        norms: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        bf16: bool,
        cap: int,
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Every (row, token) whose approximate logit reaches ``floor`` less its bound (screen.py
        ``_chunk``'s search, the same fp32 thresholds): approx [R, vocab] and its slice maxima
        from ``screen_best``, floor fp32 [R], coeffs (act, wgt fp64 [R], the largest ||w_j||
        and ||e_j||), norms (||w_j||, ||e_j|| fp32 [vocab], their slice maxima). Returns rows
        and tokens (row-major, tokens ascending; a row with more than ``cap`` left out) and
        every row's count."""
        rows, vocab = approx.shape
        fine = vocab // maxima.shape[1]
        act, wgt, w_norm, err_norm = coeffs
        act, wgt = act.contiguous(), wgt.contiguous()
        w_norms, e_norms, w_slice, e_slice = norms
        floor = floor.contiguous()
        if act.dtype != torch.float64 or wgt.dtype != torch.float64 or floor.dtype != torch.float32:
            raise ValueError("screen_candidates: fp64 coefficients and an fp32 floor")
        out_rows = torch.empty(rows * cap, dtype=torch.long)
        out_cols = torch.empty(rows * cap, dtype=torch.long)
        counts = torch.empty(rows, dtype=torch.long)
        n = self.lib.tt_screen_candidates(
            approx.data_ptr(),
            rows,
            vocab,
            fine,
            maxima.data_ptr(),
            floor.data_ptr(),
            act.data_ptr(),
            wgt.data_ptr(),
            w_norm,
            err_norm,
            int(bf16),
            w_norms.data_ptr(),
            e_norms.data_ptr(),
            w_slice.data_ptr(),
            e_slice.data_ptr(),
            cap,
            out_rows.data_ptr(),
            out_cols.data_ptr(),
            counts.data_ptr(),
        )
        return out_rows[:n], out_cols[:n], counts.tolist()

    def gdn(
        self,
        proj: torch.Tensor,
        seqs: torch.Tensor,
        conv_state: torch.Tensor,
        conv_taps: torch.Tensor,
        rec_state: torch.Tensor,
        gates: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        heads: tuple[int, int, int, int],
        eps: float,
        bf16: bool,
    ) -> torch.Tensor:
        """One GDN layer between its projections (``tt_gdn``, native_layers.c), in place on the
        states: proj fp32 [T, P] (the fused in-projection's rows, unit column stride), seqs long
        [3, R] (each sequence's batch offset, token count and state slot), conv_state
        [S, C, K-1] and rec_state [S, Hv, dk, dv] (fp32, contiguous), conv_taps [K, C],
        gates (neg_a [Hv], dt_bias [Hv], the norm weight [dv]; fp32), heads (Hk, Hv, dk, dv).
        Returns the gated-normed output fp32 [T, Hv·dv] (bf16 values where ``bf16``)."""
        hk, hv, dk, dv = heads
        t, width = proj.shape
        conv_dim = 2 * hk * dk + hv * dv
        f32 = [proj, conv_state, conv_taps, rec_state, *gates]
        if (
            any(a.dtype != torch.float32 or a.device.type != "cpu" for a in f32)
            or proj.stride(1) != 1
            or width < conv_dim + hv * dv + 2 * hv
            or not (conv_state.is_contiguous() and rec_state.is_contiguous())
            or not conv_taps.is_contiguous()
            or conv_taps.shape[1] != conv_dim
            or conv_state.shape[1:] != (conv_dim, conv_taps.shape[0] - 1)
            or rec_state.shape[1:] != (hv, dk, dv)
            or seqs.dtype != torch.long
            or seqs.shape[0] != 3
            or hv % hk
        ):
            raise ValueError("tt_gdn: fp32 contiguous CPU tensors of the layer's shapes")
        seqs = seqs.contiguous()
        neg_a, dt_bias, norm = (g.contiguous() for g in gates)
        mixed = torch.empty(t, conv_dim, dtype=torch.float32)
        out = torch.empty(t, hv * dv, dtype=torch.float32)
        bad = self.lib.tt_gdn(
            proj.data_ptr(),
            proj.stride(0),
            t,
            seqs.shape[1],
            seqs[0].data_ptr(),
            seqs[1].data_ptr(),
            seqs[2].data_ptr(),
            conv_state.shape[0],
            conv_state.data_ptr(),
            conv_taps.data_ptr(),
            conv_taps.shape[0],
            rec_state.data_ptr(),
            neg_a.data_ptr(),
            dt_bias.data_ptr(),
            norm.data_ptr(),
            hk,
            hv,
            dk,
            dv,
            eps,
            int(bf16),
            mixed.data_ptr(),
            out.data_ptr(),
        )
        if bad:
            raise ValueError("tt_gdn: a sequence lies outside the step's rows or the state slots")
        return out


@dataclass(frozen=True)
class ScreenWeight:
    """An int8 [vocab, hidden] weight ready for the screen GEMV: its block layout and each
    row's sum (the zero point's term)."""

    kernels: NativeKernels
    blocked: torch.Tensor
    sums: torch.Tensor

    @classmethod
    def of(cls, q: torch.Tensor) -> ScreenWeight | None:
        """``q`` prepared for the GEMV, or None where the kernel is not compiled (no compiler,
        no AVX512-VNNI or AVX2) or ``q``'s shape does not block."""
        k = kernels()
        if k is None or not k.screen_levels or not k.screen_fits(*q.shape):
            return None
        return cls(k, k.screen_pack(q), q.sum(-1, dtype=torch.int32))

    def gemv(self, qx: torch.Tensor, scales: torch.Tensor, zx: int, sx: float) -> torch.Tensor:
        """``NativeKernels.screen_gemv`` on this weight."""
        return self.kernels.screen_gemv(qx, self.blocked, self.sums, scales, zx, sx)


def screen_reference(
    qx: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, zx: int, sx: float
) -> torch.Tensor:
    """``screen_gemv``'s result computed by torch, bit for bit: the exact integer sums, then the
    same fp32 roundings (sx * s_j; the sum as fp32; their product)."""
    exact = (qx.long() - zx) @ w.long().T
    return exact.float() * (scales * torch.tensor(sx, dtype=torch.float32))


def _self_check(k: NativeKernels) -> None:
    levels = k.screen_levels
    if not levels:
        return
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(-128, 128, (64, 32), dtype=torch.int8, generator=gen)
    w[0], w[1] = 127, -128  # the extreme products (and pair sums, for AVX2's int16 step)
    scales = torch.rand(64, generator=gen) + 0.5
    qx = torch.randint(0, levels + 1, (5, 32), dtype=torch.uint8, generator=gen)
    qx[0] = levels
    got = k.screen_gemv(qx, k.screen_pack(w), w.sum(-1, dtype=torch.int32), scales, 3, 0.25)
    if not torch.equal(got, screen_reference(qx, w, scales, 3, 0.25)):
        raise RuntimeError("the screen GEMV disagrees with its reference")


def _linear_self_check(k: NativeKernels) -> None:
    if not k.linear_compiled:
        return
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 300, generator=gen) * 300**-0.5
    x = torch.randn(13, 300, generator=gen)  # more rows than one micro-kernel takes
    blocked = k.linear_pack(w)
    got = k.linear(blocked, x)
    if not torch.allclose(got, x @ w.T, rtol=1e-4, atol=1e-5):
        raise RuntimeError("the projection kernel disagrees with torch")
    if not torch.equal(k.linear(blocked, x[7:8]), got[7:8]):
        raise RuntimeError("the projection kernel's rows depend on their batch")


@functools.cache
def kernels() -> NativeKernels | None:
    """The compiled kernels, or None (the reason logged once; ``why_not`` returns it)."""
    if os.environ.get("TT_SERVE_NATIVE", "1") == "0":
        _off("native kernels off (TT_SERVE_NATIVE=0)", logging.INFO)
        return None
    cc = _compiler()
    if cc is None:
        _off("no C compiler (cc, gcc or $CC)")
        return None
    try:
        k = NativeKernels(ctypes.CDLL(str(_build(cc))))
        _self_check(k)
        _linear_self_check(k)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        tail = f": {detail.decode(errors='replace')[-500:]}" if detail else ""
        _off(f"native kernels unavailable ({exc}{tail})")
        return None
    return k


_reason: list[str] = []


def _off(reason: str, level: int = logging.WARNING) -> None:
    _reason[:] = [reason]
    log.log(level, "%s: the torch backend runs its torch ops instead", reason)


def why_not() -> str | None:
    """Why ``kernels()`` is None (None when they are compiled)."""
    return None if kernels() is not None else (_reason[0] if _reason else "unknown")
