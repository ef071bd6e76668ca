"""A background step loop with a per-request async stream of outputs.

The engine itself is single-threaded: one thread owns it and runs ``step()`` whenever there is
work. Callers on the asyncio side send commands (add, abort) through a queue; outputs come back
to each request's ``asyncio.Queue`` through ``call_soon_threadsafe``. Cancelling or closing a
consumer's stream aborts its request, which frees its blocks, slot and pins at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from tt_serve.engine.engine import Engine
from tt_serve.sequence import FinishReason, RequestError, RequestOutput, SamplingParams

log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The waiting queue is at its limit; the server answers 503."""


@dataclass(frozen=True)
class EngineSnapshot:
    """Gauges published by the loop thread after every step (read lock-free)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    snapshot_slots_used: int = 0
    snapshot_slots_total: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prefill_tokens_computed: int = 0
    pipelined_decode_steps: int = 0


@dataclass
class _Add:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[RequestOutput | BaseException]


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    def __init__(self, engine: Engine, *, max_waiting: int = 256) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self._commands: queue.Queue[_Add | _Abort | None] = queue.Queue()
        self._streams: dict[str, _Add] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._pending_adds = 0
        self._lock = threading.Lock()
        self.snapshot = self._take_snapshot()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tt-serve-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stopping = True
        self._commands.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # -- API ---------------------------------------------------------------------------------

    def validate(self, prompt: Sequence[int], params: SamplingParams) -> None:
        self.engine.validate(prompt, params)

    async def generate(
        self, request_id: str, prompt: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs until it finishes. Raises RequestError / QueueFullError
        before anything is queued."""
        prompt = [int(t) for t in prompt]
        self.engine.validate(prompt, params)
        with self._lock:
            if self.snapshot.num_waiting + self._pending_adds >= self.max_waiting:
                raise QueueFullError(
                    f"the waiting queue is full ({self.max_waiting} requests); retry later"
                )
            self._pending_adds += 1
        out: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._commands.put(_Add(request_id, prompt, params, asyncio.get_running_loop(), out))
        finished = False
        try:
            while True:
                item = await out.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if item.finished:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    # -- the loop thread ---------------------------------------------------------------------

    def _take_snapshot(self) -> EngineSnapshot:
        e = self.engine
        c = e.cache
        st = c.stats
        return EngineSnapshot(
            num_running=e.num_running,
            num_waiting=e.num_waiting,
            kv_blocks_used=c.num_active_blocks,
            kv_blocks_total=c.num_usable_blocks,
            snapshot_slots_used=c.num_snapshots_used,
            snapshot_slots_total=c.num_snapshot_slots,
            prefix_queries=st.queries,
            prefix_hits=st.hits,
            prefill_tokens_computed=e.prefill_tokens_computed,
            pipelined_decode_steps=e.num_pipelined_steps,
        )

    def _apply(self, cmd: _Add | _Abort) -> None:
        if isinstance(cmd, _Add):
            with self._lock:
                self._pending_adds -= 1
            try:
                self.engine.add_request(cmd.request_id, cmd.prompt, cmd.params)
            except RequestError as exc:
                cmd.loop.call_soon_threadsafe(cmd.out.put_nowait, exc)
                return
            self._streams[cmd.request_id] = cmd
        else:
            if self.engine.abort(cmd.request_id):
                self._streams.pop(cmd.request_id, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for o in outputs:
            s = self._streams.get(o.request_id)
            if s is None:
                continue
            if o.finished:
                self._streams.pop(o.request_id, None)
            try:
                s.loop.call_soon_threadsafe(s.out.put_nowait, o)
            except RuntimeError:  # the consumer's loop is closed
                self.engine.abort(o.request_id)

    def _run(self) -> None:
        while not self._stopping:
            block = not self.engine.has_unfinished()
            try:
                cmd = self._commands.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                cmd = None
                if block:
                    continue
            while cmd is not None:
                self._apply(cmd)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if self._stopping:
                break
            if self.engine.has_unfinished():
                try:
                    outputs = self.engine.step()
                except Exception as exc:  # a bug above the backend: fail what runs, keep going
                    log.exception("engine step crashed")
                    outputs = self._fail_all(exc)
                self._deliver(outputs)
            self.snapshot = self._take_snapshot()
        with contextlib.suppress(Exception):
            self.engine.drain()  # read a pipelined step still in flight before failing the rest
        self._fail_all(RuntimeError("engine shut down"))

    def _fail_all(self, exc: BaseException) -> list[RequestOutput]:
        for rid, s in list(self._streams.items()):
            self.engine.abort(rid)
            err = RequestOutput(
                request_id=rid,
                prompt_token_ids=s.prompt,
                finish_reason=FinishReason.ERROR.value,
                error=f"engine error: {exc}",
            )
            with contextlib.suppress(RuntimeError):
                s.loop.call_soon_threadsafe(s.out.put_nowait, err)
        self._streams.clear()
        return []
