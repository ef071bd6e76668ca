"""The torch backend's KV pool size: sized from host memory (the ttnn launch plans its pool
from the device's DRAM instead, ``tt/launch.py``). ``model/launch.py`` calls it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tt_serve.config import ServeConfig
    from tt_serve.model.spec import ModelSpec

# Fraction of free host memory the KV pool may take when ``kv_blocks`` is 0.
HOST_MEMORY_FRACTION = 0.25
HOST_MEMORY_CAP = 8 << 30


def _available_memory() -> int:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return 4 << 30


def host_kv_blocks(cfg: ServeConfig, spec: ModelSpec, max_model_len: int) -> int:
    """KV blocks including the padding block for a host-memory pool: ``cfg.kv_blocks``, or
    enough for every running row to reach the full context, bounded by the host memory budget
    (a quarter of free host memory, capped, less the snapshot slots), which usually wins."""
    if cfg.kv_blocks:
        return cfg.kv_blocks
    dtype_bytes = 4 if cfg.resolved_dtype == "float32" else 2
    per_block = max(spec.kv_bytes_per_block(cfg.block_size, dtype_bytes), 1)
    per_snap = max(spec.state_bytes_per_slot(), 1)
    budget = int(min(_available_memory() * HOST_MEMORY_FRACTION, HOST_MEMORY_CAP))
    per_seq = -(-max_model_len // cfg.block_size)
    want = cfg.resolved_max_batch_size * per_seq + 1
    return max(per_seq + 1, min(want, (budget - cfg.num_snapshot_slots * per_snap) // per_block))
