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
