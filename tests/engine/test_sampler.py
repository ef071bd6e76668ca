"""The host sampler's bounded selection keeps exactly what the full computation keeps.

The oracle is the textbook computation over the whole vocabulary: mask below the k-th value,
softmax, drop below min_p x max, sort by probability (stable, so ties go by id) and keep the
smallest prefix whose mass reaches top_p. The sampler must keep the same ids with the same
probabilities on peaked distributions (nucleus among the first candidates), flat ones (the
fallback sort), and ties at the top-k and nucleus boundaries; its draws must follow those
probabilities (chi-square), and a seed must give the same tokens.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from tt_serve.engine import sampler
from tt_serve.model import draw as model_draw
from tt_serve.sequence import SamplingParams

VOCAB = 248320  # the Qwen3.5 vocabulary: the size the bounded path exists for


def oracle(x: np.ndarray, p: SamplingParams) -> dict[int, float]:
    """Kept id -> unnormalised probability, over the whole vocabulary."""
    x = x.copy()
    vocab = x.shape[0]
    if 0 < p.top_k < vocab:
        kth = np.sort(x)[vocab - p.top_k]
        x[x < kth] = -np.inf
    probs = np.exp(x - np.max(x))
    if p.min_p > 0:
        probs[probs < p.min_p * probs.max()] = 0.0
    keep = probs > 0
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        cut = int(np.searchsorted(cum, p.top_p * probs.sum())) + 1
        keep = np.zeros(vocab, dtype=bool)
        keep[order[:cut]] = True
    return {int(i): float(probs[i]) for i in np.flatnonzero(keep & (probs > 0))}


def logits_of(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "peaked":  # a trained model's shape: a few dominant tokens over a long tail
        x = rng.normal(0, 2, VOCAB)
        x[rng.choice(VOCAB, 20, replace=False)] += rng.uniform(12, 18, 20)
        return x
    if kind == "random":  # a random-weight model (the demo): logit std ~3, a wide nucleus
        return rng.normal(0, 3, VOCAB)
    if kind == "flat":  # near-uniform: the nucleus spans most of the vocabulary
        return rng.normal(0, 0.05, VOCAB)
    # heavy ties: values on a coarse grid, many tokens equal at every boundary
    return np.round(rng.normal(0, 2, VOCAB) * 2) / 2


def _name(p: SamplingParams) -> str:
    return f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}"


SETTINGS = [
    SamplingParams(temperature=0.7, top_p=0.9, top_k=20),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=1.0, top_p=0.95),
    SamplingParams(temperature=1.0, top_k=50),
    SamplingParams(temperature=1.3, min_p=0.05),
    SamplingParams(temperature=1.0, min_p=0.02, top_p=0.9),
    SamplingParams(temperature=1.0),
]


@pytest.mark.parametrize("kind", ["peaked", "random", "flat", "ties"])
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: _name(p))
def test_kept_set_equals_the_full_computation(kind: str, params: SamplingParams) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{kind} {params}".encode()))
    for _ in range(2):
        x = logits_of(kind, rng) / params.temperature
        ids, probs = model_draw._kept(x, params)
        got = dict(zip(ids.tolist(), probs.tolist(), strict=True))
        want = oracle(x, params)
        assert got.keys() == want.keys()
        assert all(got[i] == want[i] for i in want)  # the same float64 values, not close ones


def test_every_nucleus_path_is_exercised() -> None:
    """Peaked logits find their top-p nucleus among the first candidates, a random model's
    among the second, flat ones need the full sort (so the equality above covers all three)."""
    rng = np.random.default_rng(0)
    p = SamplingParams(temperature=1.0, top_p=0.9)
    first, second = model_draw.TOP_P_CANDIDATES
    sizes = [model_draw._kept(logits_of(k, rng), p)[0].size for k in ("peaked", "random", "flat")]
    assert sizes[0] < first < sizes[1] < second < sizes[2], sizes


def _chi_square_bound(df: int, z: float = 3.72) -> float:
    """Wilson-Hilferty upper quantile of chi-square(df) at z sigma (3.72: p = 1e-4)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * np.sqrt(c)) ** 3


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=1.0, top_k=20),
        SamplingParams(temperature=1.0, top_p=0.95, min_p=0.01),
    ],
    ids=lambda p: _name(p),
)
def test_draws_follow_the_kept_distribution(params: SamplingParams) -> None:
    # 8192 entries (still past the first candidate count): 20000 draws stay cheap
    raw = np.random.default_rng(7).normal(0, 3, 8192).astype(np.float32)
    want = oracle(raw.astype(np.float64) / params.temperature, params)
    ids = np.array(sorted(want))
    expected = np.array([want[i] for i in ids])
    expected /= expected.sum()
    rng, n = sampler.make_rng(11), 20000
    draws = [sampler.sample(raw, params, rng, [], []) for _ in range(n)]
    assert set(draws) <= set(ids.tolist())  # nothing outside the kept set, ever
    counts = np.array([draws.count(int(i)) for i in ids], dtype=np.float64)
    stat = float(((counts - n * expected) ** 2 / (n * expected)).sum())
    assert stat < _chi_square_bound(len(ids) - 1), (stat, len(ids))


def test_seeded_draws_repeat() -> None:
    raw = np.random.default_rng(3).normal(0, 3, VOCAB).astype(np.float32)
    p = SamplingParams(temperature=0.7, top_p=0.9, top_k=20)

    def draws(seed: int) -> list[int]:
        rng = sampler.make_rng(seed)
        return [sampler.sample(raw, p, rng, [], []) for _ in range(32)]

    assert draws(5) == draws(5) and draws(5) != draws(6)
