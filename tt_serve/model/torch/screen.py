"""Exact LM-head picks at an int8 read of the weight (CPU; fp32 heads, and bf16 ones).

A decode step multiplies a few rows by the [vocab, H] head; in fp32 that is the whole weight
read per step (254 MB on the demo model: 8.8 ms at 1 row on 2 cores, half of a token's time).
A greedy or top-k row needs the logits of its best few tokens only, so the head is *screened*:
an int8 copy of the weight (per-row scales, a quarter of the bytes; a u8·s8 GEMM: the C kernel
of ``native.c`` up to ``NATIVE_ROWS`` rows where it is compiled, oneDNN's otherwise and beyond)
gives approximate logits ``a`` with a proven bound ``|y - a| <= B`` for
each hidden row. The exact logits of the row's n best by ``a`` give a floor for its n-th largest
logit, so every token that can be among its n largest has ``a_j >= floor - B_j``; only those
candidates (a few to about a hundred of 248,320 on the demo model) get their logit computed
exactly in fp32 from the plain weight, and the pick (argmax, or a top-k draw with its top-p and
min-p) is made among them. It is the pick the full fp32 logits give: the screen decides which
logits are computed, never their values.

The bound, for a hidden row x quantized to x̂ = s_x (q_x - z) and a weight row w_j = ŵ_j + e_j,
ŵ_j = s_j q_j (Cauchy-Schwarz on both terms), is each token's own:

    B_j = |x·w_j - x̂·ŵ_j| <= ||x - x̂||_2 · ||w_j||_2 + ||x̂||_2 · ||e_j||_2

plus the fp32 rounding of the exact dot products (γ_H ||x||_2 ||w_j||_2) and of the kernel's
scaling (1e-6 of |a_j|), with 1 % to spare. ``||w_j||`` and ``||e_j||`` are stored per token
(||e_j|| varies about 2x across the demo head: per-token bounds keep about 35 % fewer candidates
than the worst token's). The search runs in fine slices of about 100 tokens: a slice is
searched only if its maximum reaches ``floor`` minus its largest bound, then each of its
entries against its own. Activations are quantized to 8
bits where a probe at startup finds oneDNN's u8·s8 products exact (``activation_levels``), to
7 bits otherwise (no int16 pair sum can saturate on a CPU without VNNI), and for the C kernel
to the bits it is compiled for (8 with AVX512-VNNI, 7 with AVX2: ``screen_levels``): the GEMM's
result is then the dequantized product to rounding (tested). A row whose candidates exceed
``MAX_CANDIDATES`` (a hidden state with outliers the activation scale resolves poorly) has every
logit computed the exact way; a non-finite hidden state goes back to the full head.

An exact logit is ``(w_j * x).sum()`` in fp32: the same bits for a token whatever other
candidates share the call (tested), so the picks of a row do not depend on its batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from tt_serve.model.kernels import native
from tt_serve.model.torch.sampling import largest, sliced

# Rows one int8 GEMM takes at once (2 cores, demo head, the GEMM alone: 2.5 ms at 1 row, 3.3 at
# 16, 4.5-5.4 at 32, against 8.8 / 10.8 / 13.5 ms for the packed fp32 head; whole picks:
# python -m bench.kernels.lm_head_layout).
SCREEN_ROWS = 32
# Up to this many rows go through the C kernel where it is compiled (native.c, AVX512-VNNI): at
# one to eight rows it reads the head about 1.5x faster than oneDNN; from about 16 rows oneDNN's
# blocked GEMM computes faster (python -m bench.kernels.lm_head_layout).
NATIVE_ROWS = 16
# Past this many candidates a row's logits are all computed exactly (the screen no longer pays).
MAX_CANDIDATES = 4096
# The largest top-k a screened row may ask for.
MAX_TOP_K = 1024
_EXACT_CHUNK = 16384  # weight rows per exact pass over the whole vocabulary
_SLACK = 1.01


@functools.cache
def activation_levels() -> int:
    """The largest u8 activation code the int8 GEMM is exact for on this CPU: 255 when full
    8-bit products give the integer result (oneDNN keeps u8·s8 exact where it can), 127 when
    only 7-bit ones do (no int16 pair sum saturates), 0 when there is no such kernel."""
    if not torch.backends.mkldnn.is_available():
        return 0
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(-127, 128, (64, 256), dtype=torch.int8, generator=gen)
    w[:8], w[8:16] = 127, -127
    ones, zeros = torch.ones(64), torch.zeros(64, dtype=torch.long)
    try:
        packed = torch.ops.onednn.qlinear_prepack(w, None)
        for levels in (255, 127):
            x = torch.randint(0, levels + 1, (4, 256), dtype=torch.uint8, generator=gen)
            x[0], x[1] = levels, 0
            for zx in (0, levels // 2):
                y = _qlinear(x, 1.0, zx, packed, ones, zeros).double()
                if not torch.equal(y, (x.double() - zx) @ w.double().T):
                    break
            else:
                return levels
    except (RuntimeError, AttributeError):
        return 0
    return 0


def available() -> bool:
    """Whether this torch has an exact int8 GEMM (oneDNN's quantized linear) on this CPU."""
    return activation_levels() > 0


def _qlinear(
    qx: torch.Tensor,
    sx: float,
    zx: int,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
) -> torch.Tensor:
    return torch.ops.onednn.qlinear_pointwise(
        qx, sx, zx, packed, scales, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )


class ScreenedHead:
    """The screen of one [vocab, H] fp32 or bf16 weight (kept by reference, not copied).

    A bf16 head's logits are its GEMM's: fp32 sums of the (exact) bf16 products, rounded to
    bf16. The screen's exact logits are rounded the same way, and its window widened by that
    rounding (half a bf16 ulp of the floor), so its picks are the bf16 head's: ties included,
    to the summation order (a sum within 1e-6 of a rounding boundary may round the other way).
    """

    def __init__(self, weight: torch.Tensor) -> None:
        if (
            weight.dtype not in (torch.float32, torch.bfloat16)
            or weight.device.type != "cpu"
            or weight.dim() != 2
        ):
            raise ValueError("ScreenedHead screens a 2-d fp32 or bf16 CPU weight")
        self.weight = weight.contiguous()
        self.dtype = weight.dtype  # the logits' precision
        vocab = self.weight.shape[0]
        scales = torch.empty(vocab, dtype=torch.float32)
        q = torch.empty(self.weight.shape, dtype=torch.int8)
        w_norms = torch.empty(vocab, dtype=torch.float64)
        e_norms = torch.empty(vocab, dtype=torch.float64)
        for lo in range(0, vocab, _EXACT_CHUNK):
            w = self.weight[lo : lo + _EXACT_CHUNK].float()
            s = w.abs().amax(-1) / 127.0
            s = torch.where(s > 0, s, torch.ones_like(s))
            qc = torch.round(w / s[:, None]).clamp_(-127, 127)
            scales[lo : lo + w.shape[0]] = s
            q[lo : lo + w.shape[0]] = qc.to(torch.int8)
            wd = w.double()
            e_norms[lo : lo + w.shape[0]] = (wd - qc.double() * s.double()[:, None]).norm(dim=-1)
            w_norms[lo : lo + w.shape[0]] = wd.norm(dim=-1)
        self.scales = scales
        self.packed = torch.ops.onednn.qlinear_prepack(q, None)
        # q for the C kernel's GEMV; None where it is not compiled or the shape does not block.
        self.native = native.ScreenWeight.of(q)
        self.levels = activation_levels()
        if not self.levels:
            raise RuntimeError("no exact int8 GEMM on this CPU (oneDNN quantized linear)")
        self.zeros = torch.zeros(vocab, dtype=torch.long)  # the weight's zero points
        # Each token's ||w_j|| and ||w_j - ŵ_j|| (fp32, rounded up), their maxima, and their
        # maxima per fine slice (fp32 [vocab / fine]).
        self.w_norms, self.e_norms = _up32(w_norms), _up32(e_norms)
        self.w_norm, self.err_norm = float(w_norms.max()), float(e_norms.max())
        # Candidates, and a row's n best, are searched in fine slices (a divisor of the width
        # of ``sliced(·, 512)``, about 100 tokens; 0: the vocabulary has no such slicing): a
        # top-20 row reaches some 60 of them, where 512-slices hit about as many.
        cut = sliced(self.w_norms[None], 512)
        self.fine = 0 if cut is None else _fine_width(cut.shape[2])
        self.w_slice_max: torch.Tensor | None = None
        self.e_slice_max: torch.Tensor | None = None
        if self.fine:
            self.w_slice_max = self.w_norms.view(-1, self.fine).amax(-1)
            self.e_slice_max = self.e_norms.view(-1, self.fine).amax(-1)
        # The C kernels' candidate search (native.c), where they are compiled and the head has
        # fine slices; torch ops else.
        self.search = native.kernels() if self.fine else None
        h = self.weight.shape[1]
        u = 2.0**-24
        self.gamma = h * u / (1 - h * u)

    def candidates(self, x: torch.Tensor, n: list[int]) -> Candidates | None:
        """The head's exact logits (fp32; bf16 values for a bf16 head) of hidden rows x [R, H]
        at every token that can be among row r's ``n[r]`` largest; None when x is not finite
        (the caller uses the full head)."""
        if not bool(torch.isfinite(x).all()):
            return None
        x = x.float()  # a bf16 model's hidden states, exactly
        counts: list[int] = []
        cols: list[torch.Tensor] = []
        vals: list[torch.Tensor] = []
        for lo in range(0, x.shape[0], SCREEN_ROWS):
            xs = x[lo : lo + SCREEN_ROWS].contiguous()
            rows, part, sizes = self._chunk(xs, n[lo : lo + SCREEN_ROWS])
            counts += sizes
            cols.append(part)
            vals.append(self._exact(xs, rows, part))
        return Candidates(self.weight.shape[0], counts, torch.cat(cols), torch.cat(vals))

    def _chunk(self, x: torch.Tensor, n: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(row, token) of every candidate, row-major with tokens ascending, and each row's
        count; a row with too many has every token."""
        approx, act, wgt = self._approx(x)
        # The exact logits of each row's n best by the screen: their n-th largest is a floor
        # for the row's n-th largest logit, so a candidate needs a_j >= floor - B_j. The n best
        # are searched in the fine slices (a top-20 row gathers 20 of ~100 values, not of ~500).
        width = max(n)
        if self.search is not None and width <= approx.shape[1] // self.fine:
            maxima, best = self.search.screen_best(approx, self.fine, width)
            floor = self._floor(x, best, n)
            assert self.w_slice_max is not None and self.e_slice_max is not None
            rows, cols, counts = self.search.screen_candidates(
                approx,
                maxima,
                floor,
                (act, wgt, self.w_norm, self.err_norm),
                (self.w_norms, self.e_norms, self.w_slice_max, self.e_slice_max),
                self.dtype == torch.bfloat16,
                MAX_CANDIDATES,
            )
        else:
            rows, cols, counts = self._search(x, n, approx, act, wgt)
        wide = [i for i, c in enumerate(counts) if c > MAX_CANDIDATES]
        if wide:
            vocab = self.weight.shape[0]
            kept = [0 if c > MAX_CANDIDATES else c for c in counts]
            parts = list(zip(rows.split(kept), cols.split(kept), strict=True))
            for i in wide:
                parts[i] = (torch.full((vocab,), i, dtype=torch.long), torch.arange(vocab))
                counts[i] = vocab
            rows, cols = (torch.cat(t) for t in zip(*parts, strict=True))
        return rows, cols, counts

    def _floor(self, x: torch.Tensor, best: torch.Tensor, n: list[int]) -> torch.Tensor:
        """fp32 [R]: the n[r]-th largest exact logit of row r among its first n[r] ``best``
        tokens [R, max(n)] (a lower bound of its n[r]-th largest logit)."""
        width = best.shape[1]
        mine = torch.arange(x.shape[0]).repeat_interleave(width)
        exact = self._exact(x, mine, best.reshape(-1)).reshape(-1, width)
        if all(k == width for k in n):
            return exact.amin(-1)
        need = torch.tensor(n)
        exact = exact.masked_fill(torch.arange(width)[None, :] >= need[:, None], float("-inf"))
        return exact.sort(dim=-1, descending=True).values.gather(1, (need - 1)[:, None])[:, 0]

    def _search(
        self,
        x: torch.Tensor,
        n: list[int],
        approx: torch.Tensor,
        act: torch.Tensor,
        wgt: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """The candidates in torch ops (the C kernel's ``screen_best`` and
        ``screen_candidates`` compute the same): rows and tokens as ``_chunk`` but without the
        rows of more than MAX_CANDIDATES, and every row's count."""
        fine = fine_max = None
        if self.fine:  # [R, fine slices] and their maxima
            fine = approx.view(x.shape[0], -1, self.fine)
            fine_max = fine.amax(-1)
        best = largest(approx, max(n), maxima=fine_max, cut=fine)[1]
        floor = self._floor(x, best, n)
        # floor - B_j is evaluated in fp32 (a handful of roundings of at most 2^-24 of
        # |floor| + max_j B_j each): ``margin`` more is subtracted, so no candidate is lost.
        fd = floor.double()
        margin = 8 * 2.0**-24 * (fd.abs() + act * self.w_norm + wgt * self.err_norm)
        if self.dtype == torch.bfloat16:  # a logit rounding up to the floor: from half an ulp
            margin = margin + 2.0**-8 * fd.abs()
        floor32, act32, wgt32 = floor - _up32(margin), _up32(act), _up32(wgt)
        if fine is None or fine_max is None or self.w_slice_max is None or self.e_slice_max is None:
            loose = floor32 - (act32 * self.w_norm + wgt32 * self.err_norm)
            rows, cols = (approx >= loose[:, None]).nonzero(as_tuple=True)
        else:  # entry by entry only in the slices whose maximum reaches their largest bound
            per = fine.shape[1]
            reach = floor32[:, None] - (
                act32[:, None] * self.w_slice_max + wgt32[:, None] * self.e_slice_max
            )  # [R, fine slices], in fp32 like the per-token thresholds below
            r, sl = (fine_max >= reach).nonzero(as_tuple=True)
            if 4 * r.shape[0] < fine_max.numel():
                at = r * per + sl
                hit = fine.reshape(-1, self.fine).index_select(0, at) >= reach.view(-1)[at, None]
            else:
                hit = (fine >= reach[..., None])[r, sl]
            p, c = hit.nonzero(as_tuple=True)
            rows, cols = r[p], sl[p] * self.fine + c
        # then each of those against its own token's bound
        thr = floor32[rows] - (
            act32[rows] * self.w_norms.index_select(0, cols)
            + wgt32[rows] * self.e_norms.index_select(0, cols)
        )
        keep = approx.view(-1).index_select(0, rows * approx.shape[1] + cols) >= thr
        rows, cols = rows[keep], cols[keep]
        counts = torch.bincount(rows, minlength=x.shape[0]).tolist()
        if any(c > MAX_CANDIDATES for c in counts):  # a wide row's own candidates are not kept
            narrow = torch.tensor([c <= MAX_CANDIDATES for c in counts])[rows]
            rows, cols = rows[narrow], cols[narrow]
        return rows, cols, counts

    def _exact(self, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The head's logits of hidden rows x [R, H] (fp32) at (rows, cols), as fp32: the
        ``_dots``, rounded to bf16 for a bf16 head."""
        dots = self._dots(x, rows, cols)
        return dots if self.dtype == torch.float32 else dots.to(self.dtype).float()

    def _dots(self, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """fp32 ``(w_j * x_r).sum()`` at (rows, cols): one product and one last-dimension sum
        each, whose bits do not depend on which other entries share the call (tested)."""
        return torch.cat(
            [
                (self.weight.index_select(0, c).float() * x.index_select(0, r)).sum(-1)
                for r, c in zip(rows.split(_EXACT_CHUNK), cols.split(_EXACT_CHUNK), strict=True)
            ]
            or [x.new_empty(0)]
        )

    def _approx(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """int8 logits a [R, vocab] and each row's bound coefficients (fp64 [R] each):
        ``|x_r·w_j - a_rj| <= act[r] * ||w_j|| + wgt[r] * ||w_j - ŵ_j||`` (``token_bound``)."""
        fast = self.native if x.shape[0] <= NATIVE_ROWS else None
        levels = fast.kernels.screen_levels if fast is not None else self.levels  # exact sums
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        sx = (hi - lo) / levels if hi > lo else 1.0
        zx = min(max(round(-lo / sx), 0), levels)
        qx = torch.clamp(torch.round(x / sx) + zx, 0, levels)
        if fast is not None:
            approx = fast.gemv(qx.to(torch.uint8), self.scales, zx, sx)
        else:
            approx = _qlinear(qx.to(torch.uint8), sx, zx, self.packed, self.scales, self.zeros)
        xd = x.double()
        xhat = (qx.double() - zx) * sx
        hat = xhat.norm(dim=-1)
        # 1e-6 * ||x̂|| (||w_j|| + ||e_j||) >= 1e-6 |a|: the kernel's scaling
        act = (xd - xhat).norm(dim=-1) + self.gamma * xd.norm(dim=-1) + 1e-6 * hat
        wgt = hat * (1 + 1e-6)
        return approx, act * _SLACK, wgt * _SLACK

    def token_bound(self, act: torch.Tensor, wgt: torch.Tensor) -> torch.Tensor:
        """The bound of every token, fp64 [R, vocab], from ``_approx``'s coefficients."""
        return act[:, None] * self.w_norms.double() + wgt[:, None] * self.e_norms.double()


@functools.cache
def _fine_width(span: int) -> int:
    """The divisor of ``span`` closest to 100 (``span`` itself when it has none past 1)."""
    widths = [w for w in range(2, span + 1) if span % w == 0]
    return min(widths, key=lambda w: abs(w - 100))


def _up32(t: torch.Tensor) -> torch.Tensor:
    """fp64 ``t`` as fp32, rounded up."""
    f = t.float()
    return torch.where(f.double() < t, torch.nextafter(f, torch.full_like(f, float("inf"))), f)


@dataclass(frozen=True)
class Candidates:
    """Exact logits ``vals`` at tokens ``cols`` of a [rows, vocab] logit matrix whose other
    entries are below every row's candidates: row r holds the next ``counts[r]`` entries, its
    tokens ascending."""

    vocab: int
    counts: list[int]
    cols: torch.Tensor
    vals: torch.Tensor

    def greedy(self) -> torch.Tensor:
        """Each row's argmax (the first maximum), long [rows]: the full logits' argmax."""
        n = len(self.counts)
        rows = torch.repeat_interleave(torch.arange(n), torch.tensor(self.counts))
        best = torch.full((n,), float("-inf")).scatter_reduce(0, rows, self.vals, "amax")
        top = self.vals == best[rows]
        first = torch.full((n,), self.vocab, dtype=torch.long)
        return first.scatter_reduce(0, rows[top], self.cols[top], "amin")
