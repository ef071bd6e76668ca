"""Build a running engine from the one configuration: spec -> backend -> pool sizes -> Engine.

The model spec is read once here and handed down to the backend; every option comes from
``ServeConfig`` (``tt_serve/config/serve_config.py``), where the defaults live. Backends are
imported lazily, so ``engine/`` stays importable without torch or ttnn.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from tt_serve.config.serve_config import ServeConfig
from tt_serve.engine.engine import Engine, EngineConfig, TextStreamFactory
from tt_serve.engine.scheduler import SchedulerConfig

if TYPE_CHECKING:
    from tt_serve.model.interface import Backend
    from tt_serve.model.spec import ModelSpec
    from tt_serve.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# Fraction of free host memory the KV pool may take when ``kv_blocks`` is 0.
HOST_MEMORY_FRACTION = 0.25
HOST_MEMORY_CAP = 8 << 30


def load_backend(cfg: ServeConfig, spec: ModelSpec, max_model_len: int) -> Backend:
    """The configured backend with the checkpoint's weights loaded (pools not yet allocated)."""
    if cfg.backend == "torch":
        from tt_serve.model.ref.backend import TorchBackend

        return TorchBackend.from_config(cfg, spec, max_model_len=max_model_len)
    if cfg.backend == "ttnn":
        from tt_serve.model.tt.backend import TTBackend

        return TTBackend.from_config(cfg, spec, max_model_len=max_model_len)
    raise ValueError(f"unknown backend {cfg.backend!r}; choose 'torch' or 'ttnn'")


def _available_memory() -> int:
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return 4 << 30


def num_kv_blocks(
    cfg: ServeConfig, spec: ModelSpec, max_model_len: int, backend: Backend | None = None
) -> int:
    """KV blocks including the padding block: ``cfg.kv_blocks``, or sized from memory.

    On ttnn the pool is sized from the device's DRAM by the same planner ``tt-serve plan`` runs
    (weights, GDN states, snapshots and traces first). Elsewhere enough KV for every running row
    to reach the full context is the ceiling; the host memory budget (a quarter of free host
    memory, capped, less the snapshot slots) usually wins."""
    if cfg.kv_blocks:
        return cfg.kv_blocks
    if cfg.backend == "ttnn" and backend is not None:
        from tt_serve.model.tt.backend import TTBackend
        from tt_serve.model.tt.planner import plan_pools

        assert isinstance(backend, TTBackend)
        plan_cfg = dataclasses.replace(cfg, max_model_len=max_model_len)
        device = backend.device_description().name
        return plan_pools(plan_cfg, spec, device, backend.ops.trace_region_size).num_kv_blocks
    dtype_bytes = 4 if cfg.resolved_dtype == "float32" else 2
    per_block = max(spec.kv_bytes_per_block(cfg.block_size, dtype_bytes), 1)
    per_snap = max(spec.state_bytes_per_slot(), 1)
    budget = int(min(_available_memory() * HOST_MEMORY_FRACTION, HOST_MEMORY_CAP))
    per_seq = -(-max_model_len // cfg.block_size)
    want = cfg.resolved_max_batch_size * per_seq + 1
    return max(per_seq + 1, min(want, (budget - cfg.num_snapshot_slots * per_snap) // per_block))


def build_engine(
    cfg: ServeConfig,
    *,
    spec: ModelSpec | None = None,
    tokenizer: Tokenizer | None = None,
) -> Engine:
    """Load the backend for ``cfg.model`` and build an engine whose pools are all allocated."""
    from tt_serve.model.spec import ModelSpec

    if cfg.model is None:
        raise ValueError("build_engine needs cfg.model (a checkpoint folder)")
    if spec is None:
        spec = ModelSpec.from_hf_dir(cfg.model)
    limit = spec.max_position_embeddings
    max_len = min(cfg.max_model_len or limit, limit)
    backend = load_backend(cfg, spec, max_len)
    blocks = num_kv_blocks(cfg, spec, max_len, backend)
    eos = set(spec.eos_token_ids)
    if tokenizer is not None:
        eos |= set(tokenizer.eos_token_ids)
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_batch=cfg.resolved_max_batch_size,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            chunk=cfg.prefill_chunk,
            block_size=cfg.block_size,
            mixed_steps=cfg.mixed_steps,
            device_argmax=cfg.device_argmax,
            device_sampling=cfg.device_sampling,
        ),
        num_kv_blocks=blocks,
        num_snapshot_slots=cfg.num_snapshot_slots,
        max_model_len=max_len,
        vocab_size=spec.vocab_size,
        eos_token_ids=frozenset(eos),
        prefix_caching=cfg.prefix_caching,
        cache_salt=f"{spec.model_id}|{cfg.resolved_dtype}".encode(),
    )
    streams: TextStreamFactory | None = None
    if tokenizer is not None:
        from tt_serve.engine.text import text_stream_factory

        streams = text_stream_factory(tokenizer)
    log.info(
        "engine: %d KV blocks x %d tokens, %d snapshot slots, chunk %d, max batch %d",
        blocks,
        cfg.block_size,
        cfg.num_snapshot_slots,
        cfg.prefill_chunk,
        cfg.resolved_max_batch_size,
    )
    return Engine(backend, config, text_streams=streams)
