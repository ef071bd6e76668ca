"""Pipelined decode (deviceResident): the engine submits step n+1 before reading step n.

The pipelined fake runs each step when it is submitted and feeds fed rows from its
own per-slot ids, asserting every rule of the contract (resident slot, no state copy since,
results read in order, no KV write outside a request's blocks). Every test compares against
the same workload on the synchronous fake: pipelining must never change a token, a finish
reason or a cached-token count, and must return every block, slot and snapshot pin.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.fake_backend import FakeBackend, PipelinedFakeBackend
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.interface import Backend
from tt_serve.sequence import RequestOutput, SamplingParams

BS, C = 16, 64
Result = tuple[list[int], str | None, int, str | None]


class CharStream:
    """Token t reads as one letter of "abcd"; a stop string ends the text where it starts."""

    def __init__(self, params: SamplingParams) -> None:
        self.stops = params.stop_strings
        self.text = ""
        self.sent = 0

    def push(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        self.text += "".join("abcd"[t % 4] for t in token_ids)
        hits = [k for k in (self.text.find(s) for s in self.stops) if k >= 0]
        end = min(hits) if hits else len(self.text)
        out, self.sent = self.text[self.sent : end], end
        return out, bool(hits)

    def flush(self) -> str:
        return ""


def make(
    backend: Backend,
    *,
    max_batch: int = 4,
    blocks: int = 256,
    eos: frozenset[int] = frozenset(),
    mixed: bool = True,
    streams: bool = False,
) -> Engine:
    cfg = EngineConfig(
        scheduler=SchedulerConfig(
            max_batch=max_batch,
            max_num_batched_tokens=256,
            chunk=C,
            block_size=BS,
            mixed_steps=mixed,
        ),
        num_kv_blocks=blocks,
        num_snapshot_slots=16,
        max_model_len=4096,
        vocab_size=1000,
        eos_token_ids=eos,
    )
    return Engine(backend, cfg, text_streams=CharStream if streams else None)


Arrival = tuple[int, str, list[int], SamplingParams]  # (step index, id, prompt, params)


def drive(
    engine: Engine,
    arrivals: list[Arrival],
    on_step: Callable[[Engine, int], None] | None = None,
) -> dict[str, Result]:
    """Add requests at their step index, run to completion; (tokens, reason, cached, error)."""
    pending = sorted(arrivals, key=lambda a: a[0])
    done: dict[str, RequestOutput] = {}
    n = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= n:
            _, rid, prompt, params = pending.pop(0)
            engine.add_request(rid, prompt, params)
        if on_step is not None:
            on_step(engine, n)
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
        n += 1
        assert n < 20_000
    return {r: (o.token_ids, o.finish_reason, o.cached_tokens, o.error) for r, o in done.items()}


def assert_nothing_held(engine: Engine) -> None:
    assert not engine.has_unfinished()
    c = engine.scheduler.cache
    c.check_invariants()  # includes: no snapshot pinned without a restore in flight
    assert c.num_active_blocks == 0
    assert c.num_free_blocks + c.num_inactive_blocks == c.num_usable_blocks
    assert sorted(engine.scheduler._free_slots) == list(range(engine.scheduler.num_state_slots))


def greedy(n: int, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)  # type: ignore[arg-type]


def workload(seed: int, n: int = 10) -> list[Arrival]:
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(150)]
    out: list[Arrival] = []
    for i in range(n):
        tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 90))]
        prompt = system + tail if rng.random() < 0.7 else tail
        out.append((rng.randrange(0, 40), f"r{i}", prompt, greedy(rng.randrange(1, 24))))
    return out


def test_pipelined_tokens_equal_synchronous_and_overlap() -> None:
    arrivals = workload(1)
    sync_be = FakeBackend()
    sync = drive(make(sync_be), arrivals)
    be = PipelinedFakeBackend()
    eng = make(be)
    assert eng.pipelining
    piped = drive(eng, arrivals)
    assert piped == sync
    assert eng.num_pipelined_steps > 20
    assert be.max_in_flight == 2
    assert be.fed_rows > 20
    # Without stop tokens nothing is computed twice or discarded: a request that reaches
    # max_tokens at step n gets no row in the step already submitted after it.
    rows = sum(len(b.rows) for b in be.batches)
    assert rows == sum(len(b.rows) for b in sync_be.batches)
    assert_nothing_held(eng)


def test_stop_tokens_discard_the_in_flight_row() -> None:
    """EOS ends requests one step before their max: the pipelined row after it is discarded,
    and the slot and blocks it held go straight back to new requests."""
    arrivals = workload(2, n=12)
    eos = frozenset(range(0, 1000, 7))  # ~1 in 7 tokens stops a request
    sync = drive(make(FakeBackend(), eos=eos, max_batch=3), arrivals)
    eng = make(PipelinedFakeBackend(), eos=eos, max_batch=3)
    piped = drive(eng, arrivals)
    assert piped == sync
    assert any(r[1] == "stop" for r in sync.values())
    assert_nothing_held(eng)


def test_stop_strings_equal_synchronous() -> None:
    """Stop strings end requests in ``_collect``, after the next step was submitted."""
    arrivals = [
        (i * 3, f"r{i}", [i + 1] * (20 + i), greedy(40, stop=["ab", "dd"])) for i in range(8)
    ]
    sync = drive(make(FakeBackend(), streams=True, max_batch=3), arrivals)
    eng = make(PipelinedFakeBackend(), streams=True, max_batch=3)
    assert drive(eng, arrivals) == sync
    assert sum(r[1] == "stop" for r in sync.values()) >= 4
    assert eng.num_pipelined_steps > 0
    assert_nothing_held(eng)


def test_pipelining_holds_while_the_queue_head_does_not_fit() -> None:
    """A loaded server: slots are free but the KV pool is not. Admission cannot succeed until
    a request finishes, so decode keeps running ahead instead of draining every step."""
    arrivals = [(0, f"r{i}", [i + 1] * 40, greedy(200)) for i in range(4)]
    blocks = 1 + 2 * -(-(40 + 200) // BS)  # room for two lifetimes, four slots
    be = PipelinedFakeBackend()
    eng = make(be, max_batch=4, blocks=blocks)
    assert drive(eng, arrivals) == drive(make(FakeBackend(), max_batch=4, blocks=blocks), arrivals)
    decode_steps = sum(all(r.num_tokens == 1 for r in b.rows) for b in be.batches)
    assert eng.num_pipelined_steps > 0.9 * decode_steps
    assert_nothing_held(eng)


def test_refused_follow_up_spares_a_request_that_just_stopped() -> None:
    """The follow-up's row of a request that stopped at the step before it would have been
    discarded: refusing that submission must not turn the finished request into an error."""
    eos = frozenset(range(0, 1000, 7))
    arrivals: list[Arrival] = [(0, "a", [3] * 30, greedy(200))]
    sync = drive(make(FakeBackend(), eos=eos), arrivals)
    toks, reason, _, _ = sync["a"]
    assert reason == "stop" and len(toks) >= 3
    # Submissions: the prefill chunks (the prompt is cut at its last grid point too), the
    # first decode, then one follow-up per token; the follow-up carrying the row after the
    # stop token comes len(toks) submissions after the last prefill chunk.
    rule = make(FakeBackend()).scheduler.config.resume_rule
    prefills = len(rule.points(arrivals[0][2]).cuts) + 1
    eng = make(PipelinedFakeBackend(fail_on={len(toks) + prefills}), eos=eos)
    assert drive(eng, arrivals) == sync
    assert_nothing_held(eng)


def test_abort_while_in_flight() -> None:
    arrivals = [(0, f"r{i}", [i + 1] * (20 + i), greedy(30)) for i in range(3)]

    def abort_r1(engine: Engine, n: int) -> None:
        if n == 12:
            assert engine._inflight is not None, "expected a step in flight"
            assert engine.abort("r1")

    eng = make(PipelinedFakeBackend())
    piped = drive(eng, arrivals, abort_r1)
    sync = drive(make(FakeBackend()), [a for a in arrivals if a[1] != "r1"])
    assert "r1" not in piped  # aborted requests report nothing more
    assert piped == sync
    assert_nothing_held(eng)


def test_sampled_and_logprob_requests_run_synchronously() -> None:
    arrivals: list[Arrival] = [
        (0, "g", [5] * 40, greedy(20)),
        (0, "s", [6] * 40, SamplingParams(max_tokens=20, temperature=0.8, seed=3)),
        (25, "lp", [7] * 40, greedy(6, logprobs=2)),
        (40, "g2", [8] * 40, greedy(20)),
    ]
    sync = drive(make(FakeBackend()), arrivals)
    be = PipelinedFakeBackend()
    eng = make(be)
    piped = drive(eng, arrivals)
    assert piped == sync
    for batch in be.batches:
        fed = any(r.fed for r in batch.rows)
        assert not (fed and any(r.want_logits or r.top_logprobs for r in batch.rows))
    assert eng.num_pipelined_steps > 0  # "g2" alone at the end pipelines
    assert_nothing_held(eng)


@pytest.mark.parametrize("where", ["submit", "read"])
def test_failures_fail_their_requests_and_leak_nothing(where: str) -> None:
    arrivals = [(0, f"r{i}", [i + 3] * 30, greedy(25)) for i in range(3)]
    arrivals.append((60, "late", [9] * 30, greedy(5)))
    fail = {12}
    be = (
        PipelinedFakeBackend(fail_on=fail)
        if where == "submit"
        else PipelinedFakeBackend(fail_read_on=fail)
    )
    eng = make(be)
    res = drive(eng, arrivals)
    failed = [r for r, v in res.items() if v[3] is not None]
    assert failed and "late" not in failed
    assert all("injected" in (res[r][3] or "") for r in failed)
    assert res["late"] == drive(make(FakeBackend()), [(0, "late", [9] * 30, greedy(5))])["late"]
    assert_nothing_held(eng)


def test_all_decode_steps_mode_and_prefill_between() -> None:
    """Tenstorrent-style all-prefill / all-decode steps: arrivals drain the pipeline for their
    prefill and decode resumes pipelined afterwards."""
    arrivals = workload(3, n=8)
    sync = drive(make(FakeBackend(), mixed=False, max_batch=2), arrivals)
    eng = make(PipelinedFakeBackend(), mixed=False, max_batch=2)
    assert drive(eng, arrivals) == sync
    assert eng.num_pipelined_steps > 0
    assert_nothing_held(eng)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    max_batch=st.integers(1, 4),
    blocks=st.integers(24, 96),
    eos_every=st.sampled_from([0, 5, 11]),
    mixed=st.booleans(),
)
def test_pipelined_equals_synchronous_property(
    seed: int, max_batch: int, blocks: int, eos_every: int, mixed: bool
) -> None:
    arrivals = workload(seed, n=6)
    eos = frozenset(range(0, 1000, eos_every)) if eos_every else frozenset()
    sync = drive(
        make(FakeBackend(), max_batch=max_batch, blocks=blocks, eos=eos, mixed=mixed), arrivals
    )
    eng = make(PipelinedFakeBackend(), max_batch=max_batch, blocks=blocks, eos=eos, mixed=mixed)
    assert drive(eng, arrivals) == sync
    assert_nothing_held(eng)
