"""Starting the configured backend: the one entry the engine factory calls, whichever backend.

Each backend starts its own way and says how many KV blocks its pool takes: the ttnn launch
plans them from the device's DRAM (``tt/launch.py``); the torch backend sizes them from host
memory here. Backends are imported lazily, so ``import tt_serve.model.launch`` needs neither
torch nor ttnn.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tt_serve.model.interface import Launched

if TYPE_CHECKING:
    from tt_serve.config import ServeConfig
    from tt_serve.model.spec import ModelSpec

# Fraction of free host memory the KV pool may take when ``kv_blocks`` is 0.
HOST_MEMORY_FRACTION = 0.25
HOST_MEMORY_CAP = 8 << 30


def launch_backend(cfg: ServeConfig, spec: ModelSpec, max_model_len: int) -> Launched:
    """The configured backend with the checkpoint's weights loaded (pools not yet allocated)
    and the KV pool size to allocate."""
    if cfg.backend == "ttnn":
        from tt_serve.model.tt.launch import launch

        return launch(cfg, spec, max_model_len=max_model_len)
    if cfg.backend == "torch":
        from tt_serve.model.torch_backend import TorchBackend

        backend = TorchBackend.from_config(cfg, spec, max_model_len=max_model_len)
        return Launched(backend, host_kv_blocks(cfg, spec, max_model_len))
    raise ValueError(f"unknown backend {cfg.backend!r}; choose 'torch' or 'ttnn'")


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
