"""``tt-serve serve``: parse and validate the config, then run uvicorn while the model loads."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tt_serve.config import ServeConfig, add_serve_arguments, dry_run, validate

if TYPE_CHECKING:
    from tt_serve.server.app import ServerState

log = logging.getLogger("tt_serve.server")


def resolve_dtype(cfg: ServeConfig) -> str:
    if cfg.dtype != "auto":
        return cfg.dtype
    return "float32" if cfg.backend == "torch" and cfg.device == "cpu" else "bfloat16"


def read_api_key(path: str | None) -> str | None:
    if path is None:
        return None
    key = Path(path).read_text().strip()
    if not key:
        raise ValueError(f"API key file {path} is empty")
    return key


def make_loader(cfg: ServeConfig, model_dir: str) -> Callable[[ServerState], None]:
    """The engine build, run in a thread at startup while /health answers 503."""
    from tt_serve.engine.async_engine import AsyncEngine
    from tt_serve.llm import EngineOptions, build_engine, load_tokenizer

    def load(state: ServerState) -> None:
        log.info("loading tokenizer from %s", model_dir)
        tok = load_tokenizer(model_dir)
        log.info(
            "loading weights (%s backend, %s, %s)", cfg.backend, cfg.device, resolve_dtype(cfg)
        )
        opts = EngineOptions(
            model=model_dir,
            backend=cfg.backend,
            device=cfg.device if cfg.backend == "torch" else ",".join(map(str, cfg.device_ids)),
            dtype=resolve_dtype(cfg),
            traced=cfg.traced_prefill,
            device_resident=cfg.device_resident,
            prefix_caching=cfg.prefix_caching,
            block_size=cfg.block_size,
            chunk=cfg.prefill_chunk,
            kv_blocks=cfg.kv_blocks or None,
            snapshot_slots=cfg.snapshot_slots if cfg.prefix_caching else 0,
            max_batch=cfg.max_batch_size,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            mixed_steps=cfg.backend == "torch",
        )
        engine, _ = build_engine(opts, tokenizer=tok)
        ae = AsyncEngine(engine, max_waiting=cfg.max_waiting)
        ae.start()
        state.tokenizer = tok
        state.max_model_len = engine.config.max_model_len
        state.engine = ae
        log.info("ready: serving %r on http://%s:%d", state.model_name, cfg.host, cfg.port)

    return load


def serve_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tt-serve serve", description="OpenAI-compatible HTTP server."
    )
    add_serve_arguments(parser)
    ns = parser.parse_args(list(argv))
    cfg = ServeConfig.from_args(ns)
    if ns.dry_run:
        return dry_run(cfg)
    errors = validate(cfg)
    if errors:
        for e in errors:
            print(f"tt-serve serve: {e}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(cfg.log_level.upper())
    if cfg.backend == "ttnn":
        from tt_serve.model.tt.device import require_device

        require_device(cfg.device_ids)
    try:
        api_key = read_api_key(cfg.api_key_file)
    except (OSError, ValueError) as exc:
        print(f"tt-serve serve: cannot read the API key: {exc}", file=sys.stderr)
        return 2
    model_dir = cfg.model
    if model_dir is None:
        from tt_serve.demo import ensure_demo_model

        model_dir = str(ensure_demo_model(log=lambda m: log.info("%s", m)))
    elif not (Path(model_dir) / "config.json").exists():
        print(
            f"tt-serve serve: {model_dir} has no config.json (not a checkpoint folder)",
            file=sys.stderr,
        )
        return 2

    import uvicorn

    from tt_serve.server.app import ServerState, create_app

    state = ServerState(model_name=cfg.served_model_name or Path(model_dir).name, api_key=api_key)
    app = create_app(state, make_loader(cfg, model_dir))
    uvicorn.run(
        app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, timeout_graceful_shutdown=5
    )
    return 0
