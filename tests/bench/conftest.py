"""Fixtures for the bench tests: a tiny random checkpoint (no tokenizer, 4,096-id vocabulary)
and an in-process tt-serve on 127.0.0.1 (ephemeral port)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

TINY_VOCAB = 4096


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_models import make_dense

    return make_dense(tmp_path_factory.mktemp("bench") / "tiny", vocab=TINY_VOCAB, seed=3)


@contextmanager
def serve_tiny(
    model_dir: Path, *, prefix_caching: bool = True, snapshot_slots: int = 16
) -> Iterator[str]:
    """A real tt-serve app (uvicorn in a thread); yields its base URL once /health is 200."""
    import uvicorn

    from tt_serve.config import ServeConfig
    from tt_serve.engine.async_engine import AsyncEngine
    from tt_serve.engine.factory import build_engine
    from tt_serve.server.app import ServerState, create_app

    def loader(st: ServerState) -> None:
        opts = ServeConfig(
            model=str(model_dir),
            prefix_caching=prefix_caching,
            block_size=16,
            prefill_chunk=64,
            kv_blocks=256,
            snapshot_slots=snapshot_slots,
            max_batch_size=4,
            max_num_batched_tokens=256,
            max_model_len=1024,
        )
        engine = build_engine(opts)
        ae = AsyncEngine(engine, max_waiting=64)
        ae.start()
        st.max_model_len, st.engine = engine.config.max_model_len, ae

    app = create_app(ServerState(model_name="tiny"), loader)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    try:
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        while httpx.get(f"{url}/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.1)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
