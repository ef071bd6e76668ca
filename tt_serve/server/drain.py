"""Graceful drain: what SIGTERM does to a running server.

On the first SIGTERM (or Ctrl-C) the server stops admitting: ``/health`` answers 503, so a
router takes the worker out of rotation, and every new ``/v1/*`` request gets 503 with
``Retry-After`` (routers retry those on another worker). Requests already in flight, streams
included, run to the end. The process exits once none is left, or when the drain bound
(``ServeConfig.drain_timeout``) has passed; the NixOS unit's ``TimeoutStopSec=`` is derived
from that bound. A second signal exits at once.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from tt_serve.server.protocol import error_body

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class Drain:
    """Admission and the count of ``/v1/*`` requests in flight (owned by the event loop)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining_since: float | None = None

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    def start(self) -> None:
        if self.draining_since is None:
            self.draining_since = time.monotonic()

    def finished(self, bound_s: float) -> bool:
        """Draining, and nothing left in flight or the bound has passed."""
        if self.draining_since is None:
            return False
        return self.in_flight == 0 or time.monotonic() - self.draining_since >= bound_s

    @staticmethod
    def refusal() -> dict[str, Any]:
        return error_body(
            "the server is draining (shutting down); retry on another replica",
            "service_unavailable",
            None,
            "draining",
        )


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM/SIGINT drains before uvicorn's own shutdown starts."""

    def __init__(self, config: uvicorn.Config, drain: Drain, bound_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.bound_s = bound_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining or sig not in (signal.SIGTERM, signal.SIGINT):
            # A second signal: stop now (uvicorn still closes connections it can).
            self.should_exit = True
            self.force_exit = self.force_exit or sig == signal.SIGINT
            return
        log.info(
            "%s: draining %d request(s) in flight (at most %.0f s); new requests get 503",
            signal.Signals(sig).name,
            self.drain.in_flight,
            self.bound_s,
        )
        self.drain.start()

    async def on_tick(self, counter: int) -> bool:
        if not self.should_exit and self.drain.finished(self.bound_s):
            left = self.drain.in_flight
            if left:
                log.warning("drain bound reached with %d request(s) still in flight", left)
            self.should_exit = True
        return await super().on_tick(counter)


class DrainGate:
    """ASGI middleware: counts ``/v1/*`` requests until their last body byte is sent (a stream
    counts until it ends) and answers 503 to new ones while draining."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            data = json.dumps(Drain.refusal()).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                (b"retry-after", str(RETRY_AFTER_S).encode()),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": data})
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1
