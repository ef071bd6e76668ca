"""Fixed shapes shared by the traced backends (CUDA graphs in ``torch/cuda/``, ttnn traces in
``tt/``): a captured program has fixed shapes, so every step is fitted into the smallest bucket
that holds it, and every block table is padded to one fixed width. No torch, no ttnn."""

from __future__ import annotations

from collections.abc import Sequence

from tt_serve.model.interface import PAD_BLOCK, StepRow, blocks_needed


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


def prefill_buckets(max_chunk: int, step: int, *, unit: str) -> tuple[int, ...]:
    """The prefill ladder: ``step``·2^k below ``max_chunk``, then ``max_chunk``; the small
    buckets keep a warm tail or a short prompt from paying for a whole chunk.

    Every bucket is a whole number of ``step``-token units, ``unit`` in errors: the GDN scan
    chunk for the torch graphs (padded chunks keep the scan grid), the KV block for the ttnn
    traces (a bucket fills whole pages; the pools hold blocks to the 32-row tile). So
    ``max_chunk`` must be a positive multiple of ``step``."""
    if max_chunk < step or max_chunk % step:
        raise ValueError(
            f"the largest prefill bucket ({max_chunk}) must be a positive multiple of {unit} "
            f"({step}): every bucket is a whole number of them"
        )
    return doubling(step, max_chunk)


def choose_bucket(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket holding n (tokens or rows)."""
    for b in sorted(buckets):
        if b >= n:
            return b
    if not buckets:
        raise NoBucket(f"no bucket captured for {n}")  # e.g. decode graphs, prefill eager
    raise NoBucket(f"{n} exceeds the largest bucket {max(buckets)}")


def fit_table(
    row: StepRow, width: int, *, block_size: int | None = None, held_by: str
) -> list[int]:
    """``row``'s block table at the programs' fixed ``width``, padded with ``PAD_BLOCK``.

    With ``block_size`` it is cut to the blocks the row's positions reach (``blocks_needed``:
    the torch graphs); without, only its trailing padding is dropped (the ttnn traces keep
    every real block of the row). Raises NoBucket (a ValueError) when the blocks kept exceed
    ``width``; ``held_by`` names the programs in that message ("graphs", "traces")."""
    table = row.block_table
    if block_size is None:
        need = len(table)
        while need and table[need - 1] == PAD_BLOCK:
            need -= 1
    else:
        need = blocks_needed(row, block_size)
    if need > width:
        raise NoBucket(f"seq {row.seq_id} needs {need} blocks; {held_by} hold {width}")
    return list(table[:need]) + [PAD_BLOCK] * (width - need)
