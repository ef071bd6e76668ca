"""Turning device logits into the per-row results of a StepOutput (shared by both step paths)."""

from __future__ import annotations

import torch

from tt_serve.model.interface import StepOutput, StepRow


def fill_logprobs(
    out: StepOutput,
    logits: torch.Tensor,
    chosen: torch.Tensor,
    row_ids: list[int],
    rows: tuple[StepRow, ...],
) -> None:
    """Logprobs of the chosen token plus the top-k for rows asking for them.

    logits [R, vocab] fp32 and chosen [R] belong to the rows ``row_ids`` (indices into rows).
    """
    k = max(rows[r].top_logprobs for r in row_ids)
    if k <= 0:
        return
    lp = torch.log_softmax(logits, dim=-1)
    chosen_lp = lp.gather(1, chosen[:, None])[:, 0].tolist()
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
