"""Graceful drain: what SIGTERM does to a running server.

On the first SIGTERM (or Ctrl-C) the server stops admitting: ``/health`` answers 503, so a
router takes the worker out of rotation, and every new ``/v1/*`` request gets 503 with
``Retry-After`` (routers retry those on another worker). Requests already in flight, streams
included, run to the end. The process exits once none is left, or when the drain bound
(``ServeConfig.drain_timeout``) has passed; the NixOS unit's ``TimeoutStopSec=`` is derived
from that bound. Requests still running at the bound, or at a second signal, are cut short: each
ends with an OpenAI error (a stream: an error event, then ``[DONE]``) rather than a dropped
connection, and the server exits. A third signal exits the process on the spot.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from tt_serve.server.messages_protocol import shaped
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
    """uvicorn, but the first SIGTERM/SIGINT drains before uvicorn's own shutdown starts.

    ``cut_short(reason)`` fails the requests still in flight (``AsyncEngine.cut_short``), so
    their handlers answer with an error inside uvicorn's close instead of being cancelled."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        bound_s: float,
        cut_short: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self.bound_s = bound_s
        self.cut_short = cut_short or (lambda reason: None)
        self.signals = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals >= 3:
            # The shutdown itself is stuck (a model load or a backend close): leave now.
            os._exit(1)
        if self.drain.draining or sig not in (signal.SIGTERM, signal.SIGINT):
            self._stop(f"the server is shutting down ({signal.Signals(sig).name} while draining)")
            return
        log.info(
            "%s: draining %d request(s) in flight (at most %.0f s); new requests get 503",
            signal.Signals(sig).name,
            self.drain.in_flight,
            self.bound_s,
        )
        self.drain.start()

    def _stop(self, reason: str) -> None:
        self.drain.start()
        if self.drain.in_flight:
            log.warning("cutting %d request(s) short: %s", self.drain.in_flight, reason)
            self.cut_short(reason)
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if not self.should_exit and self.drain.finished(self.bound_s):
            self._stop(f"the server is shutting down (drain bound of {self.bound_s:g} s passed)")
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
            _, body = shaped(scope["path"], 503, Drain.refusal())
            data = json.dumps(body).encode()
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
