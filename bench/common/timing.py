"""Timing helpers shared by the micro-benchmarks (side-by-side arms in one process)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(fn: Callable[[], object], calls: int, warmup: int = 3) -> float:
    """Median wall time of ``calls`` calls of ``fn`` in milliseconds, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def interleaved_ms(
    arms: dict[str, Callable[[], object]], calls: int, rounds: int
) -> dict[str, float]:
    """Each arm's median of per-round ``median_ms`` over ``rounds`` rounds, the arms run in
    alternating order (A B, B A, ...) so that machine noise hits them alike."""
    got: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for name in list(arms) if r % 2 == 0 else list(reversed(arms)):
            got[name].append(median_ms(arms[name], calls))
    return {k: statistics.median(v) for k, v in got.items()}
