"""Turning device logits into the per-row results of a StepOutput (shared by both step paths)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tt_serve.model.draw import draw
from tt_serve.model.interface import RowSampling, StepOutput, StepRow
from tt_serve.model.torch.sampling import draw_rows, sliced
from tt_serve.model.torch.screen import MAX_TOP_K, ScreenedHead


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` [R, vocab] -> long [R], the same ids (the first maximum, NaN
    counting as the largest), at a CPU's reduction speed.

    On the CPU ``argmax`` is a scalar loop (2 cores, 248,320 entries: 0.26 ms a row, 6.7 ms at
    32 rows) while ``amax`` is vectorized: the maximum of each of about 128 equal slices, the
    first slice holding the row's maximum, then ``argmax`` inside that slice alone (0.09 ms a
    row, 1.1 ms at 32). Exact: a slice before the chosen one holds no value equal to the
    maximum, and inside it the first is taken. Elsewhere, or when the vocabulary has no
    divisor of a useful size, it is ``argmax``."""
    cut = sliced(logits, 128)
    if cut is None:
        return logits.argmax(dim=-1)
    first = cut.amax(dim=-1).argmax(dim=-1)  # [R] the first slice holding the maximum
    inner = cut[torch.arange(cut.shape[0], device=logits.device), first].argmax(dim=-1)
    return first * cut.shape[2] + inner


def pick_on_device(
    logits: torch.Tensor, rows: Sequence[StepRow], *, sync_free: bool = False
) -> torch.Tensor:
    """Each row's token from its logits [R, vocab]: argmax, or its ``RowSampling`` draw."""
    drawn = [n for n, r in enumerate(rows) if r.sampling is not None]
    if not drawn:
        return greedy_ids(logits)
    specs: list[RowSampling] = [s for r in rows if (s := r.sampling) is not None]
    ids = draw_rows(
        logits if len(drawn) == len(rows) else logits[drawn], specs, sync_free=sync_free
    )
    if len(drawn) == len(rows):
        return ids
    chosen = greedy_ids(logits)
    chosen[torch.tensor(drawn, device=logits.device)] = ids
    return chosen


def screens(row: StepRow, vocab: int) -> bool:
    """Whether a row's token can come from the screened head: it is picked on the device,
    asks for no logprobs, and is greedy or a top-k draw (a draw over the whole vocabulary needs
    every logit)."""
    s = row.sampling
    return (
        not row.want_logits
        and row.top_logprobs <= 0
        and (s is None or 0 < s.top_k < min(vocab, MAX_TOP_K + 1))
    )


def pick_screened(
    head: ScreenedHead, hidden: torch.Tensor, rows: Sequence[StepRow]
) -> torch.Tensor | None:
    """``pick_on_device`` for rows that ``screens``, from their hidden states [R, H] through
    the screened head: the same tokens as from the full fp32 logits. None when the hidden
    states are not finite (the caller uses the full head).

    A drawn row is drawn by the reference ``model.draw.draw`` over its candidates in
    id order: its top-k keeps the same tokens as over the whole vocabulary (every token at or
    above the k-th logit is a candidate), so top-p, min-p and the inverse CDF see the same
    values; numpy on a hundred-odd logits is cheaper than torch's per-op cost."""
    cands = head.candidates(hidden, [1 if r.sampling is None else r.sampling.top_k for r in rows])
    if cands is None:
        return None
    drawn = sum(r.sampling is not None for r in rows)
    if not drawn:
        return cands.greedy()
    # every row drawn (the usual sampled batch): no argmax to compute (0.1 ms at 8 rows)
    ids = cands.greedy() if drawn < len(rows) else torch.empty(len(rows), dtype=torch.long)
    picked, vals, cols = ids.numpy(), cands.vals.numpy(), cands.cols.numpy()  # views: no copies
    start = 0
    for n, (r, count) in enumerate(zip(rows, cands.counts, strict=True)):
        if r.sampling is not None:
            picked[n] = cols[start + draw(vals[start : start + count], r.sampling)]
        start += count
    return ids


def fill_logprobs(
    out: StepOutput,
    logits: torch.Tensor,
    chosen: torch.Tensor,
    row_ids: list[int],
    rows: tuple[StepRow, ...],
) -> int:
    """Logprobs of the chosen token plus the top-k for rows asking for them, computed on the
    device; returns the bytes that crossed to the host.

    logits [R, vocab] fp32 and chosen [R] belong to the rows ``row_ids`` (indices into rows).
    """
    k = max(rows[r].top_logprobs for r in row_ids)
    if k <= 0:
        return 0
    lp = torch.log_softmax(logits, dim=-1)
    chosen_lp_t = lp.gather(1, chosen[:, None])[:, 0]
    chosen_lp = chosen_lp_t.tolist()
    top_v, top_i = lp.topk(min(k, lp.shape[-1]), dim=-1)
    top_v_l, top_i_l, chosen_l = top_v.tolist(), top_i.tolist(), chosen.tolist()
    for n, r in enumerate(row_ids):
        want = rows[r].top_logprobs
        if want <= 0:
            continue
        d = {int(chosen_l[n]): float(chosen_lp[n])}
        for t, v in zip(top_i_l[n][:want], top_v_l[n][:want], strict=True):
            d.setdefault(int(t), float(v))
        out.logprobs[r] = d
    return sum(t.numel() * t.element_size() for t in (top_v, top_i, chosen_lp_t))
