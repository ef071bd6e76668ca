"""Small numeric building blocks shared by the reference layers (formulas match HF exactly)."""

from __future__ import annotations

import itertools
import os

import torch
import torch.nn.functional as F

from tt_serve.model import blockfloat, formats
from tt_serve.model.blockfloat import BLOCK_FLOATS, BlockFloatWeight
from tt_serve.model.kernels import native


def norm_scale(weight: torch.Tensor) -> torch.Tensor:
    """The fp32 ``1 + w`` a Qwen3.5 RMSNorm multiplies by: computed once at load, not per call."""
    return 1.0 + weight.float()


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5 RMSNorm: ``x * rsqrt(mean(x²) + eps) * (1 + w)``, computed in fp32; ``scale`` is
    ``norm_scale(w)`` (the same bits as HF's per-call ``1.0 + w.float()``). On the CPU one C
    call where native.c is compiled (the same roundings; the mean summed in another order)."""
    k = native.kernels()
    if k is not None and k.norms(x := x.contiguous(), scale):  # norms: a CPU tensor
        return k.rms_norm(x, scale, eps)[1]
    return torch_rms_norm(x, scale, eps)


def add_rms_norm(
    x: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next RMSNorm: (x + h, rms_norm(x + h)), one C call on the CPU."""
    k = native.kernels()
    if k is not None and k.norms(x, scale) and h.shape == x.shape and h.dtype == x.dtype:
        return k.rms_norm(x, scale, eps, res=h)
    y = x + h
    return y, rms_norm(y, scale, eps)


def torch_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm`` in torch ops (off the CPU, or without the C kernels)."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * scale).to(x.dtype)


def rms_norm_gated(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """GDN output norm: ``w * norm(x) * silu(z)`` over the last dim (one v-head)."""
    dtype = x.dtype
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return ((weight * normed) * F.silu(gate.float())).to(dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return (1.0 / (theta**exponents)).to(device)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, rotary_dim] for integer positions [T] (rotate-half layout)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` channels of x [T, heads, head_dim]; pass the rest."""
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    half = rd // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((rot * c + rotated * s, rest), dim=-1)


# The row count oneDNN blocks a packed weight for. Any count runs on it; from 32 up the result of
# a row does not depend on how many rows share the call (a decode row gives the same bits alone
# or in a batch of 32, checked in tests/model/test_linear.py).
PACK_ROWS = 256


class Linear:
    """``x @ Wᵀ`` for a [out, in] weight, at the fastest kernel of the weight's device.

    On a CPU with AVX2 and no AVX512 an fp32 weight goes to native.c's projection kernel
    (``tt_linear``: the weight blocked once, each output one FMA chain over k): oneDNN's packed
    GEMM reads a decode row's weights there at about 16 GB/s where this kernel streams them at
    the memory's speed, and its 6x16 micro-kernel matches oneDNN on prefill chunks (2 cores,
    0.8B shapes: ``python -m bench.kernels.linear --shapes 0.8b``). ``TT_SERVE_LINEAR=onednn``
    (or ``native``, wherever it is compiled) overrides the choice.

    Elsewhere on the CPU an fp32 or bf16 weight is reordered once into oneDNN's blocked layout
    (``mkldnn._reorder_linear_weight``, the packing torch's own compiler applies to frozen CPU
    linears) and multiplied with ``mkldnn._linear_pointwise``: 2 cores, [256, 256] x [512, 256]
    fp32 runs at 159 us against 358 us for ``F.linear`` (MKL repacks its operand per call),
    2x at 8 and 32 rows, about 2x slower at 1 row for the smallest weights (15 vs 8 us): see
    ``python -m bench.kernels.linear`` and bench/runs/linear-kernels.jsonl. Only the
    summation order differs from ``F.linear`` (<= 4e-5 absolute on unit-variance products).
    Either copy replaces the plain one, so memory does not grow, and on either a row's result
    does not depend on how many rows share the call (tests/model/test_linear.py). Elsewhere
    (CUDA, other dtypes, a torch built without oneDNN) it is ``F.linear``.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        storage: str = "float32",
        *,
        bf16_inputs: bool = False,
        keep: torch.Tensor | None = None,
    ) -> None:
        """``storage``: float32, or a card format the weight is held in (bfloat16: its values
        in fp32; a block float: packed as the card holds it, decoded by native.c, or its
        values in fp32 where that kernel is missing). ``bf16_inputs``: round the inputs to
        bf16 first, as the card feeds its matmuls. ``keep``: the output columns kept (the
        padding rows of ``fused``'s block-float parts are left out)."""
        if storage not in ("float32", *STORAGE_ROUNDED):
            raise ValueError(f"weight storage {storage!r}: use float32 or one of {STORAGE_ROUNDED}")
        self.in_features = int(weight.shape[1])
        self.out_features = int(weight.shape[0]) if keep is None else int(keep.numel())
        self.storage, self.bf16_inputs, self.keep = storage, bf16_inputs, keep
        self.packed: torch.Tensor | None = None
        self.blocked: torch.Tensor | None = None
        self.block_float: BlockFloatWeight | None = None
        self.weight: torch.Tensor | None = None
        self.native: native.NativeKernels | None = None
        if (
            storage in BLOCK_FLOATS
            and weight.device.type == "cpu"
            and weight.dtype == torch.float32
        ):
            k = native.kernels()
            if k is not None and k.linear_compiled:
                self.block_float, self.native = blockfloat.pack(weight, storage), k
                return
        if storage != "float32":  # the card's values, in fp32
            weight = formats.round_to(weight.T, storage).T.contiguous().to(weight.dtype)
        self.native = native_linear(weight)
        if self.native is not None:
            self.blocked = self.native.linear_pack(weight)
        elif packs(weight):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_ROWS)
        else:
            self.weight = weight

    @property
    def kernel(self) -> str:
        """Which kernel runs: ``native``, ``onednn`` or ``torch`` (``F.linear``)."""
        if self.block_float is not None:
            return self.block_float.dtype
        return (
            "native"
            if self.blocked is not None
            else "onednn"
            if self.packed is not None
            else "torch"
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the weight as held (what a decode step reads of it)."""
        if self.block_float is not None:
            return self.block_float.nbytes
        held = next(t for t in (self.blocked, self.packed, self.weight) if t is not None)
        return held.numel() * held.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bf16_inputs:  # the card feeds its matmuls bf16 activations
            x = x.to(torch.bfloat16).to(x.dtype)
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features)
        if self.block_float is not None:
            assert self.native is not None
            bw = self.block_float
            y = self.native.bfp_linear(bw.codes, bw.exps, bw.bits, flat)
        elif self.blocked is not None:
            assert self.native is not None
            y = self.native.linear(self.blocked, flat)
        elif self.packed is not None:
            y = torch.ops.mkldnn._linear_pointwise(
                flat.contiguous(), self.packed, None, "none", [], ""
            )
        else:
            assert self.weight is not None
            y = F.linear(flat, self.weight)
        if self.keep is not None:  # ``fused``'s padding rows left out
            y = y.index_select(1, self.keep.to(y.device))
        elif y.shape[1] != self.out_features:  # the block float's padding to 16
            y = y[:, : self.out_features]
        return y.reshape(*lead, self.out_features)


LINEAR_KERNELS = ("auto", "native", "onednn")
# Storage formats of a ``Linear`` weight besides float32: the card's bf16 and block floats.
STORAGE_ROUNDED = ("bfloat16", *BLOCK_FLOATS)


def native_linear(weight: torch.Tensor) -> native.NativeKernels | None:
    """The C kernels when ``Linear`` runs ``weight`` on ``tt_linear``: an fp32 CPU weight of
    [16·n, m], the kernel compiled (AVX2 + FMA), and preferred on this CPU (no AVX512F) or asked
    for by ``TT_SERVE_LINEAR=native``; None for oneDNN / ``F.linear``."""
    choice = os.environ.get("TT_SERVE_LINEAR", "auto")
    if choice not in LINEAR_KERNELS:
        raise ValueError(f"TT_SERVE_LINEAR={choice!r}: use one of {', '.join(LINEAR_KERNELS)}")
    if choice == "onednn" or weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    k = native.kernels()
    if k is None or not k.linear_compiled or not k.linear_fits(weight):
        return None
    return k if choice == "native" or k.linear_preferred else None


def packs(weight: torch.Tensor) -> bool:
    """Whether ``Linear`` runs ``weight`` on oneDNN's packed kernel."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and (weight.dtype == torch.float32 or cpu_bf16())
    )


def cpu_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls on oneDNN's native kernels (AVX512-BF16 or AMX)."""
    return bool(
        torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def fused(
    *weights: torch.Tensor, storage: str = "float32", bf16_inputs: bool = False
) -> tuple[Linear, tuple[int, ...]]:
    """One ``Linear`` over the row-concatenation of [out_i, in] weights and the out_i (one
    GEMM instead of several small ones; ``torch.split`` of its output gives each).

    In a block float each part keeps the card's own blocks (16 outputs from a multiple of 16:
    the card holds each part as its own tensor), so a part of a size not a multiple of 16
    (the demo model's GDN b and a) is padded with zero rows, which the output leaves out."""
    splits = tuple(int(w.shape[0]) for w in weights)
    pad = [-n % 16 if storage in BLOCK_FLOATS else 0 for n in splits]
    if not any(pad):
        return Linear(torch.cat(weights, dim=0), storage, bf16_inputs=bf16_inputs), splits
    parts = [torch.cat([w, w.new_zeros(p, w.shape[1])]) for w, p in zip(weights, pad, strict=True)]
    starts = itertools.accumulate([0, *(n + p for n, p in zip(splits, pad, strict=True))])
    keep = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, splits, strict=False)])
    lin = Linear(torch.cat(parts, dim=0), storage, bf16_inputs=bf16_inputs, keep=keep)
    return lin, splits


def swiglu(x: torch.Tensor, gate_up: Linear, down: Linear) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one [2I, H] ``Linear``."""
    gu = gate_up(x)
    inter = gu.shape[-1] // 2
    return down(F.silu(gu[..., :inter]) * gu[..., inter:])
