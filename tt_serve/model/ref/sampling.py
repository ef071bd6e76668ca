"""Device draws of the torch backend: ``engine.sampler.draw`` in batched torch ops.

A row with ``RowSampling`` gets exactly the token the host reference picks from the same logits
and uniform (same kept set, same float64 inverse CDF over the kept tokens in id order), without
the logits leaving the device. Two ways to find the kept set, both exact:

* top-k rows whose k-th value has no ties outside the top k (nearly all of them) are drawn on
  their k candidates alone: one ``topk`` over the vocabulary, then work on [rows, k];
* every other row works on the whole vocabulary: top-p first looks for its nucleus among the
  ``TOP_P_CANDIDATES`` most likely tokens (as the host does), sorting the vocabulary only when
  the nucleus does not end inside them.

Both checks read a value on the host, which a captured CUDA graph or a pipelined step must not
do; ``sync_free`` skips them (whole-vocabulary path, a full stable sort for top-p rows): the
same tokens at a GPU's sort speed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tt_serve.model.interface import TOP_P_CANDIDATES, RowSampling

F64 = torch.float64


def draw_rows(
    logits: torch.Tensor, specs: Sequence[RowSampling], *, sync_free: bool = False
) -> torch.Tensor:
    """The drawn token of each row of ``logits`` [R, vocab] (fp32) under ``specs`` (one per
    row): long [R] on the logits' device."""
    rows, vocab = logits.shape
    if rows != len(specs):
        raise ValueError(f"{rows} logit rows for {len(specs)} sampling specs")
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    small = [] if sync_free else _topk_rows(logits, specs)
    if small:
        sel = torch.tensor(small, device=logits.device)
        out[sel] = _draw_topk(logits[sel], [specs[i] for i in small])
    done = set(small)
    rest = [i for i in range(rows) if i not in done]
    if rest:
        sel = torch.tensor(rest, device=logits.device)
        out[sel] = _draw_full(logits[sel], [specs[i] for i in rest], sync_free=sync_free)
    return out


def _topk_rows(logits: torch.Tensor, specs: Sequence[RowSampling]) -> list[int]:
    """Rows with 0 < top_k < vocab whose k-th value is tied with no token outside the top k."""
    vocab = logits.shape[1]
    cand = [i for i, s in enumerate(specs) if 0 < s.top_k < vocab]
    if not cand:
        return []
    sel = torch.tensor(cand, device=logits.device)
    ks = torch.tensor([specs[i].top_k for i in cand], device=logits.device)
    x = logits[sel]
    kth = x.topk(int(ks.max()), dim=-1).values.gather(1, (ks - 1)[:, None])
    untied = ((x >= kth).sum(dim=-1) == ks).tolist()
    return [i for i, ok in zip(cand, untied, strict=True) if ok]


def _draw_topk(logits: torch.Tensor, specs: Sequence[RowSampling]) -> torch.Tensor:
    """Rows whose kept set lies in their top k: every step on [R, max k] candidates."""
    dev = logits.device
    ks = torch.tensor([s.top_k for s in specs], device=dev)
    kmax = int(ks.max())
    top, cand = logits.topk(kmax, dim=-1)
    ids, _ = cand.sort(dim=-1)  # candidates in id order (the draw's order)
    vals = logits.gather(1, ids)
    # A row keeps its own k largest (no ties outside them: ``_topk_rows``), also when k < kmax.
    valid = vals >= top.gather(1, (ks - 1)[:, None])
    x = vals.to(F64) / _col(specs, "temperature", dev)
    x = torch.where(valid, x, -torch.inf)
    probs, keep = _rules(x, valid, specs)
    return ids.gather(1, _inverse_cdf(probs, keep, specs)[:, None])[:, 0]


def _draw_full(
    logits: torch.Tensor, specs: Sequence[RowSampling], *, sync_free: bool
) -> torch.Tensor:
    """Rows drawn over the whole vocabulary (column = token id)."""
    dev = logits.device
    vocab = logits.shape[1]
    x = logits.to(F64) / _col(specs, "temperature", dev)
    ks = [s.top_k if 0 < s.top_k < vocab else vocab for s in specs]
    valid = torch.ones_like(x, dtype=torch.bool)
    if min(ks) < vocab:
        k = torch.tensor(ks, device=dev)
        kth = x.topk(int(k.max()), dim=-1).values.gather(1, (k - 1).clamp(max=vocab - 1)[:, None])
        valid = (x >= kth) | (k == vocab)[:, None]
        x = torch.where(valid, x, -torch.inf)
    probs, keep = _rules(x, valid, specs, sync_free=sync_free)
    return _inverse_cdf(probs, keep, specs)


def _rules(
    x: torch.Tensor, valid: torch.Tensor, specs: Sequence[RowSampling], *, sync_free: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalised probabilities and the kept mask after min-p and top-p (columns in id
    order; ``valid``: what top-k kept)."""
    dev = x.device
    probs = torch.exp(x - x.max(dim=-1, keepdim=True).values)  # the largest is exactly 1
    keep = valid
    min_p = _col(specs, "min_p", dev)
    keep = keep & ((probs >= min_p) | (min_p <= 0))
    probs = torch.where(keep, probs, 0.0)
    nucleus = [i for i, s in enumerate(specs) if s.top_p < 1.0]
    if nucleus:
        sel = torch.tensor(nucleus, device=dev)
        top_p = _col([specs[i] for i in nucleus], "top_p", dev)
        cut = _nucleus(probs[sel], top_p, sync_free=sync_free)
        keep = keep.index_put((sel,), keep[sel] & cut)
        probs = torch.where(keep, probs, 0.0)
    return probs, keep


def _nucleus(probs: torch.Tensor, top_p: torch.Tensor, *, sync_free: bool) -> torch.Tensor:
    """The top-p mask: the smallest prefix by descending probability (ties by id) whose mass
    reaches top_p of the row's."""
    target = top_p * probs.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(probs, dtype=torch.bool)
    todo = list(range(probs.shape[0]))
    vocab = probs.shape[1]
    if not sync_free:
        for m in TOP_P_CANDIDATES:
            if not todo or vocab <= 2 * m:
                break
            sel = torch.tensor(todo, device=probs.device)
            vals, cand = probs[sel].topk(m + 1, dim=-1)
            floor = vals[:, m]
            cand, _ = cand[:, :m].sort(dim=-1)  # id order, then a stable sort by probability
            order = probs[sel].gather(1, cand).argsort(dim=-1, descending=True, stable=True)
            cand = cand.gather(1, order)
            cvals = probs[sel].gather(1, cand)
            cut = torch.searchsorted(cvals.cumsum(dim=-1), target[sel]) + 1
            last = cvals.gather(1, (cut - 1).clamp(max=m - 1))
            ok = ((cut < m) & (last > floor[:, None]))[:, 0]
            for n in ok.nonzero()[:, 0].tolist():
                row = todo[n]
                out[row, cand[n, : int(cut[n, 0])]] = True
            todo = [r for n, r in enumerate(todo) if not bool(ok[n])]
    if todo:
        sel = torch.tensor(todo, device=probs.device)
        p = probs[sel]
        order = p.argsort(dim=-1, descending=True, stable=True)
        cut = torch.searchsorted(p.gather(1, order).cumsum(dim=-1), target[sel]) + 1
        ranked = torch.arange(vocab, device=probs.device)[None, :] < cut
        out[sel] = torch.zeros_like(ranked).scatter(1, order, ranked)
    return out


def _inverse_cdf(
    probs: torch.Tensor, keep: torch.Tensor, specs: Sequence[RowSampling]
) -> torch.Tensor:
    """Column of the first kept token whose cumulative probability exceeds uniform x total
    (the last kept one when rounding puts the threshold at the total)."""
    dev = probs.device
    cdf = probs.cumsum(dim=-1)
    threshold = _col(specs, "uniform", dev) * cdf[:, -1:]
    col = torch.searchsorted(cdf, threshold, right=True)[:, 0]
    width = probs.shape[1]
    last = width - 1 - keep.flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.where(col < width, col, last)


def _col(specs: Sequence[RowSampling], name: str, device: torch.device) -> torch.Tensor:
    return torch.tensor([[float(getattr(s, name))] for s in specs], dtype=F64, device=device)
