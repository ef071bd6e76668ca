"""Build a running engine from the one configuration: spec -> launched backend -> Engine.

The model spec is read once here and handed down; ``model/launch.py`` starts whichever backend
is configured and says how large its KV pool is, so nothing here knows one backend from another.
Every option comes from ``ServeConfig`` (``tt_serve/config/serve_config.py``), where the
defaults live. Backends are imported lazily, so ``engine/`` stays importable without torch or
ttnn.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tt_serve.config.serve_config import ServeConfig
from tt_serve.engine.engine import Engine, EngineConfig, TextStreamFactory
from tt_serve.engine.scheduler import SchedulerConfig, TierPolicy

if TYPE_CHECKING:
    from tt_serve.model.interface import Launched
    from tt_serve.model.spec import ModelSpec
    from tt_serve.tokenizer import Tokenizer

log = logging.getLogger(__name__)
GIB = 1 << 30
MIB = 1 << 20


def build_engine(
    cfg: ServeConfig,
    *,
    spec: ModelSpec | None = None,
    tokenizer: Tokenizer | None = None,
    launched: Launched | None = None,
) -> Engine:
    """Load the backend for ``cfg.model`` and build an engine whose pools are all allocated.
    ``launched``: a backend already started for ``cfg`` (a bench's virtual device) instead."""
    from tt_serve.model.spec import ModelSpec

    if cfg.model is None:
        raise ValueError("build_engine needs cfg.model (a checkpoint folder)")
    if spec is None:
        spec = ModelSpec.from_hf_dir(cfg.model)
    limit = spec.max_position_embeddings
    max_len = min(cfg.max_model_len or limit, limit)
    from tt_serve.engine.cache_fingerprint import checkpoint_fingerprint
    from tt_serve.model.launch import launch_backend

    tiered = cfg.prefix_caching and cfg.disk_cache_dir is not None

    if launched is None:
        launched = launch_backend(cfg, spec, max_len)
    backend, blocks = launched.backend, launched.num_kv_blocks
    eos = set(spec.eos_token_ids)
    if tokenizer is not None:
        eos |= set(tokenizer.eos_token_ids)
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_batch=cfg.resolved_max_batch_size,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_prefill_rows=cfg.resolved_max_prefill_rows,
            measured_prefill_rows=cfg.measured_prefill_rows,
            chunk=cfg.prefill_chunk,
            block_size=cfg.block_size,
            mixed_steps=cfg.mixed_steps,
            device_argmax=cfg.device_argmax,
            device_sampling=cfg.device_sampling,
            resume_points=cfg.resume_points,
            message_start_ids=_message_start_ids(tokenizer),
        ),
        num_kv_blocks=blocks,
        num_snapshot_slots=cfg.num_snapshot_slots,
        max_model_len=max_len,
        vocab_size=spec.vocab_size,
        eos_token_ids=frozenset(eos),
        prefix_caching=cfg.prefix_caching,
        cache_salt=f"{spec.model_id}|{cfg.resolved_dtype}".encode(),
        snapshots_per_conversation=cfg.snapshots_per_conversation,
        host_cache_bytes=int(cfg.host_cache_gb * GIB) if cfg.prefix_caching else 0,
        disk_cache_dir=cfg.disk_cache_dir if cfg.prefix_caching else None,
        disk_cache_bytes=int(cfg.disk_cache_gb * GIB),
        cache_fingerprint=checkpoint_fingerprint(cfg, spec.model_id) if tiered else b"",
        tier_policy=TierPolicy(
            read_ahead_bytes=int(cfg.disk_read_ahead_mb * MIB),
            writeback=cfg.disk_writeback,
            write_bytes_per_s=int(cfg.disk_write_mb_per_s * MIB),
        ),
    )
    if cfg.host_cache_gb > 0 and cfg.backend == "torch" and cfg.device == "cpu":
        # The rule: on the CPU the device pool is host memory already.
        log.warning(
            "--host-cache-gb on the CPU keeps a second copy of the KV pool's units in the same "
            "RAM: a larger --kv-blocks holds more for the same memory; --disk-cache-dir is what "
            "keeps conversations across restarts"
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
    engine = Engine(backend, config, text_streams=streams)
    engine.probe_step_costs(cfg.step_probe_seconds)  # nothing to probe without a measured rule
    return engine


MESSAGE_START = "<|im_start|>"
"""The token that opens every chat message in the Qwen (ChatML) templates: a resume point."""


def _message_start_ids(tokenizer: Tokenizer | None) -> frozenset[int]:
    """The message-start id where the tokenizer has one (none: cuts at chunk multiples and the
    prompt end only). Found in token ids, so /v1/completions prompts get the same cuts as chat."""
    tid = tokenizer.token_to_id(MESSAGE_START) if tokenizer is not None else None
    return frozenset() if tid is None else frozenset({tid})
