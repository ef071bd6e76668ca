"""Starting the configured backend: the one entry the engine factory calls, whichever backend.

Each backend starts its own way and says how many KV blocks its pool takes: the ttnn launch
plans them from the device's DRAM (``tt/launch.py``); the torch backend sizes them from host
memory, or on CUDA from the GPU's (``torch/launch.py``). Backends are imported lazily, so ``import tt_serve.model.launch``
needs neither torch nor ttnn.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tt_serve.model.interface import Launched

if TYPE_CHECKING:
    from tt_serve.config import ServeConfig
    from tt_serve.model.spec import ModelSpec

log = logging.getLogger(__name__)


def launch_backend(cfg: ServeConfig, spec: ModelSpec, max_model_len: int) -> Launched:
    """The configured backend with the checkpoint's weights loaded (pools not yet allocated)
    and the KV pool size to allocate."""
    if cfg.backend == "ttnn":
        from tt_serve.model.tt.launch import launch

        return launch(cfg, spec, max_model_len=max_model_len)
    if cfg.backend == "torch":
        from tt_serve.model.torch.backend import TorchBackend
        from tt_serve.model.torch.launch import host_kv_blocks

        backend = TorchBackend.from_config(cfg, spec, max_model_len=max_model_len)
        if cfg.on_cuda and not cfg.kv_blocks:
            from tt_serve.model.torch.launch import gpu_kv_blocks
            from tt_serve.model.torch.memory import CudaMemory

            sizing = gpu_kv_blocks(cfg, spec, backend, max_model_len, CudaMemory(backend.device))
            log.info(
                "KV pool from GPU memory: %d blocks (%.2f GB) = %.2f x %.1f GB less %.1f GB in "
                "use, 2 x %.2f GB of activations and %.2f GB of GDN slots",
                sizing.num_kv_blocks,
                sizing.num_kv_blocks * sizing.per_block / 1e9,
                cfg.gpu_memory_utilization,
                sizing.total / 1e9,
                sizing.in_use / 1e9,
                sizing.activation_peak / 1e9,
                sizing.slots / 1e9,
            )
            return Launched(backend, sizing.num_kv_blocks)
        return Launched(backend, host_kv_blocks(cfg, spec, max_model_len))
    raise ValueError(f"unknown backend {cfg.backend!r}; choose 'torch' or 'ttnn'")
