"""The background step loop: concurrent streams, cancellation aborts, queue limit, shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.engine.test_engine_fake import assert_idle, make_engine, toks
from tt_serve.engine.async_engine import AsyncEngine, NewRequest, QueueFullError
from tt_serve.engine.engine import Engine
from tt_serve.sequence import RequestError, SamplingParams


def wait_idle(ae: AsyncEngine, engine: Engine) -> None:
    for _ in range(100):
        if ae.gauges.num_running == 0 and not engine.has_unfinished():
            return
        threading.Event().wait(0.05)


def test_streams_and_cancellation_free_everything() -> None:
    engine = make_engine(caching=False, budget=64)
    ae = AsyncEngine(engine)
    ae.start()

    async def full(i: int) -> list[int]:
        out: list[int] = []
        params = SamplingParams(max_tokens=20, temperature=0)
        with ae.submit([NewRequest(f"full-{i}", toks(100 + i, i), params)]) as stream:
            async for o in stream:
                out.extend(o.new_token_ids)
                if o.finished:
                    assert o.token_ids == out
        return out

    async def cancelled(i: int) -> None:
        params = SamplingParams(max_tokens=200, temperature=0)
        with ae.submit([NewRequest(f"cut-{i}", toks(300, 50 + i), params)]) as stream:
            async for _ in stream:
                break  # leave after the first output: closing the stream aborts the request

    async def main() -> list[list[int]]:
        results = await asyncio.gather(
            *(full(i) for i in range(4)), *(cancelled(i) for i in range(4))
        )
        return [r for r in results if r is not None]

    try:
        outs = asyncio.run(main())
        assert all(len(o) == 20 for o in outs)
        wait_idle(ae, engine)
    finally:
        ae.shutdown()
    assert_idle(engine)
    assert engine.stats().kv_blocks_used == 0
    # The cancelled requests were aborted early, not run to their 200 tokens.
    assert engine.decode_tokens_computed < 4 * 20 + 4 * 100


def test_one_submission_interleaves_its_requests() -> None:
    engine = make_engine(caching=False)
    ae = AsyncEngine(engine)
    ae.start()
    params = SamplingParams(max_tokens=5, temperature=0)

    async def main() -> dict[str, list[int]]:
        got: dict[str, list[int]] = {"a": [], "b": []}
        reqs = [NewRequest(rid, toks(40, i), params) for i, rid in enumerate(got)]
        with ae.submit(reqs) as stream:
            async for o in stream:
                got[o.request_id].extend(o.new_token_ids)
        return got

    try:
        got = asyncio.run(main())
    finally:
        ae.shutdown()
    assert [len(v) for v in got.values()] == [5, 5]
    assert_idle(engine)


def test_validation_and_queue_limit_raise_before_queueing() -> None:
    engine = make_engine()
    ae = AsyncEngine(engine, max_waiting=0)
    ae.start()

    async def submit(prompt: list[int]) -> None:
        ae.submit([NewRequest("x", prompt, SamplingParams(max_tokens=2))])

    try:
        with pytest.raises(RequestError):
            asyncio.run(submit([]))
        with pytest.raises(QueueFullError):
            asyncio.run(submit([1, 2, 3]))
    finally:
        ae.shutdown()
    assert ae.num_queued == 0
    assert_idle(engine)


def test_queue_slots_never_exceed_max_waiting() -> None:
    """Regression: the waiting count peaked above the limit, because an add was counted neither
    as queued nor as waiting between its application and the next published gauges."""
    max_waiting = 4
    engine = make_engine(caching=False, max_batch=2)
    peak = 0
    add_request = engine.add_request

    def recording_add(*args: object, **kw: object) -> None:
        nonlocal peak
        add_request(*args, **kw)  # type: ignore[arg-type]
        peak = max(peak, engine.stats().num_waiting)

    engine.add_request = recording_add  # type: ignore[method-assign]
    ae = AsyncEngine(engine, max_waiting=max_waiting)
    ae.start()
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    async def one(i: int) -> bool:
        await asyncio.sleep(0.001 * (i % 7))
        try:
            stream = ae.submit([NewRequest(f"r{i}", toks(30, i), params)])
        except QueueFullError:
            return False
        assert ae.num_queued <= max_waiting
        with stream:
            async for o in stream:
                assert o.finish_reason != "error", o.error
        return True

    async def main() -> list[bool]:
        results: list[bool] = []
        for _ in range(5):
            results += await asyncio.gather(*(one(i) for i in range(30)))
        return results

    try:
        served = asyncio.run(main())
        wait_idle(ae, engine)
    finally:
        ae.shutdown()
    assert peak <= max_waiting
    assert any(served) and not all(served)
    assert ae.num_queued == 0
    assert_idle(engine)


def test_shutdown_fails_what_is_left_and_closes_the_backend() -> None:
    engine = make_engine(caching=False, max_batch=1)
    closed: list[bool] = []
    engine.close = lambda: closed.append(True)  # type: ignore[method-assign]
    ae = AsyncEngine(engine)
    ae.start()
    params = SamplingParams(max_tokens=5000, temperature=0, ignore_eos=True)
    stopper = threading.Thread(target=ae.shutdown)

    async def main() -> list[str | None]:
        reqs = [NewRequest(f"long-{i}", toks(20, i), params) for i in range(3)]
        reasons: list[str | None] = []
        with ae.submit(reqs) as stream:
            async for o in stream:
                if stopper.ident is None:
                    stopper.start()  # while one request runs and two wait
                if o.finished:
                    reasons.append(o.finish_reason)
        return reasons

    assert asyncio.run(main()) == ["error"] * 3
    stopper.join(timeout=30)
    assert closed == [True]
