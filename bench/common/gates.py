"""What a pass/fail gate rules out: the defect rate it excludes at a confidence, from the number
of clean comparisons it made.

A gate that compares n answers and finds k defects bounds the true defect rate p from above:
with no defect the rule of three, p < 3/n at 95 % (the exact one-sided bound is
1 - 0.05^(1/n), a little lower: 3/n is the conservative statement); with k > 0 the one-sided
Clopper-Pearson bound, the p at which seeing k or fewer defects has probability 5 %. The known
hybrid-cache defect that motivated the project was about 1 answer in 128: ruling it out needs
n >= 384 clean comparisons (3/384 = 1/128).
"""

from __future__ import annotations

import math

TARGET_RATE = 1 / 128
"""The defect rate the default equivalence run must exclude."""


def clean_needed(rate: float = TARGET_RATE) -> int:
    """Clean comparisons that exclude ``rate`` at 95 % (the rule of three)."""
    return math.ceil(3 / rate)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
        for i in range(k + 1)
    ]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def excluded_rate(n: int, defects: int, confidence: float = 0.95) -> float:
    """The defect rate at and above which ``defects`` in ``n`` comparisons would be this rare:
    3/n with none (the rule of three, at 95 %), else the one-sided Clopper-Pearson bound."""
    if n <= 0 or defects >= n:
        return 1.0
    if defects == 0 and math.isclose(confidence, 0.95):
        return min(1.0, 3 / n)
    alpha = 1 - confidence
    lo, hi = defects / n, 1.0
    for _ in range(200):  # bisection: the CDF falls as p grows
        mid = (lo + hi) / 2
        if _binom_cdf(defects, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def statement(n: int, defects: int) -> str:
    """The gate's claim in words, e.g. "384 clean of 384: excludes 1/128 at 95%"."""
    rate = excluded_rate(n, defects)
    clean = n - defects
    if rate >= 1.0:
        return f"{clean} clean of {n}: excludes nothing"
    if rate > 0.1:
        return f"{clean} clean of {n}: excludes a rate of {rate:.0%} at 95%"
    return f"{clean} clean of {n}: excludes 1/{math.floor(1 / rate)} at 95%"


def report(n: int, defects: int) -> dict[str, object]:
    """The fields a gate's JSON carries."""
    rate = excluded_rate(n, defects)
    return {
        "comparisons": n,
        "defects": defects,
        "clean": n - defects,
        "excluded_rate": rate,
        "excludes": statement(n, defects),
        "excludes_target": rate <= TARGET_RATE,
    }
