"""Host-side sampling for rows that are not plain greedy.

Greedy rows never reach this module: the backend picks them on the device (argmax) and returns
ids only. Rows with temperature > 0, or with penalties, come here with their float32 logits.
Logprobs are always those of the model's raw distribution (log_softmax of the unprocessed
logits), so a token's logprob does not depend on which path picked it.

numpy only: ``engine/`` must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tt_serve.logprobs import top_logprobs
from tt_serve.sequence import SamplingParams

__all__ = ["apply_penalties", "make_rng", "sample", "top_logprobs"]

# Below this the scaled logits overflow float64; sampling is then greedy in all but name.
MIN_TEMPERATURE = 1e-5


def make_rng(seed: int | None) -> np.random.Generator:
    """A per-request generator: the same seed gives the same tokens, whatever else runs."""
    return np.random.default_rng(seed)


def apply_penalties(
    logits: np.ndarray,
    params: SamplingParams,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> np.ndarray:
    """Repetition (prompt + output, HF/vLLM style), presence and frequency (output only)."""
    if not params.has_penalties:
        return logits
    out = logits.astype(np.float32, copy=True)
    vocab = out.shape[0]
    if params.repetition_penalty != 1.0:
        seen = np.unique(np.asarray([*prompt_ids, *output_ids], dtype=np.int64))
        seen = seen[(seen >= 0) & (seen < vocab)]
        vals = out[seen]
        with np.errstate(over="ignore", divide="ignore"):
            out[seen] = np.where(
                vals > 0, vals / params.repetition_penalty, vals * params.repetition_penalty
            )
    if output_ids and (params.presence_penalty != 0.0 or params.frequency_penalty != 0.0):
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        keep = (ids >= 0) & (ids < vocab)
        ids, counts = ids[keep], counts[keep]
        out[ids] -= params.frequency_penalty * counts.astype(np.float32)
        out[ids] -= params.presence_penalty
    return out


def sample(
    raw_logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> int:
    """Pick one token: penalties, then greedy or temperature / top-k / top-p / min-p."""
    logits = apply_penalties(raw_logits, params, prompt_ids, output_ids)
    # Extreme penalties can overflow to +-inf; keep the order, drop the infinities.
    big = float(np.finfo(np.float32).max)
    logits = np.nan_to_num(logits, nan=-big, posinf=big, neginf=-big)
    if params.greedy or params.temperature < MIN_TEMPERATURE:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / params.temperature
    vocab = x.shape[0]
    if 0 < params.top_k < vocab:
        kth = np.partition(x, vocab - params.top_k)[vocab - params.top_k]
        x = np.where(x < kth, -np.inf, x)
    x -= np.max(x)
    probs = np.exp(x)
    probs /= probs.sum()
    if params.min_p > 0.0:
        probs = np.where(probs < params.min_p * probs.max(), 0.0, probs)
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        sorted_probs = probs[order]
        cum = np.cumsum(sorted_probs)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        cut = int(np.searchsorted(cum, params.top_p * cum[-1])) + 1
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[:cut]] = True
        probs = np.where(mask, probs, 0.0)
    total = probs.sum()
    if not np.isfinite(total) or total <= 0.0:
        return int(np.argmax(logits))
    # Inverse-CDF draw with one uniform: reproducible from the seed alone.
    cdf = np.cumsum(probs / total)
    idx = int(np.searchsorted(cdf, rng.random(), side="right"))
    return min(idx, vocab - 1)
