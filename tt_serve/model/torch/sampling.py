"""Device draws of the torch backend: ``engine.sampler.draw`` in batched torch ops.

A row with ``RowSampling`` gets exactly the token the host reference picks from the same logits
and uniform (same kept set, same float64 inverse CDF over the kept tokens in id order), without
the logits leaving the device. Two ways to find the kept set, both exact:

* top-k rows whose k-th value has no ties outside their k + ``TIE_ROOM`` largest (nearly all
  of them, in bf16 too) are drawn on those candidates alone: one ``topk`` over the vocabulary,
  then work on [rows, k + TIE_ROOM] (the kept set: values >= the k-th, ties included);
* every other row works on the whole vocabulary: top-p first looks for its nucleus among the
  ``TOP_P_CANDIDATES`` most likely tokens (as the host does), sorting the vocabulary only when
  the nucleus does not end inside them.

Both checks read a value on the host, which a captured CUDA graph or a pipelined step must not
do; ``sync_free`` skips them (whole-vocabulary path, a full stable sort for top-p rows): the
same tokens at a GPU's sort speed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from tt_serve.model.interface import TOP_P_CANDIDATES, RowSampling

F64 = torch.float64
# Candidates past the largest k that a top-k row is drawn among: ties with the k-th value (bf16
# logits have many: 8 mantissa bits over 248,320 tokens) stay on the candidate path while they
# fit, rather than sending the row to the whole vocabulary (2x slower decode at 8 sampled rows).
TIE_ROOM = 32


def draw_rows(
    logits: torch.Tensor, specs: Sequence[RowSampling], *, sync_free: bool = False
) -> torch.Tensor:
    """The drawn token of each row of ``logits`` [R, vocab] (fp32) under ``specs`` (one per
    row): long [R] on the logits' device."""
    rows = logits.shape[0]
    if rows != len(specs):
        raise ValueError(f"{rows} logit rows for {len(specs)} sampling specs")
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    rest = list(range(rows))
    if not sync_free:
        small, top, cand = _untied_topk(logits, specs)
        if small:
            sel = torch.tensor(small, device=logits.device)
            out[sel] = _draw_topk(top, cand, [specs[i] for i in small])
            done = set(small)
            rest = [i for i in rest if i not in done]
    if rest:
        drawn = _draw_full(_take(logits, rest), [specs[i] for i in rest], sync_free=sync_free)
        out[torch.tensor(rest, device=logits.device)] = drawn
    return out


def _take(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Rows ``rows`` of ``t``; ``t`` itself when that is all of them (no [R, vocab] copy)."""
    if rows == list(range(t.shape[0])):
        return t
    return t[torch.tensor(rows, device=t.device)]


def largest(
    x: torch.Tensor,
    n: int,
    *,
    maxima: torch.Tensor | None = None,
    cut: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The n largest values of each row of x [R, vocab] with their ids, by descending value:
    the values of ``x.topk(n)`` exactly (ids may differ only among equal values), about 3x
    faster on the CPU (2 cores, 248,320 entries, n = 53: 0.24 against 0.81 ms at 1 row, 0.88
    against 2.9 ms at 8 rows, 4.6 against 11.9 ms at 32).

    The row is cut into about 512 equal slices; only the n slices with the largest maxima are
    searched. Exact: a value above the row's n-th largest lies in a slice whose maximum is
    above it, and fewer than n slices can have such a maximum; when more than n slices reach
    the n-th value, the n chosen ones hold at least n values that large. Elsewhere (CUDA, no
    divisor of a useful size, n too large for the cut to pay) it is ``topk``. ``maxima``: the
    slice maxima of ``sliced(x, 512)`` when the caller has them already; with ``cut`` (another
    equal slicing of x, [R, slices, width], e.g. finer: fewer values gathered) and its maxima,
    that slicing is searched instead."""
    if cut is None:
        cut = sliced(x, 512)
    elif maxima is None:
        raise ValueError("largest: a caller's cut comes with its maxima")
    if cut is None or 4 * n > cut.shape[1]:
        return x.topk(n, dim=-1)
    rows, per_row, width = cut.shape
    if maxima is None:
        maxima = cut.amax(dim=-1)
    best = maxima.topk(n, dim=-1).indices  # [R, n] slices
    whole = best + torch.arange(rows, device=x.device)[:, None] * per_row
    picked = x.view(rows * per_row, width).index_select(0, whole.reshape(-1))
    picked = picked.reshape(rows, n * width)
    vals, at = picked.topk(n, dim=-1)
    return vals, best.gather(1, at // width) * width + at % width


def sliced(x: torch.Tensor, slices: int) -> torch.Tensor | None:
    """x [R, vocab] viewed as [R, about ``slices``, width] equal slices, for the CPU's
    vectorized reductions (``amax``) to narrow a search before a scalar one; None off the CPU,
    for a non-contiguous x, or when vocab has no divisor of a useful size."""
    width = _slice_width(x.shape[1], slices)
    if x.device.type != "cpu" or width == 0 or not x.is_contiguous():
        return None
    return x.view(x.shape[0], x.shape[1] // width, width)


@functools.cache
def _slice_width(vocab: int, slices: int) -> int:
    """The divisor of ``vocab`` in [256, 8192] closest to vocab / slices (0: none)."""
    target = vocab / slices
    widths = [w for w in range(256, min(vocab, 8192) + 1) if vocab % w == 0]
    return min(widths, key=lambda w: abs(w - target), default=0)


def _untied_topk(
    logits: torch.Tensor, specs: Sequence[RowSampling]
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Rows with 0 < top_k < vocab whose k-th value is tied with no token outside the
    ``max k + TIE_ROOM`` largest (the next largest is smaller), with those candidates' values
    and ids: every token the row's top-k keeps (its k largest and their ties) is among them."""
    vocab = logits.shape[1]
    cand = [i for i, s in enumerate(specs) if 0 < s.top_k < vocab]
    if not cand:
        return [], logits[:0], logits[:0].long()
    ks = torch.tensor([specs[i].top_k for i in cand], device=logits.device)
    m = min(int(ks.max()) + TIE_ROOM, vocab - 1)
    top, ids = largest(_take(logits, cand), m + 1)
    untied = (top[:, m:] < top.gather(1, (ks - 1)[:, None]))[:, 0].tolist()
    keep = [n for n, ok in enumerate(untied) if ok]
    pick = torch.tensor(keep, device=logits.device, dtype=torch.long)
    return [cand[n] for n in keep], top[pick, :-1], ids[pick, :-1]


def _draw_topk(top: torch.Tensor, cand: torch.Tensor, specs: Sequence[RowSampling]) -> torch.Tensor:
    """Rows whose kept set is their top k (values ``top``, ids ``cand``, by descending value):
    every step on [R, max k] candidates."""
    dev = top.device
    ks = torch.tensor([s.top_k for s in specs], device=dev)
    ids, order = cand.sort(dim=-1)  # candidates in id order (the draw's order)
    vals = top.gather(1, order)
    # A row keeps its own k largest (none tied outside them), also when k < max k.
    keep = vals >= top.gather(1, (ks - 1)[:, None])
    x = torch.where(keep, vals.to(F64) / _col(specs, "temperature", dev), -torch.inf)
    probs, kept = _rules(x, keep, specs, sync_free=True)
    return ids.gather(1, _inverse_cdf(probs, kept, specs)[:, None])[:, 0]


def _draw_full(
    logits: torch.Tensor, specs: Sequence[RowSampling], *, sync_free: bool
) -> torch.Tensor:
    """Rows drawn over the whole vocabulary (column = token id)."""
    dev = logits.device
    vocab = logits.shape[1]
    x = logits.to(F64) / _col(specs, "temperature", dev)
    keep: torch.Tensor | None = None
    ks = [s.top_k if 0 < s.top_k < vocab else vocab for s in specs]
    if min(ks) < vocab:
        k = torch.tensor(ks, device=dev)
        kth = x.topk(int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])
        keep = (x >= kth) | (k == vocab)[:, None]
        x = torch.where(keep, x, -torch.inf)
    probs, keep = _rules(x, keep, specs, sync_free=sync_free)
    return _inverse_cdf(probs, keep, specs)


def _rules(
    x: torch.Tensor,
    keep: torch.Tensor | None,
    specs: Sequence[RowSampling],
    *,
    sync_free: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Unnormalised probabilities (zero where dropped) and the kept mask (None: every column)
    after min-p and top-p; columns in id order, ``keep``: what top-k kept."""
    dev = x.device
    probs = torch.exp(x - x.max(dim=-1, keepdim=True).values)  # the largest is exactly 1
    if any(s.min_p > 0.0 for s in specs):
        min_p = _col(specs, "min_p", dev)
        above = probs >= min_p
        keep = above if keep is None else keep & above
        probs = torch.where(above, probs, 0.0)
    nucleus = [i for i, s in enumerate(specs) if s.top_p < 1.0]
    if nucleus:
        top_p = _col([specs[i] for i in nucleus], "top_p", dev)
        cut = _nucleus(_take(probs, nucleus), top_p, sync_free=sync_free)
        if len(nucleus) < len(specs):
            sel = torch.tensor(nucleus, device=dev)
            cut = torch.ones_like(probs, dtype=torch.bool).index_put((sel,), cut)
        keep = cut if keep is None else keep & cut
        probs = torch.where(cut, probs, 0.0)
    return probs, keep


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor, *, sync_free: bool) -> torch.Tensor:
    """The top-p mask: the smallest prefix by descending probability (ties by id) whose mass
    reaches top_p of the row's."""
    target = top_p * probs.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(probs, dtype=torch.bool)
    todo = list(range(probs.shape[0]))
    vocab = probs.shape[1]
    for m in () if sync_free else TOP_P_CANDIDATES:
        if not todo or vocab <= 2 * m:
            break
        sel = torch.tensor(todo, device=probs.device)
        vals, cand = _take(probs, todo).topk(m + 1, dim=-1)
        floor = vals[:, m:]
        cand, order = cand[:, :m].sort(dim=-1)  # id order, then a stable sort by probability
        cvals = vals[:, :m].gather(1, order)
        rank = cvals.argsort(dim=-1, descending=True, stable=True)
        cand, cvals = cand.gather(1, rank), cvals.gather(1, rank)
        cut = torch.searchsorted(cvals.cumsum(dim=-1), target[sel]) + 1
        last = cvals.gather(1, (cut - 1).clamp(max=m - 1))
        ok = ((cut < m) & (last > floor))[:, 0].tolist()
        for n, row in enumerate(todo):
            if ok[n]:
                out[row, cand[n, : int(cut[n, 0])]] = True
        todo = [row for n, row in enumerate(todo) if not ok[n]]
    if todo:
        sel = torch.tensor(todo, device=probs.device)
        p = _take(probs, todo)
        order = p.argsort(dim=-1, descending=True, stable=True)
        cut = torch.searchsorted(p.gather(1, order).cumsum(dim=-1), target[sel]) + 1
        ranked = torch.arange(vocab, device=probs.device)[None, :] < cut
        out[sel] = torch.zeros_like(ranked).scatter(1, order, ranked)
    return out


def _inverse_cdf(
    probs: torch.Tensor, keep: torch.Tensor | None, specs: Sequence[RowSampling]
) -> torch.Tensor:
    """Column of the first kept token whose cumulative probability exceeds uniform x total
    (the last kept one when rounding puts the threshold at the total)."""
    dev = probs.device
    cdf = probs.cumsum(dim=-1)
    threshold = _col(specs, "uniform", dev) * cdf[:, -1:]
    col = torch.searchsorted(cdf, threshold, right=True)[:, 0]
    width = probs.shape[1]
    if keep is None:
        return col.clamp(max=width - 1)
    last = width - 1 - keep.flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.where(col < width, col, last)


def _col(specs: Sequence[RowSampling], name: str, device: torch.device) -> torch.Tensor:
    return torch.tensor([[float(getattr(s, name))] for s in specs], dtype=F64, device=device)
