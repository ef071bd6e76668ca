"""``tt-serve serve``: parse and validate the config, then run uvicorn while the model loads."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tt_serve.config.flags import add_serve_arguments
from tt_serve.config.nix_json import dry_run
from tt_serve.config.rules import validate
from tt_serve.config.serve_config import ServeConfig

if TYPE_CHECKING:
    from tt_serve.server.app import ServerState
    from tt_serve.server.response_store import ResponseStore

log = logging.getLogger("tt_serve.server")


def read_api_key(path: str | None) -> str | None:
    if path is None:
        return None
    key = Path(path).read_text().strip()
    if not key:
        raise ValueError(f"API key file {path} is empty")
    return key


def keep_compute_off_this_thread() -> int:
    """Make the calling (main, event-loop) thread run torch single-threaded; return the thread
    count the engine should use (torch's default: OMP_NUM_THREADS, else the cores).

    libgomp keeps one worker team per thread that opens a parallel region. Once more of its
    threads exist than there are cores (the main thread's team plus the engine thread's), every
    team drops to a 100-spin wait and sleeps on a futex at each barrier, so each small op pays a
    wake-up: on 2 cores a [4, 4, 64, 64] triangular solve on a non-main thread took 1,060 us
    after one parallel op on the main thread, 160 us without it, and the engine thread's prefill
    ran 2.7x slower. With one thread here no team is ever made on this thread, and the loader
    (then the engine thread it starts) runs with the full count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # this thread's OpenMP setting; sets the default others start from
    return threads


def make_loader(cfg: ServeConfig, threads: int | None = None) -> Callable[[ServerState], None]:
    """The engine build, run in a thread at startup while /health answers 503; ``threads``:
    torch's intra-op thread count for it and the engine thread it starts."""
    from tt_serve.engine.async_engine import AsyncEngine
    from tt_serve.engine.factory import build_engine
    from tt_serve.tokenizer import load_tokenizer

    def load(state: ServerState) -> None:
        assert cfg.model is not None
        if threads is not None:
            import torch

            torch.set_num_threads(threads)  # and the default the engine thread starts from
        log.info("loading tokenizer from %s", cfg.model)
        tok = load_tokenizer(cfg.model)
        where = cfg.device if cfg.backend == "torch" else f"devices {list(cfg.device_ids)}"
        log.info("loading weights (%s backend, %s, %s)", cfg.backend, where, cfg.resolved_dtype)
        engine = build_engine(cfg, tokenizer=tok)
        if tok is not None:
            # The grammar engine's token trie over the vocabulary takes ~2 s and holds the GIL
            # most of that time: build it here, before the server is ready, not in the event
            # loop of the first constrained request.
            from tt_serve.agents.grammar import compiler_for

            compiler_for(tok, engine.config.vocab_size, engine.config.eos_token_ids)
        # What exists now (weights, tries, modules: over a million objects) lives as long as
        # the process: freeze it out of the cyclic GC, so that a full collection, when the
        # allocation count triggers one inside a request, does not traverse it all again (2
        # cores, demo model: 85-115 ms for the full collections during the load).
        gc.collect()
        gc.freeze()
        # After the engine: its disk tier has checked the folder (a bad one fails the load
        # with a clear message on /health).
        state.store = response_store(cfg, state.model_name)
        ae = AsyncEngine(engine, max_waiting=cfg.max_waiting)
        ae.start()
        state.tokenizer = tok
        state.max_model_len = engine.config.max_model_len
        state.engine = ae
        log.info("ready: serving %r on http://%s:%d", state.model_name, cfg.host, cfg.port)

    return load


def response_store(cfg: ServeConfig, model_name: str) -> ResponseStore:
    """The stored responses: in memory, and with the disk tier's folder also on disk (a folder
    per served model: the ids mean nothing to another tokenizer)."""
    from tt_serve.server.response_store import ResponseStore

    folder = None
    if cfg.disk_cache_dir is not None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
        folder = Path(cfg.disk_cache_dir) / "responses" / safe
    return ResponseStore(cfg.response_store_entries, cfg.response_store_mb << 20, folder)


def slow_precision(cfg: ServeConfig) -> str | None:
    """Why the server refuses ``cfg``'s precision on this machine, if it does: bfloat16 on a
    CPU without native bfloat16 matmuls (AVX512-BF16 or AMX), where torch's bf16 GEMMs fall
    to a scalar path about 10x slower than float32 (the offline API only warns)."""
    if cfg.backend != "torch" or cfg.resolved_dtype != "bfloat16":
        return None
    import torch

    from tt_serve.model.ref.layers import cpu_bf16

    if torch.device(cfg.device).type != "cpu" or cpu_bf16():
        return None
    return (
        "--dtype bfloat16 needs a CPU with native bfloat16 matmuls (AVX512-BF16 or AMX); this "
        "one has neither and would run about 10x slower than float32: use --dtype float32"
    )


def serve_main(argv: Sequence[str]) -> int:
    try:
        return _serve(argv)
    except KeyboardInterrupt:  # Ctrl-C before uvicorn's handlers are in (demo model, imports)
        print("tt-serve serve: interrupted while starting", file=sys.stderr)
        return 130


def _serve(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tt-serve serve",
        description="OpenAI-compatible HTTP server. Every flag is a ServeConfig field "
        "(the NixOS module's options carry the same names in camelCase).",
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
    threads = keep_compute_off_this_thread() if cfg.backend == "torch" else None
    slow = slow_precision(cfg)
    if slow:
        print(f"tt-serve serve: {slow}", file=sys.stderr)
        return 2
    if cfg.backend == "ttnn":
        from tt_serve.model.tt.probe import require_device

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
    from tt_serve.server.drain import Drain, DrainingServer

    cfg = dataclasses.replace(cfg, model=model_dir)
    name = cfg.served_model_name or Path(model_dir).name
    state = ServerState(model_name=name, api_key=api_key)
    drain = Drain()
    app = create_app(state, make_loader(cfg, threads), drain)
    # SIGTERM drains first (drain.py); uvicorn's own 5 s close then only meets idle
    # connections, and the unit's TimeoutStopSec= (lib/args.nix) covers both.
    config = uvicorn.Config(
        app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, timeout_graceful_shutdown=5
    )

    def cut_short(reason: str) -> None:
        if state.engine is not None:
            state.engine.cut_short(reason)

    DrainingServer(config, drain, bound_s=cfg.drain_timeout, cut_short=cut_short).run()
    return 0
