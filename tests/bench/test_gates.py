"""What a gate rules out: the rule of three with no defect, Clopper-Pearson with some."""

from __future__ import annotations

import math

import pytest

from bench.common import gates


def test_rule_of_three_and_the_default_target() -> None:
    assert gates.clean_needed() == 384 and gates.excluded_rate(384, 0) == 3 / 384 == 1 / 128
    assert gates.statement(384, 0) == "384 clean of 384: excludes 1/128 at 95%"
    assert gates.report(384, 0)["excludes_target"] and not gates.report(383, 0)["excludes_target"]
    # 3/n is the conservative side of the exact bound 1 - 0.05^(1/n).
    assert 1 - 0.05 ** (1 / 384) < gates.excluded_rate(384, 0) < 1.01 * (1 - 0.05 ** (1 / 384))


@pytest.mark.parametrize(
    ("n", "k", "want"), [(384, 1, 4.744 / 384), (384, 3, 7.754 / 384), (32, 0, 3 / 32)]
)
def test_clopper_pearson(n: int, k: int, want: float) -> None:
    got = gates.excluded_rate(n, k)
    assert math.isclose(got, want, rel_tol=1e-2), (got, want)  # want: the Poisson limit
    # At the bound, k or fewer defects are exactly as rare as the confidence says.
    if k:
        assert math.isclose(gates._binom_cdf(k, n, got), 0.05, rel_tol=1e-6)


def test_more_defects_exclude_less() -> None:
    rates = [gates.excluded_rate(384, k) for k in range(6)]
    assert rates == sorted(rates) and gates.excluded_rate(0, 0) == 1.0
    assert gates.statement(10, 3) == "7 clean of 10: excludes a rate of 61% at 95%"
    # A 32-request check passes a 1/128 defect about 78% of the time (the figure).
    assert math.isclose((1 - 1 / 128) ** 32, 0.778, abs_tol=1e-3)
