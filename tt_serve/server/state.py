"""What the HTTP endpoints share once the model is loaded."""

from __future__ import annotations

from dataclasses import dataclass, field

from tt_serve.config.serve_config import ServeConfig
from tt_serve.engine.async_engine import AsyncEngine
from tt_serve.server.protocol import now
from tt_serve.server.response_store import ResponseStore
from tt_serve.tokenizer import Tokenizer


@dataclass
class ServerState:
    """What the endpoints need once loading is done."""

    model_name: str
    api_key: str | None = None
    engine: AsyncEngine | None = None
    tokenizer: Tokenizer | None = None
    max_model_len: int = 0
    load_error: str | None = None
    created: int = field(default_factory=now)
    # The Responses API's stored responses (the loader in run.py puts the configured one).
    store: ResponseStore = field(
        default_factory=lambda: ResponseStore(
            ServeConfig.response_store_entries, ServeConfig.response_store_mb << 20
        )
    )

    @property
    def ready(self) -> bool:
        return self.engine is not None
