"""Host-side sampling, and the reference every device draw equals.

Greedy rows and plain temperature / top-k / top-p / min-p rows are picked on the device (argmax,
or a draw by ``model.interface.RowSampling``) and return ids only; ``draw`` is the definition
those device draws implement. Rows with penalties or a grammar, rows a backend cannot draw, and
every row when device sampling is off come here with their float32 logits.
Logprobs are always those of the model's raw distribution (log_softmax of the unprocessed
logits), so a token's logprob does not depend on which path picked it. A constrained row's
grammar bitmask is applied after the penalties and before any sampling rule, so every rule
(greedy, top-k, top-p, min-p) only ever sees allowed tokens.

numpy only: ``engine/`` must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tt_serve.logprobs import top_logprobs
from tt_serve.model.draw import draw
from tt_serve.model.interface import RowSampling
from tt_serve.sequence import SamplingParams

__all__ = [
    "apply_penalties",
    "apply_token_bitmask",
    "draw",
    "make_rng",
    "row_sampling",
    "sample",
    "top_logprobs",
]


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


def apply_token_bitmask(logits: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """A copy of ``logits`` with every token the bitmask bans at -inf.

    ``bitmask``: int32 words, bit ``i % 32`` of word ``i // 32`` set when token ``i`` is allowed
    (the layout of xgrammar and llguidance); ids past the mask's end are banned."""
    allowed = np.unpackbits(bitmask.view(np.uint8), bitorder="little").view(np.bool_)
    vocab = logits.shape[0]
    out = np.full(vocab, -np.inf, dtype=np.float32)
    n = min(vocab, allowed.shape[0])
    np.copyto(out[:n], logits[:n], where=allowed[:n])
    return out


def sample(
    raw_logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    bitmask: np.ndarray | None = None,
) -> int:
    """Pick one token: penalties, the grammar's bitmask (if any), then argmax or ``draw`` with
    one uniform from ``rng`` (drawn for every non-argmax token, as the device path does)."""
    logits = apply_penalties(raw_logits, params, prompt_ids, output_ids)
    # Extreme penalties can overflow to +-inf; keep the order, drop the infinities.
    big = float(np.finfo(np.float32).max)
    logits = np.nan_to_num(logits, nan=-big, posinf=big, neginf=-big)
    if bitmask is not None:
        # Banned tokens go to -inf, below every finite (even penalised) logit: probability 0
        # for every rule. An all-banned mask is the engine's to refuse (a grammar error).
        logits = apply_token_bitmask(logits, bitmask)
    if params.argmax:
        return int(np.argmax(logits))
    return draw(logits, row_sampling(params, float(rng.random())))


def row_sampling(params: SamplingParams, uniform: float) -> RowSampling:
    """A non-argmax request's rules with this token's uniform (the device path's row input)."""
    return RowSampling(params.temperature, params.top_k, params.top_p, params.min_p, uniform)
