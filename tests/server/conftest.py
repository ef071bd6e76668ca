"""A real uvicorn on 127.0.0.1 (ephemeral port) serving the demo model with the real Qwen
tokenizer, written at test time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from tt_serve.config import ServeConfig
from tt_serve.demo import write_demo_model
from tt_serve.engine.async_engine import AsyncEngine
from tt_serve.engine.factory import build_engine
from tt_serve.server.app import ServerState, create_app
from tt_serve.server.run import response_store
from tt_serve.tokenizer import load_tokenizer

MODEL_NAME = "demo"


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(
        write_demo_model(tmp_path_factory.mktemp("demo") / "model", seed=0, dtype="float32")
    )


def engine_options(model_dir: Path, **kw: object) -> ServeConfig:
    base: dict[str, object] = dict(
        block_size=16,
        prefill_chunk=64,
        kv_blocks=1024,
        snapshot_slots=16,
        max_batch_size=16,
        max_num_batched_tokens=512,
        max_model_len=2048,
    )
    base.update(kw)
    return ServeConfig.from_kwargs("engine_options()", model=str(model_dir), **base)


@dataclass
class Served:
    url: str
    state: ServerState

    def client(self, **kw: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kw)  # type: ignore[arg-type]


@contextmanager
def serve(
    model_dir: Path,
    *,
    api_key: str | None = None,
    max_waiting: int = 256,
    load: bool = True,
    **engine_kw: object,
) -> Iterator[Served]:
    cfg = engine_options(model_dir, **engine_kw)
    state = ServerState(
        model_name=MODEL_NAME, api_key=api_key, store=response_store(cfg, MODEL_NAME)
    )

    def loader(st: ServerState) -> None:
        tok = load_tokenizer(model_dir)
        engine = build_engine(cfg, tokenizer=tok)
        ae = AsyncEngine(engine, max_waiting=max_waiting)
        ae.start()
        st.tokenizer, st.max_model_len, st.engine = tok, engine.config.max_model_len, ae

    app = create_app(state, loader if load else None)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    served = Served(f"http://127.0.0.1:{port}", state)
    if load:
        with served.client() as c:
            while (health := c.get("/health")).status_code != 200:
                assert health.json()["status"] != "error", health.json()["detail"]
                assert time.monotonic() < deadline + 120, "model did not load"
                time.sleep(0.1)
    try:
        yield served
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(demo_dir: Path) -> Iterator[Served]:
    with serve(demo_dir) as s:
        yield s
