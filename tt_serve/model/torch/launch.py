"""The torch backend's KV pool size: from host memory on the CPU, from the GPU's memory on CUDA
(the ttnn launch plans its pool from the device's DRAM instead, ``tt/launch.py``).
``model/launch.py`` calls it.

On CUDA the pool takes what the rest leaves of ``gpu_memory_utilization`` of the card, as
vLLM's ``--gpu-memory-utilization`` does: the weights are already loaded, one step of the
largest shape the engine schedules runs on a throwaway pool to measure its activations
(``TorchBackend.profile_step_memory``), and the budget keeps room for that peak twice, once for
the CUDA graphs' shared memory pool (captured after the KV pool exists, since the graphs hold its
addresses, and sized by their largest program) and once for a step that runs eagerly beside
them; the state and snapshot slots come off it too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tt_serve.config import ServeConfig
    from tt_serve.model.spec import ModelSpec
    from tt_serve.model.torch.backend import TorchBackend
    from tt_serve.model.torch.memory import DeviceMemory

# Fraction of free host memory the KV pool may take when ``kv_blocks`` is 0.
HOST_MEMORY_FRACTION = 0.25
HOST_MEMORY_CAP = 8 << 30
# Activation peaks kept back on CUDA: the graphs' pool and one eager step (module docstring).
ACTIVATION_PEAKS = 2


def _available_memory() -> int:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return 4 << 30


def _dtype_bytes(cfg: ServeConfig) -> int:
    return 4 if cfg.resolved_dtype == "float32" else 2


def host_kv_blocks(cfg: ServeConfig, spec: ModelSpec, max_model_len: int) -> int:
    """KV blocks including the padding block for a host-memory pool: ``cfg.kv_blocks``, or
    enough for every running row to reach the full context, bounded by the host memory budget
    (a quarter of free host memory, capped, less the snapshot slots), which usually wins."""
    if cfg.kv_blocks:
        return cfg.kv_blocks
    per_block = max(spec.kv_bytes_per_block(cfg.block_size, _dtype_bytes(cfg)), 1)
    per_snap = max(spec.state_bytes_per_slot(), 1)
    budget = int(min(_available_memory() * HOST_MEMORY_FRACTION, HOST_MEMORY_CAP))
    per_seq = -(-max_model_len // cfg.block_size)
    want = cfg.resolved_max_batch_size * per_seq + 1
    return max(per_seq + 1, min(want, (budget - cfg.num_snapshot_slots * per_snap) // per_block))


@dataclass(frozen=True)
class GpuSizing:
    """How a CUDA pool was sized (logged at startup, and what the tests check)."""

    total: int
    in_use: int  # weights, this process's other tensors and other processes, after the profile
    activation_peak: int  # one step of the largest scheduled shape
    slots: int  # state + snapshot slots
    per_block: int
    num_kv_blocks: int  # including the padding block


def gpu_kv_blocks(
    cfg: ServeConfig,
    spec: ModelSpec,
    backend: TorchBackend,
    max_model_len: int,
    memory: DeviceMemory,
) -> GpuSizing:
    """The CUDA pool: ``gpu_memory_utilization`` x the card, less what is in use, the
    activation peaks and the GDN slots, in KV blocks. Raises ValueError when that cannot hold
    one sequence of ``max_model_len`` tokens, naming the flags that change it."""
    rows = cfg.resolved_max_batch_size
    tokens = max(cfg.max_num_batched_tokens, cfg.prefill_chunk)
    peak = backend.profile_step_memory(
        rows=rows, tokens=tokens, block_size=cfg.block_size, memory=memory
    )
    free, total = memory.info()
    in_use = total - free
    per_block = max(spec.kv_bytes_per_block(cfg.block_size, _dtype_bytes(cfg)), 1)
    slot = spec.state_bytes_per_slot()
    slots = (rows + 1 + cfg.num_snapshot_slots) * slot  # + the scratch slot
    budget = int(cfg.gpu_memory_utilization * total) - in_use - ACTIVATION_PEAKS * peak - slots
    blocks = budget // per_block
    per_seq = -(-max_model_len // cfg.block_size)
    if blocks < per_seq + 1:
        gb = 1e9
        raise ValueError(
            f"the GPU's memory leaves {max(budget, 0) / gb:.2f} GB for the KV pool "
            f"({cfg.gpu_memory_utilization:g} x {total / gb:.1f} GB, {in_use / gb:.1f} GB in use, "
            f"{ACTIVATION_PEAKS} x {peak / gb:.2f} GB of activations, {slots / gb:.2f} GB of GDN "
            f"slots): one {max_model_len}-token sequence needs {(per_seq + 1) * per_block / gb:.2f}"
            " GB; raise --gpu-memory-utilization, or lower --max-model-len, --max-batch-size, "
            "--max-num-batched-tokens or --snapshot-slots"
        )
    return GpuSizing(total, in_use, peak, slots, per_block, int(blocks))
