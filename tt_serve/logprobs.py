"""Log-probabilities of the model's raw distribution (numpy only).

A leaf module: the engine's host sampler and the backends that compute logprobs on the host
both import it, so neither depends on the other.
"""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = np.max(x)
    return x - (m + np.log(np.sum(np.exp(x - m))))


def top_logprobs(raw_logits: np.ndarray, chosen: int, k: int) -> dict[int, float]:
    """{chosen: logprob} plus the k most likely tokens, from the raw distribution."""
    lp = log_softmax(raw_logits)
    out: dict[int, float] = {}
    if k > 0:
        top = np.argpartition(-lp, min(k, lp.shape[0] - 1))[:k]
        top = top[np.argsort(-lp[top], kind="stable")]
        out.update({int(t): float(lp[t]) for t in top})
    out[int(chosen)] = float(lp[chosen])
    return out
