"""The background step loop: concurrent streams, cancellation aborts, queue limit."""

from __future__ import annotations

import asyncio

import pytest

from tests.engine.test_engine_fake import assert_idle, make_engine, toks
from tt_serve.engine.async_engine import AsyncEngine, QueueFullError
from tt_serve.sequence import RequestError, SamplingParams


def test_streams_and_cancellation_free_everything() -> None:
    engine = make_engine(caching=False, budget=64)
    ae = AsyncEngine(engine)
    ae.start()

    async def full(i: int) -> list[int]:
        out: list[int] = []
        async for o in ae.generate(
            f"full-{i}", toks(100 + i, i), SamplingParams(max_tokens=20, temperature=0)
        ):
            out.extend(o.new_token_ids)
            if o.finished:
                assert o.token_ids == out
        return out

    async def cancelled(i: int) -> None:
        gen = ae.generate(
            f"cut-{i}", toks(300, 50 + i), SamplingParams(max_tokens=200, temperature=0)
        )
        async for _ in gen:
            break  # leave after the first output
        await gen.aclose()

    async def main() -> list[list[int]]:
        results = await asyncio.gather(
            *(full(i) for i in range(4)), *(cancelled(i) for i in range(4))
        )
        return [r for r in results if r is not None]

    try:
        outs = asyncio.run(main())
        assert all(len(o) == 20 for o in outs)
        for _ in range(100):
            if ae.snapshot.num_running == 0 and not engine.has_unfinished():
                break
            asyncio.run(asyncio.sleep(0.05))
    finally:
        ae.shutdown()
    assert_idle(engine)
    assert engine.cache.num_free_blocks == engine.cache.num_usable_blocks
    # The cancelled requests were aborted early, not run to their 200 tokens.
    assert engine.decode_tokens_computed < 4 * 20 + 4 * 100


def test_validation_and_queue_limit_raise_before_queueing() -> None:
    engine = make_engine()
    ae = AsyncEngine(engine, max_waiting=0)
    ae.start()

    async def first(prompt: list[int]) -> None:
        async for _ in ae.generate("x", prompt, SamplingParams(max_tokens=2)):
            pass

    try:
        with pytest.raises(RequestError):
            asyncio.run(first([]))
        with pytest.raises(QueueFullError):
            asyncio.run(first([1, 2, 3]))
    finally:
        ae.shutdown()
    assert_idle(engine)
