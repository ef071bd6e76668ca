"""The draw of a sampled token: the definition every device draw equals (numpy only).

``draw(logits, RowSampling)`` is what the host sampler (``engine/sampler.py``) picks with, and
what the torch backend's device draws (``torch/sampling.py``) and its screened LM head
(``torch/outputs.py``, over a row's candidate logits) are tested equal to.
"""

from __future__ import annotations

import numpy as np

from tt_serve.model.interface import TOP_P_CANDIDATES, RowSampling


def draw(logits: np.ndarray, s: RowSampling) -> int:
    """The token ``s`` picks from ``logits`` [vocab]: the definition every device draw equals.

    Inverse CDF with the row's uniform over the kept tokens in vocabulary order (float64), so a
    draw is reproducible from the request's seed alone."""
    ids, probs = _kept(logits.astype(np.float64) / s.temperature, s)
    cdf = np.cumsum(probs)
    total = cdf[-1] if cdf.size else 0.0
    if not np.isfinite(total) or total <= 0.0:
        return int(np.argmax(logits))
    idx = int(np.searchsorted(cdf, s.uniform * total, side="right"))
    return int(ids[min(idx, ids.size - 1)])


def _kept(x: np.ndarray, params: RowSampling) -> tuple[np.ndarray, np.ndarray]:
    """The tokens top-k, min-p and top-p keep (ids, ascending) and their unnormalised
    probabilities.

    Exactly the full computation's set: top-k keeps every token tied with the k-th value;
    top-p keeps the smallest prefix of the tokens ordered by probability, ties by id (a stable
    sort), whose mass reaches top_p of the total. The nucleus is searched among the
    TOP_P_CANDIDATES most likely tokens, and accepted only if it ends on a probability above
    every token outside them; otherwise the whole vocabulary is sorted."""
    vocab = x.shape[0]
    ids = np.arange(vocab)
    if 0 < params.top_k < vocab:
        kth = np.partition(x, vocab - params.top_k)[vocab - params.top_k]
        ids = np.flatnonzero(x >= kth)
        x = x[ids]
    probs = np.exp(x - np.max(x))
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs.max()
        ids, probs = ids[keep], probs[keep]
    if params.top_p >= 1.0:
        return ids, probs
    target = params.top_p * probs.sum()
    for m in TOP_P_CANDIDATES:
        if probs.shape[0] <= 2 * m:
            break
        part = np.argpartition(-probs, m)
        cand, floor = part[:m], probs[part[m]]
        # stable order among the candidates: by probability, then by id
        cand = cand[np.lexsort((ids[cand], -probs[cand]))]
        cut = int(np.searchsorted(np.cumsum(probs[cand]), target)) + 1
        if cut < m and probs[cand[cut - 1]] > floor:
            return _by_id(ids, probs, cand[:cut])
    order = np.argsort(-probs, kind="stable")
    cut = int(np.searchsorted(np.cumsum(probs[order]), target)) + 1
    return _by_id(ids, probs, order[:cut])


def _by_id(ids: np.ndarray, probs: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.sort(keep)  # ids ascend with their positions
    return ids[keep], probs[keep]
