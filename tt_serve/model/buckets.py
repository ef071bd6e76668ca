"""Fixed-shape buckets shared by the traced backends (CUDA graphs in ``cuda/``, ttnn traces in
``tt/``): a captured program has fixed shapes, so every step is fitted into the smallest bucket
that holds it. No torch, no ttnn."""

from __future__ import annotations

from collections.abc import Sequence


class NoBucket(ValueError):
    """The step does not fit any captured bucket."""


def doubling(start: int, top: int) -> tuple[int, ...]:
    """start, 2·start, 4·start, ... below ``top``, then ``top`` itself (always the last)."""
    out, b = [], start
    while b < top:
        out.append(b)
        b *= 2
    out.append(top)
    return tuple(out)


def choose_bucket(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket holding n (tokens or rows)."""
    for b in sorted(buckets):
        if b >= n:
            return b
    if not buckets:
        raise NoBucket(f"no bucket captured for {n}")  # e.g. decode graphs, prefill eager
    raise NoBucket(f"{n} exceeds the largest bucket {max(buckets)}")
