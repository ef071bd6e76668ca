"""Starting the configured backend: the one entry the engine factory calls, whichever backend.

Each backend starts its own way and says how many KV blocks its pool takes: the ttnn launch
plans them from the device's DRAM (``tt/launch.py``); the torch backend sizes them from host
memory (``torch/launch.py``). Backends are imported lazily, so ``import tt_serve.model.launch``
needs neither torch nor ttnn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tt_serve.model.interface import Launched

if TYPE_CHECKING:
    from tt_serve.config import ServeConfig
    from tt_serve.model.spec import ModelSpec


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
        return Launched(backend, host_kv_blocks(cfg, spec, max_model_len))
    raise ValueError(f"unknown backend {cfg.backend!r}; choose 'torch' or 'ttnn'")
