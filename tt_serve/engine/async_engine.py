"""A background step loop with an async stream of outputs per submission.

The engine itself is single-threaded: one thread owns it and runs ``step()`` whenever there is
work. Callers on the asyncio side submit requests (validated and given their queue slots in the
caller's coroutine) and abort them through a command queue; outputs come back to the caller's
``asyncio.Queue`` through ``call_soon_threadsafe``. Closing an ``OutputStream`` early aborts its
unfinished requests, which frees their blocks, slots and pins at once.

Queue slots: a request holds one from ``submit`` until the engine admits it to the running batch
(or it ends). The count is the adds still in the command queue plus the engine's waiting
requests as the loop thread last saw them; the loop thread moves an applied add from the first
term to the second under the same lock, so the count never falls below the true number and
``max_waiting`` is never exceeded.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from tt_serve.engine.engine import Engine, EngineStats
from tt_serve.sequence import FinishReason, RequestError, RequestOutput, SamplingParams

log = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """The waiting queue is at its limit; the server answers 503."""


@dataclass(frozen=True)
class NewRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class _Add:
    request: NewRequest
    arrival_time: float
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[RequestOutput]


def _put_all(batch: list[tuple[_Add, RequestOutput]]) -> None:
    """On the consumers' loop: each output into its request's queue, in step order."""
    for add, out in batch:
        add.out.put_nowait(out)


@dataclass(frozen=True)
class _Abort:
    request_id: str


@dataclass(frozen=True)
class _CutShort:
    reason: str


class OutputStream:
    """Outputs of requests submitted together, interleaved as the engine produces them.

    Iteration ends once every request has finished (a failed request finishes with
    ``finish_reason == "error"``). ``close()``, or leaving a ``with`` block, aborts the
    unfinished ones: call it when the consumer goes away.
    """

    def __init__(
        self, engine: AsyncEngine, request_ids: list[str], out: asyncio.Queue[RequestOutput]
    ) -> None:
        self._engine = engine
        self._unfinished = dict.fromkeys(request_ids)  # an ordered set
        self._out = out

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if not self._unfinished:
            raise StopAsyncIteration
        out = await self._out.get()
        if out.finished:
            self._unfinished.pop(out.request_id, None)
        return out

    def close(self) -> None:
        for rid in self._unfinished:
            self._engine.abort(rid)
        self._unfinished.clear()

    def __enter__(self) -> OutputStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncEngine:
    def __init__(self, engine: Engine, *, max_waiting: int = 256) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self._commands: queue.Queue[_Add | _Abort | _CutShort | None] = queue.Queue()
        self._streams: dict[str, _Add] = {}  # requests inside the engine
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._lock = threading.Lock()  # guards the two queue-slot counts
        self._adds_in_flight = 0
        self._engine_waiting = 0
        self.gauges: EngineStats = engine.stats()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tt-serve-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        """Stop the loop (failing what is unfinished), then release the backend."""
        self._stopping = True
        self._commands.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                log.error("the engine loop did not stop within 30 s; the backend stays open")
                return
            self._thread = None
        self.engine.close()

    # -- API ---------------------------------------------------------------------------------

    @property
    def num_queued(self) -> int:
        """Requests holding a queue slot: submitted and not yet admitted to running."""
        with self._lock:
            return self._adds_in_flight + self._engine_waiting

    def submit(self, requests: Sequence[NewRequest]) -> OutputStream:
        """Queue requests together, or none of them: raises RequestError (naming the limit) or
        QueueFullError before anything is queued. Call from a coroutine."""
        for r in requests:
            self.engine.validate(r.prompt, r.params)
        with self._lock:
            if self._adds_in_flight + self._engine_waiting + len(requests) > self.max_waiting:
                raise QueueFullError(
                    f"the waiting queue is full ({self.max_waiting} requests); retry later"
                )
            self._adds_in_flight += len(requests)
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[RequestOutput] = asyncio.Queue()
        arrival = time.monotonic()
        for r in requests:
            self._commands.put(_Add(r, arrival, loop, out))
        return OutputStream(self, [r.request_id for r in requests], out)

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    def cut_short(self, reason: str) -> None:
        """Fail every request submitted so far with ``reason`` (a drain that ran out of time):
        their streams end with an error instead of being dropped with the connection."""
        self._commands.put(_CutShort(reason))

    # -- the loop thread ---------------------------------------------------------------------

    def _publish_gauges(self) -> None:
        stats = self.engine.stats()
        with self._lock:
            self._engine_waiting = stats.num_waiting
        self.gauges = stats

    def _apply(self, cmd: _Add | _Abort | _CutShort) -> None:
        if isinstance(cmd, _CutShort):
            self._fail_all(RuntimeError(cmd.reason))
            return
        if isinstance(cmd, _Abort):
            if self.engine.abort(cmd.request_id):
                self._streams.pop(cmd.request_id, None)
            return
        r = cmd.request
        try:
            self.engine.add_request(
                r.request_id, r.prompt, r.params, arrival_time=cmd.arrival_time, validated=True
            )
        except RequestError as exc:  # validated in submit: only a reused request id gets here
            with self._lock:
                self._adds_in_flight -= 1
            self._send(cmd, _error_output(r, str(exc)))
            return
        with self._lock:
            self._adds_in_flight -= 1
            self._engine_waiting += 1
        self._streams[r.request_id] = cmd

    def _send(self, add: _Add, out: RequestOutput) -> None:
        self._post(add.loop, [(add, out)])

    def _post(
        self, loop: asyncio.AbstractEventLoop, batch: list[tuple[_Add, RequestOutput]]
    ) -> None:
        """Outputs to their queues on ``loop``, in one wake-up of it."""
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the consumers' loop is closed
            for _, o in batch:
                self.engine.abort(o.request_id)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs to their streams: one wake-up of each consumer loop per step (not
        one per request: at 32 running requests that is 31 fewer self-pipe writes and event
        loop turns competing with the step for the CPU)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Add, RequestOutput]]] = {}
        for o in outputs:
            s = self._streams.get(o.request_id)
            if s is None:
                continue
            if o.finished:
                self._streams.pop(o.request_id, None)
            by_loop.setdefault(s.loop, []).append((s, o))
        for loop, batch in by_loop.items():
            self._post(loop, batch)

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
            self._publish_gauges()
        try:
            self.engine.drain()  # read a pipelined step still in flight before failing the rest
        except Exception:
            log.exception("draining the engine at shutdown failed")
        self._fail_all(RuntimeError("engine shut down"))

    def _fail_all(self, exc: BaseException) -> list[RequestOutput]:
        """Fail every request the engine holds, and (at shutdown) every add not yet applied."""
        for rid, s in list(self._streams.items()):
            self.engine.abort(rid)
            self._send(s, _error_output(s.request, f"engine error: {exc}"))
        self._streams.clear()
        if self._stopping:
            while True:
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    break
                if isinstance(cmd, _Add):
                    self._send(cmd, _error_output(cmd.request, f"engine error: {exc}"))
        return []


def _error_output(r: NewRequest, error: str) -> RequestOutput:
    return RequestOutput(
        request_id=r.request_id,
        prompt_token_ids=r.prompt,
        finish_reason=FinishReason.ERROR.value,
        error=error,
    )
