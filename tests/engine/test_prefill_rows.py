"""The prefill rows the torch backend measures: the rule on step timings, and the engine
feeding it its own steps."""

from __future__ import annotations

import random
import time

import pytest

import tt_serve.engine.engine as engine_module
import tt_serve.engine.prefill_rows as prefill_rows_module
from tests.engine.fake_backend import FakeBackend
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.prefill_rows import MIN_STEPS, PrefillRows
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.interface import StateCopy, StepBatch, StepOutput
from tt_serve.sequence import SamplingParams

C = 256


def feed(rows: PrefillRows, decode: tuple[int, float], chunk: tuple[int, float], n: int) -> None:
    for _ in range(n):
        rows.observe(*decode)
        rows.observe(*chunk)


def test_all_rows_until_both_kinds_of_step_were_seen() -> None:
    rows = PrefillRows(C, max_rows=32)
    for _ in range(50):
        rows.observe(C, 1.7)  # whole chunks only: no fixed cost measured yet
    assert rows.fit() is None and rows.limit == 0
    for _ in range(MIN_STEPS - 1):
        rows.observe(8, 0.15)
    assert rows.limit == 0
    rows.observe(8, 0.15)
    assert rows.limit == 1


def test_a_chunk_that_dwarfs_the_fixed_cost_gets_one_row() -> None:
    """The 0.8B shape on 2 cores: a decode step of 8 rows 0.15 s, a 256-token chunk 1.7 s."""
    rows = PrefillRows(C, max_rows=32)
    feed(rows, (8, 0.15), (C, 1.7), 8)
    fit = rows.fit()
    assert fit is not None
    a, b = fit
    assert 0.08 < a < 0.11 and 6e-3 < b < 7e-3
    assert rows.limit == 1


def test_host_overhead_alone_keeps_lockstep() -> None:
    """The demo model: a decode step and a whole chunk both about 10 ms."""
    rows = PrefillRows(C, max_rows=32)
    feed(rows, (4, 0.010), (C, 0.0101), 8)
    assert rows.limit == 0
    feed(rows, (4, 0.010), (C, 0.009), 8)  # a chunk faster than a decode step: b < 0
    assert rows.limit == 0


def test_in_between_the_fewest_rows_that_amortise_the_fixed_part() -> None:
    """a = 0.1 s, b·C = 0.25 s: k = ceil(0.1 · 0.9 / (0.1 · 0.25)) = 4; at the batch limit,
    lockstep."""
    rows = PrefillRows(C, max_rows=32)
    feed(rows, (1, 0.1 + 0.25 / C), (C, 0.35), 8)
    assert rows.limit == 4
    narrow = PrefillRows(C, max_rows=4)
    feed(narrow, (1, 0.1 + 0.25 / C), (C, 0.35), 8)
    assert narrow.limit == 0


def test_a_few_stalls_do_not_move_it() -> None:
    """Medians: a quarter of the steps hit by a stall (a loaded machine) leave the rule as
    it was."""
    rows = PrefillRows(C, max_rows=32)
    rng = random.Random(0)
    for i in range(64):
        stall = 2.0 if i % 4 == 0 else 0.0
        rows.observe(8, 0.15 * rng.uniform(0.9, 1.1) + stall)
        rows.observe(C, 1.7 * rng.uniform(0.9, 1.1) + (stall if i % 4 == 1 else 0.0))
        if i >= MIN_STEPS:
            assert rows.limit == 1


class Clock:
    """The engine's clock, advanced only by the backend's steps: a + b·n each (the 0.8B shape
    on 2 cores: a = 0.1 s, b·C = 1.6 s), whatever the fake's own cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()


class TimedBackend(FakeBackend):
    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def execute(self, batch: StepBatch) -> StepOutput:
        self.clock.now += 0.1 + 1.6 / C * batch.num_tokens
        return super().execute(batch)


def test_the_engine_measures_its_steps_and_prefills_one_row_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(engine_module, "time", clock)
    sched = SchedulerConfig(
        max_batch=8,
        max_num_batched_tokens=4 * C,
        chunk=C,
        block_size=16,
        measured_prefill_rows=True,
    )
    cfg = EngineConfig(
        scheduler=sched,
        num_kv_blocks=1024,
        num_snapshot_slots=16,
        max_model_len=8192,
        vocab_size=1000,
        eos_token_ids=frozenset(),
    )
    e = Engine(TimedBackend(clock), cfg)
    rng = random.Random(1)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    def burst(tag: str) -> list[StepBatch]:
        start = len(e.backend.batches)
        for i in range(4):
            e.add_request(f"{tag}{i}", [rng.randrange(1000) for _ in range(2 * C)], params)
        while e.has_unfinished():
            e.step()
        return e.backend.batches[start:]

    first = burst("a")  # nothing measured before its decode steps: lockstep
    assert max(sum(r.num_tokens > 1 for r in b.rows) for b in first) == 4
    burst("b")
    assert e.scheduler.max_prefill_rows == 1
    third = burst("c")
    assert max(sum(r.num_tokens > 1 for r in b.rows) for b in third) == 1


def _probed_engine(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Engine:
    monkeypatch.setattr(engine_module, "time", clock)
    monkeypatch.setattr(prefill_rows_module, "time", clock)
    sched = SchedulerConfig(
        max_batch=8,
        max_num_batched_tokens=4 * C,
        chunk=C,
        block_size=16,
        measured_prefill_rows=True,
    )
    cfg = EngineConfig(
        scheduler=sched,
        num_kv_blocks=1024,
        num_snapshot_slots=16,
        max_model_len=8192,
        vocab_size=1000,
        eos_token_ids=frozenset(),
    )
    return Engine(TimedBackend(clock), cfg)


def test_the_startup_probe_gives_the_first_burst_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed at startup, the rule holds from the first request: the first burst no longer
    prefills in lockstep; the probe's blocks and slot go back to their pools, and its state
    slot is reset after it."""
    clock = Clock()
    e = _probed_engine(monkeypatch, clock)
    cache = e.scheduler.cache
    free = cache.num_free_blocks
    res = e.probe_step_costs(20.0)
    assert res is not None
    assert (res.small_steps, res.large_steps) == (MIN_STEPS, MIN_STEPS)
    assert res.limit == 1 and e.scheduler.max_prefill_rows == 1
    assert cache.num_free_blocks == free and cache.num_active_blocks == 0
    cache.check_invariants()
    probe_rows = [r for b in e.backend.batches for r in b.rows]
    assert len(probe_rows) == 2 * (MIN_STEPS + 1)
    pos = 0
    for r in probe_rows:  # one scratch sequence at contiguous positions
        assert r.start_pos == pos and r.sample == (r.num_tokens == 1)
        pos += r.num_tokens
    assert e.backend.copies[0] == e.backend.copies[-1] == StateCopy.reset(probe_rows[0].state_slot)

    rng = random.Random(1)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    start = len(e.backend.batches)
    for i in range(4):
        e.add_request(f"a{i}", [rng.randrange(1000) for _ in range(2 * C)], params)
    while e.has_unfinished():
        e.step()
    first = e.backend.batches[start:]
    assert max(sum(r.num_tokens > 1 for r in b.rows) for b in first) == 1


def test_the_probe_keeps_to_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A half chunk costs 0.9 s here: a 3 s budget takes the warm-up pair and what fits after
    it, and the rule waits for the server's own steps (lockstep meanwhile)."""
    clock = Clock()
    e = _probed_engine(monkeypatch, clock)
    res = e.probe_step_costs(3.0)
    assert res is not None and res.seconds <= 3.0 + 1e-9
    assert res.large_steps < MIN_STEPS and res.limit == 0
    assert e.probe_step_costs(0.0) is None  # 0: no probe


def test_no_probe_with_work_queued_or_a_fixed_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    e = _probed_engine(monkeypatch, clock)
    e.add_request("x", [1, 2, 3], SamplingParams(max_tokens=2))
    assert e.probe_step_costs(20.0) is None
    fixed = Engine(
        FakeBackend(),
        EngineConfig(
            scheduler=SchedulerConfig(max_batch=4, chunk=C, block_size=16, max_prefill_rows=1),
            num_kv_blocks=64,
            num_snapshot_slots=4,
            max_model_len=4096,
            vocab_size=1000,
        ),
    )
    assert fixed.probe_step_costs(20.0) is None and not fixed.backend.batches
