"""Engine behaviour on a torch-free fake backend whose tokens depend on KV *and* state."""

from __future__ import annotations

import random

import pytest

from tests.engine.fake_backend import FakeBackend
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.interface import CopyKind, StateCopy
from tt_serve.sequence import RequestError, RequestOutput, SamplingParams

BS, C = 16, 64
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def make_engine(
    *,
    blocks: int = 512,
    snaps: int = 32,
    caching: bool = True,
    max_batch: int = 8,
    budget: int = 256,
    mixed: bool = True,
    fail_on: set[int] | None = None,
    device_argmax: bool = True,
    resume: str = "messages",
    prefill_rows: int = 0,
    prefill_order: str = "arrival",
) -> Engine:
    cfg = EngineConfig(
        scheduler=SchedulerConfig(
            max_batch=max_batch,
            max_num_batched_tokens=budget,
            chunk=C,
            block_size=BS,
            mixed_steps=mixed,
            device_argmax=device_argmax,
            resume_points=resume,
            max_prefill_rows=prefill_rows,
            prefill_order=prefill_order,
        ),
        num_kv_blocks=blocks,
        num_snapshot_slots=snaps,
        max_model_len=8192,
        vocab_size=1000,
        eos_token_ids=frozenset(),
        prefix_caching=caching,
    )
    return Engine(FakeBackend(fail_on=fail_on), cfg)


def run(
    engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY
) -> list[RequestOutput]:
    ids = [f"r{i}-{random.random()}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts, strict=True):
        engine.add_request(rid, p, params)
    done: dict[str, RequestOutput] = {}
    for _ in range(100_000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
    return [done[r] for r in ids]


def toks(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1000) for _ in range(n)]


def assert_idle(engine: Engine) -> None:
    c = engine.scheduler.cache
    c.check_invariants()
    assert c.num_active_blocks == 0
    assert c.num_free_blocks + c.num_inactive_blocks == c.num_usable_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert len(engine.scheduler._free_slots) == engine.scheduler.config.max_batch


def test_fake_backend_is_context_sensitive() -> None:
    # A different head changes the tail's tokens: the fake really depends on the prefix.
    a = run(make_engine(), [toks(300, 1)])[0].token_ids
    b = run(make_engine(), [toks(10, 2) + toks(300, 1)[10:]])[0].token_ids
    assert a != b


def test_warm_equals_cold_with_expected_cached_tokens() -> None:
    head = toks(1000, 3)
    first = head + toks(40, 4)
    second = head + toks(77, 5)
    warm = make_engine()
    run(warm, [first])
    (w,) = run(warm, [second])
    (c,) = run(make_engine(caching=False), [second])
    # Boundaries are multiples of C = 64 within the shared 1000 tokens: 960.
    assert w.cached_tokens == 960
    assert c.cached_tokens == 0
    assert w.token_ids == c.token_ids
    assert warm.scheduler.cache.stats.hits == 960


def test_prompt_of_exact_multiple_restores_one_stride_less() -> None:
    p = toks(4 * C, 6)
    e = make_engine(resume="chunks")
    run(e, [p])
    (w,) = run(e, [p])
    assert w.cached_tokens == 3 * C
    (c,) = run(make_engine(caching=False, resume="chunks"), [p])
    assert w.token_ids == c.token_ids


def test_same_prompt_twice_resumes_at_its_last_grid_point() -> None:
    # The chunk-only rule above restores a whole chunk less; message-rule cuts keep the state
    # one grid point (block) before the prompt's last token.
    for n in (4 * C, 4 * C + 5, 3 * C + 1):
        p = toks(n, 6)
        e = make_engine()
        run(e, [p])
        (w,) = run(e, [p])
        assert w.cached_tokens == (n - 1) // BS * BS
        (c,) = run(make_engine(caching=False), [p])
        assert w.token_ids == c.token_ids


def test_evictions_change_hit_rate_not_output() -> None:
    prompts = [toks(200, 10 + i % 3) + toks(30, 100 + i) for i in range(12)]
    cold = run(make_engine(caching=False), prompts)
    big = make_engine()
    small = make_engine(blocks=40, snaps=2, max_batch=2)
    outs_big = [run(big, [p])[0] for p in prompts]
    outs_small = [run(small, [p])[0] for p in prompts]
    assert [o.token_ids for o in outs_big] == [o.token_ids for o in cold]
    assert [o.token_ids for o in outs_small] == [o.token_ids for o in cold]
    assert small.scheduler.cache.stats.hits < big.scheduler.cache.stats.hits
    assert (
        small.scheduler.cache.stats.kv_evictions + small.scheduler.cache.stats.snapshot_evictions
        > 0
    )
    assert_idle(big)
    assert_idle(small)


def test_shared_prefix_is_computed_once() -> None:
    head = toks(2048, 7)
    suffix = 40
    prompts = [head + toks(suffix, 200 + i) for i in range(16)]
    e = make_engine(blocks=2048, max_batch=16, budget=512)
    outs = run(e, prompts)
    cold = run(make_engine(caching=False, blocks=4096, max_batch=16, budget=512), prompts)
    assert [o.token_ids for o in outs] == [o.token_ids for o in cold]
    assert e.prefill_tokens_computed <= 2048 + 16 * (suffix + C)
    assert sum(o.cached_tokens > 0 for o in outs) == 15
    assert_idle(e)


def test_failed_step_fails_only_that_batch() -> None:
    prompts = [toks(150 + 10 * i, 300 + i) for i in range(6)]
    cold = run(make_engine(caching=False), prompts)
    # Batch of 1 row per step: max_batch 1 makes each request its own batches.
    e = make_engine(max_batch=2, budget=C, fail_on={5})
    outs = run(e, prompts)
    failed = [o for o in outs if o.finish_reason == "error"]
    assert 1 <= len(failed) <= 2
    assert all(o.error and "injected failure" in o.error for o in failed)
    for o, ref in zip(outs, cold, strict=True):
        if o.finish_reason != "error":
            assert o.token_ids == ref.token_ids
    assert_idle(e)
    # The engine keeps serving, and a failed request's retry is correct.
    again = run(e, prompts)
    assert [o.token_ids for o in again] == [o.token_ids for o in cold]
    assert_idle(e)


def test_abort_mid_prefill_and_mid_decode_frees_everything() -> None:
    e = make_engine(caching=False, budget=C)
    p_long, p_short = toks(600, 11), toks(20, 12)
    e.add_request("long", p_long, SamplingParams(max_tokens=50, temperature=0))
    e.add_request("short", p_short, SamplingParams(max_tokens=50, temperature=0))
    for _ in range(3):
        e.step()
    assert not e.scheduler.running[0].prefill_done  # "long" is mid-prefill
    assert e.abort("long")
    for _ in range(3):
        e.step()
    short = next(r for r in e.scheduler.running if r.request_id == "short")
    assert short.prefill_done and short.output_token_ids  # mid-decode
    assert e.abort("short")
    assert not e.abort("short")
    assert_idle(e)
    assert e.scheduler.cache.num_free_blocks == e.scheduler.cache.num_usable_blocks


def test_seeded_sampling_is_reproducible() -> None:
    p = toks(100, 13)

    def sample(seed: int | None, temp: float = 1.0) -> list[int]:
        sp = SamplingParams(max_tokens=16, temperature=temp, seed=seed, top_p=0.9, top_k=50)
        return run(make_engine(), [p], sp)[0].token_ids

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    greedy = run(make_engine(), [p], SamplingParams(max_tokens=16, temperature=0))[0].token_ids
    assert sample(5, temp=0.0) == greedy


def test_logprobs_are_reported_for_greedy_and_sampled_rows() -> None:
    p = toks(90, 14)
    g = run(make_engine(), [p], SamplingParams(max_tokens=4, temperature=0, logprobs=3))[0]
    assert g.logprobs is not None and len(g.logprobs) == 4
    for tok, lp in zip(g.token_ids, g.logprobs, strict=True):
        assert tok in lp and len(lp) >= 3 and max(lp.values()) == lp[tok]
    s = run(make_engine(), [p], SamplingParams(max_tokens=4, seed=3, logprobs=2))[0]
    assert s.logprobs is not None and all(
        t in d for t, d in zip(s.token_ids, s.logprobs, strict=True)
    )


def test_host_argmax_path_gives_the_device_tokens() -> None:
    prompts = [toks(n, 60 + i) for i, n in enumerate([5, 64, 130, 300])]
    dev = make_engine()
    want = [o.token_ids for o in run(dev, prompts)]
    host = make_engine(device_argmax=False)
    assert [o.token_ids for o in run(host, prompts)] == want
    assert all(r.want_logits for b in host.backend.batches for r in b.rows if r.sample)
    assert dev.stats().sampled_rows_host == 0 and host.stats().sampled_rows_device == 0
    assert dev.stats().sampled_rows_device == host.stats().sampled_rows_host == 4 * 8
    assert_idle(host)


def test_all_prefill_or_all_decode_steps_bound_decode_stalls() -> None:
    e = make_engine(mixed=False, budget=C)
    run(e, [toks(30, 15)])
    e.add_request("d", toks(30, 16), SamplingParams(max_tokens=40, temperature=0))
    e.step()  # prefill of d: two chunks, it is cut at its last grid point too
    while not all(r.prefill_done for r in e.scheduler.running):
        e.step()
    e.add_request("p", toks(2000, 17), SamplingParams(max_tokens=1, temperature=0))
    phases = []
    before = len(e.backend.batches)
    for _ in range(20):
        e.step()
    for b in e.backend.batches[before:]:
        decode = [r.num_tokens == 1 and r.start_pos > 0 and r.sample for r in b.rows]
        assert all(decode) or not any(decode), "a step mixed decode rows and prefill chunks"
        phases.append("decode" if all(decode) else "prefill")
    streak = longest = 0
    for ph in phases:
        streak = streak + 1 if ph == "prefill" else 0
        longest = max(longest, streak)
    assert "decode" in phases and longest <= e.scheduler.config.max_prefill_streak


def _first_token_steps(engine: Engine, prompts: list[list[int]]) -> dict[int, int]:
    """The step at which each request (by index) got its first token."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"a{i}", prompt, GREEDY)
    first: dict[int, int] = {}
    for step in range(10_000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            i = int(o.request_id[1:])
            if o.token_ids and i not in first:
                first[i] = step
    return first


def test_prefill_rows_go_to_the_earliest_requests() -> None:
    """One prefilling request per step: a burst's first tokens come in arrival order, the
    first long before the last (the lockstep arm gives them all at once), with the same tokens
    and the same chunk segments per request (the cut points do not move)."""
    prompts = [toks(200 + 10 * i, 40 + i) for i in range(4)]
    arms = {}
    for rows in (0, 1):
        e = make_engine(mixed=False, budget=4 * C, prefill_rows=rows)
        first = _first_token_steps(e, prompts)
        segments: dict[int, list[tuple[int, int]]] = {}
        for b in e.backend.batches:
            per_step = [r for r in b.rows if r.num_tokens > 1 or r.start_pos == 0]
            if rows:
                assert len(per_step) <= rows
            for r in per_step:
                segments.setdefault(r.seq_id, []).append((r.start_pos, r.num_tokens))
        arms[rows] = (first, sorted(segments.values()))
        assert_idle(e)
    (lock, lock_seg), (one, one_seg) = arms[0], arms[1]
    assert max(lock.values()) - min(lock.values()) <= 1  # lockstep: all at (nearly) once
    assert [one[i] for i in range(4)] == sorted(one.values())  # arrival order
    assert len(set(one.values())) == 4 and one[0] <= lock[0]
    assert one_seg == lock_seg


def test_shortest_first_takes_the_fewest_remaining_tokens() -> None:
    prompts = [toks(400, 50), toks(100, 51), toks(250, 52)]
    e = make_engine(mixed=False, budget=4 * C, prefill_rows=1, prefill_order="shortest")
    first = _first_token_steps(e, prompts)
    assert first[1] < first[2] < first[0]
    assert_idle(e)


def test_decodes_run_while_requests_prefill_one_at_a_time() -> None:
    """With one prefill row per step, a running decode still gets a step after at most
    max_prefill_streak prefill steps."""
    e = make_engine(mixed=False, budget=4 * C, prefill_rows=1)
    e.add_request("d", toks(20, 60), SamplingParams(max_tokens=30, temperature=0))
    e.step()
    while not all(r.prefill_done for r in e.scheduler.running):
        e.step()
    for i in range(3):
        e.add_request(f"p{i}", toks(600, 61 + i), SamplingParams(max_tokens=1, temperature=0))
    before = len(e.backend.batches)
    for _ in range(24):
        e.step()
    streak = longest = 0
    for b in e.backend.batches[before:]:
        prefill = any(r.num_tokens > 1 or r.start_pos == 0 for r in b.rows)
        streak = streak + 1 if prefill else 0
        longest = max(longest, streak)
    assert 0 < longest <= e.scheduler.config.max_prefill_streak


@pytest.mark.parametrize(
    ("prompt", "params", "needle"),
    [
        ([], GREEDY, "empty"),
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
        ([1] * 8000, SamplingParams(max_tokens=500), "maximum context length"),
        ([1] * 3000, SamplingParams(max_tokens=10), "can never fit"),
        ([5000], GREEDY, "outside the vocabulary"),
        ([1], SamplingParams(stop=["x"]), "tokenizer"),
    ],
)
def test_validation_names_the_limit(prompt: list[int], params: SamplingParams, needle: str) -> None:
    e = make_engine(blocks=64)
    with pytest.raises(RequestError, match=needle):
        e.add_request("x", prompt, params)
    assert_idle(e)
    assert e.scheduler.cache.num_free_blocks == e.scheduler.cache.num_usable_blocks


class FailingRestore(FakeBackend):
    """Fails the first snapshot restore (as a mesh does when one chip's copy fails)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        if not self.failed and any(op.kind is CopyKind.RESTORE for op in ops):
            self.failed = True
            raise RuntimeError("injected restore fault on chip 1")
        super().copy_states(ops)


def test_a_failed_restore_fails_only_its_request() -> None:
    """Request "hit" restores a snapshot while "other" is decoding in the same step: the
    restore fails, "hit" fails with the error, "other" gets its tokens as if alone, nothing
    leaks, and "hit" then runs warm."""
    head = toks(200, 7)
    eng = make_engine()
    eng.backend = be = FailingRestore()
    be.allocate(num_kv_blocks=512, block_size=BS, num_state_slots=8, num_snapshot_slots=32)
    first = run(eng, [head + [1, 2, 3]])[0]
    eng.add_request("other", toks(40, 8), SamplingParams(max_tokens=12, temperature=0.0))
    eng.step()  # "other" prefilled and decoding
    eng.add_request("hit", head + [4, 5, 6], GREEDY)
    done: dict[str, RequestOutput] = {}
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    assert be.failed and first.finish_reason == "length"
    assert done["hit"].finish_reason == "error" and "restore fault" in (done["hit"].error or "")
    alone = run(make_engine(), [toks(40, 8)], SamplingParams(max_tokens=12, temperature=0.0))
    assert done["other"].token_ids == alone[0].token_ids
    assert eng.num_failed_steps == 0
    assert_idle(eng)
    warm = run(eng, [head + [4, 5, 6]])[0]
    assert warm.cached_tokens > 0
    assert warm.token_ids == run(make_engine(caching=False), [head + [4, 5, 6]])[0].token_ids
