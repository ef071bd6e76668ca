"""The host and disk tiers on the torch backend: a conversation whose KV and snapshots the
device pool lost is restored from a tier and gives the cold run's tokens and logprobs."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from tests.engine.test_engine_model import assert_idle, llm, lp_tol, toks
from tt_serve import LLM, SamplingParams

SP = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=3)
# A pool that holds one 300-token conversation but not two (block 16: 19 + 19 > 24), and two
# snapshot slots: every other conversation evicts the first one's state from the device.
SMALL: dict[str, Any] = dict(kv_blocks=26, snapshot_slots=2, max_batch_size=2)


def _flood(m: LLM, seed: int) -> None:
    """Push every earlier conversation out of the device pool."""
    for i in range(3):
        m.generate([toks(290, seed + i)], SamplingParams(max_tokens=2, temperature=0.0))


def _same(a: Any, b: Any, tol: float) -> None:
    assert a.token_ids == b.token_ids
    assert len(set(b.token_ids)) > 3  # not vacuous
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        assert x.keys() == y.keys()
        assert max(abs(x[k] - y[k]) for k in y) <= tol


def _restarted(model: Path, disk: Path, head: list[int], seed: int) -> LLM:
    """An engine after a restart whose disk tier holds ``head``'s unit (written by a first
    engine from ``head`` + ``toks(30, seed)``)."""
    first = llm(model, disk_cache_dir=str(disk), **SMALL)
    first.generate([head + toks(30, seed)], SP)
    first.engine.close()  # the write-backs reach the disk
    return llm(model, disk_cache_dir=str(disk), **SMALL)


def test_host_tier_restore_equals_cold(engine_model_dir: Path) -> None:
    head = toks(256, 1)
    prompt = head + toks(40, 2)
    cold = llm(engine_model_dir, prefix_caching=False, **SMALL).generate([prompt], SP)[0]
    m = llm(engine_model_dir, host_cache_gb=0.05, **SMALL)
    m.generate([head + toks(30, 3)], SP)
    _flood(m, 10)
    assert m.engine.scheduler.cache.match(prompt) == 0  # the device pool lost it
    (w,) = m.generate([prompt], SP)
    assert w.cached_tokens == 256
    _same(w, cold, lp_tol(engine_model_dir))
    st = m.engine.stats().tiers
    assert st is not None and st.host_hits == 1 and st.host_hit_tokens == 256
    assert st.host_bytes <= st.host_budget_bytes
    assert_idle(m)
    tiers = m.engine.scheduler.cache.tiers
    assert tiers is not None and tiers.host is not None
    tiers.host.check_invariants()


def test_disk_tier_restore_after_restart_equals_cold(
    engine_model_dir: Path, tmp_path: Path
) -> None:
    head = toks(256, 21)
    prompt = head + toks(40, 22)
    cold = llm(engine_model_dir, prefix_caching=False, **SMALL).generate([prompt], SP)[0]
    second = _restarted(engine_model_dir, tmp_path, head, 23)
    (w,) = second.generate([prompt], SP)
    assert w.cached_tokens == 256
    _same(w, cold, lp_tol(engine_model_dir))
    st = second.engine.stats().tiers
    assert st is not None and st.disk_hits == 1 and st.disk_corrupt == 0
    assert_idle(second)


def test_restore_racing_an_eviction_of_the_same_unit(engine_model_dir: Path) -> None:
    """The host tier drops the unit the moment it was fetched (as an eviction racing the
    restore): the restore holds its own bytes and still gives the cold run's answer."""
    head = toks(256, 31)
    prompt = head + toks(40, 32)
    cold = llm(engine_model_dir, prefix_caching=False, **SMALL).generate([prompt], SP)[0]
    m = llm(engine_model_dir, host_cache_gb=0.05, **SMALL)
    m.generate([head + toks(30, 33)], SP)
    _flood(m, 40)
    tiers = m.engine.scheduler.cache.tiers
    assert tiers is not None and tiers.host is not None
    host = tiers.host
    fetch = tiers.fetch
    dropped: list[object] = []

    def fetch_then_evict(key: Any, hashes: Any) -> Any:
        got = fetch(key, hashes)
        dropped.append(host.drop(key))
        return got

    tiers.fetch = fetch_then_evict  # type: ignore[method-assign]
    (w,) = m.generate([prompt], SP)
    assert dropped == [True] and w.cached_tokens == 256
    _same(w, cold, lp_tol(engine_model_dir))
    host.check_invariants()
    assert_idle(m)


def test_unit_bytes_are_the_specs(engine_model_dir: Path) -> None:
    """What the planner counts per unit (``ModelSpec.resume_unit_bytes``) is what the torch
    backend moves: a block's KV over the attention layers and one snapshot (fp32 here)."""
    m = llm(engine_model_dir, host_cache_gb=0.05, **SMALL)
    spec = m.spec
    block, snapshot = m.engine.backend.unit_nbytes()  # type: ignore[attr-defined]
    assert block == spec.kv_bytes_per_block(16, 4) and snapshot == spec.state_bytes_per_slot()
    m.generate([toks(200, 50)], SP)
    tiers = m.engine.scheduler.cache.tiers
    assert tiers is not None and tiers.host is not None
    # The units at 64, 128 and 192 share their blocks: 3 snapshots + 12 distinct blocks.
    assert tiers.host.num_units == 3
    assert tiers.host.used_bytes == 3 * snapshot + 12 * block
    assert spec.resume_unit_bytes(192, 16, 4) == snapshot + 12 * block


def test_restore_of_a_request_left_out_of_its_first_step(engine_model_dir: Path) -> None:
    """A tier hit admitted behind another request whose chunk fills the step's token budget
    runs a step later: its bytes are still written before anything reads them."""
    head = toks(256, 61)
    prompt = head + toks(40, 62)
    kw: dict[str, Any] = dict(SMALL, kv_blocks=45, max_num_batched_tokens=64)
    cold = llm(engine_model_dir, prefix_caching=False, **kw).generate([prompt], SP)[0]
    m = llm(engine_model_dir, host_cache_gb=0.05, **kw)
    m.generate([head + toks(30, 63)], SP)
    _flood(m, 70)
    assert m.engine.scheduler.cache.match(prompt) == 0
    first, warm = m.generate([toks(300, 64), prompt], SP)
    assert warm.cached_tokens == 256 and first.cached_tokens == 0
    _same(warm, cold, lp_tol(engine_model_dir))
    assert_idle(m)


def test_a_full_disk_turns_the_disk_tier_off_and_answers_stay_right(
    engine_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up mid-run: the write-back fails, is counted, the disk tier turns off,
    and the host tier still restores the conversation with the cold run's answer."""
    head = toks(256, 81)
    prompt = head + toks(40, 82)
    cold = llm(engine_model_dir, prefix_caching=False, **SMALL).generate([prompt], SP)[0]
    m = llm(engine_model_dir, host_cache_gb=0.05, disk_cache_dir=str(tmp_path), **SMALL)
    tiers = m.engine.scheduler.cache.tiers
    assert tiers is not None and tiers.disk is not None

    def full(path: Path, *parts: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tiers.disk, "_atomic_write", full)
    m.generate([head + toks(30, 83)], SP)
    tiers.flush()
    _flood(m, 90)
    (w,) = m.generate([prompt], SP)
    assert w.cached_tokens == 256
    _same(w, cold, lp_tol(engine_model_dir))
    st = m.engine.stats().tiers
    assert st is not None and not st.disk_enabled and st.disk_errors == 1
    assert st.host_hits == 1 and st.disk_hits == 0
    assert_idle(m)
    m.engine.close()


def test_a_failed_restore_write_is_an_error_then_a_correct_answer(
    engine_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device write of a restore fails once: that request ends with an error (never an
    answer from what the write left), the cache forgets the unit's registrations, and the
    same request again gets the cold run's answer."""
    head = toks(256, 91)
    prompt = head + toks(40, 92)
    cold = llm(engine_model_dir, prefix_caching=False, **SMALL).generate([prompt], SP)[0]
    m = llm(engine_model_dir, host_cache_gb=0.05, **SMALL)
    m.generate([head + toks(30, 93)], SP)
    _flood(m, 95)
    backend = m.engine.backend
    real = backend.write_unit
    calls: list[int] = []

    def flaky(*a: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected host-to-device copy fault")
        real(*a)

    monkeypatch.setattr(backend, "write_unit", flaky)
    (bad,) = m.generate([prompt], SP)
    assert bad.finish_reason == "error" and "restoring cached state" in (bad.error or "")
    m.engine.scheduler.cache.check_invariants()
    assert m.engine.scheduler.cache.match(prompt) == 0  # nothing of the failed write is found
    (good,) = m.generate([prompt], SP)
    assert good.cached_tokens == 256 and len(calls) == 2  # restored again, this time written
    _same(good, cold, lp_tol(engine_model_dir))
    assert_idle(m)


def test_a_failed_snapshot_only_restore_is_an_error_too(
    engine_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device still holds the unit's blocks, only its snapshot was evicted: the restore
    writes just the snapshot, and that write fails after leaving zeros in the slot. The
    request restoring from the slot ends with an error (it holds none of the written blocks),
    nothing of the slot is found again, and the next try is the cold run's answer."""
    head = toks(256, 91)
    prompt = head + toks(40, 92)
    small = dict(kv_blocks=200, snapshot_slots=2, max_batch_size=2)
    cold = llm(engine_model_dir, prefix_caching=False, **small).generate([prompt], SP)[0]
    m = llm(engine_model_dir, host_cache_gb=0.05, **small)
    m.generate([head + toks(30, 93)], SP)
    for i in range(3):  # short distinct prompts evict the snapshots; the blocks stay
        m.generate([toks(100, 500 + i)], SamplingParams(max_tokens=2, temperature=0.0))
    backend = m.engine.backend
    real = backend.write_unit
    calls: list[tuple[int, bool]] = []

    def flaky(blocks: Any, data: Any, slot: int, snapshot: bytes | None) -> None:
        calls.append((len(blocks), snapshot is not None))
        if len(calls) == 1:
            real(blocks, data, slot, None if snapshot is None else bytes(len(snapshot)))
            raise RuntimeError("injected fault after a partial write")
        real(blocks, data, slot, snapshot)

    monkeypatch.setattr(backend, "write_unit", flaky)
    (bad,) = m.generate([prompt], SP)
    assert calls[0] == (0, True)  # a snapshot-only restore
    assert bad.finish_reason == "error" and "restoring cached state" in (bad.error or "")
    m.engine.scheduler.cache.check_invariants()
    (good,) = m.generate([prompt], SP)
    _same(good, cold, lp_tol(engine_model_dir))
    assert_idle(m)


def test_two_units_of_one_step_sharing_a_head_store_under_a_full_host_tier() -> None:
    """Storing one unit evicts the host units that held the next unit's shared head: the
    next unit's read is cut only when it is about to be read, so it carries those blocks and
    stores (before, its read was cut at publish time and storing it raised)."""
    from tt_serve.cache.host_tier import HostTier
    from tt_serve.cache.results import UnitRead
    from tt_serve.cache.tier_link import TierLink
    from tt_serve.cache.tiers import Tiers

    def h(i: int) -> bytes:
        return bytes([i]) * 16

    tiers = Tiers(HostTier(90, 4), None)
    tiers.store((h(2), 8), (h(1), h(2)), b"s" * 10, {h(1): b"k" * 20, h(2): b"k" * 20})
    link = TierLink.__new__(TierLink)
    link.tiers = tiers
    whole = UnitRead(b=12, hashes=(h(1), h(2), h(3)), snapshot_slot=0, blocks=(7, 8, 9),
                     block_hashes=(h(1), h(2), h(3)))  # fmt: skip
    early = link.narrow(whole)  # what a publish-time cut would read: only the new block
    assert early is not None and early.blocks == (9,)
    tiers.store((h(11), 8), (h(10), h(11)), b"s" * 10, {h(10): b"k" * 20, h(11): b"k" * 20})
    late = link.narrow(whole)  # the other unit evicted the shared head: read it too
    assert late is not None and late.blocks == (7, 8, 9)
    tiers.store((h(3), 12), whole.hashes, b"s" * 10, dict.fromkeys(late.block_hashes, b"k" * 20))
    assert tiers.holds((h(3), 12))
    assert tiers.host is not None
    tiers.host.check_invariants()


def test_disk_unit_evicted_while_restoring_is_a_miss_and_a_right_answer(
    engine_model_dir: Path, tmp_path: Path
) -> None:
    """Another replica removes the unit file between the lookup and the read: the restore
    falls back to a shorter cut (or none) and the answer is still the cold run's."""
    head = toks(256, 101)
    prompt = head + toks(40, 102)
    cold = llm(engine_model_dir, prefix_caching=False, **SMALL).generate([prompt], SP)[0]
    m = _restarted(engine_model_dir, tmp_path, head, 103)
    tiers = m.engine.scheduler.cache.tiers
    assert tiers is not None and tiers.disk is not None
    disk = tiers.disk
    real = disk.read
    gone: list[int] = []

    def evicted_first(key: Any, *rest: Any) -> Any:
        if not gone:  # the longest cut's file goes just before its read
            gone.append(key[1])
            next(tmp_path.rglob(f"{key[0].hex()}-{key[1]}.unit")).unlink()
        return real(key, *rest)

    disk.read = evicted_first  # type: ignore[method-assign]
    (w,) = m.generate([prompt], SP)
    assert gone == [256] and w.cached_tokens < 256
    _same(w, cold, lp_tol(engine_model_dir))
    assert_idle(m)
    m.engine.close()


def test_a_slow_disk_read_never_holds_the_step(engine_model_dir: Path, tmp_path: Path) -> None:
    """After a restart one request's unit is slow to read from disk: the engine steps another
    request to its end meanwhile (the step never waits on the disk), then the restored request
    answers as the cold run does."""
    import threading

    head = toks(256, 31)
    prompt = head + toks(40, 32)
    other = toks(40, 34)
    cold = llm(engine_model_dir, prefix_caching=False, **SMALL).generate([prompt], SP)[0]
    m = _restarted(engine_model_dir, tmp_path, head, 33)
    tiers = m.engine.scheduler.cache.tiers
    assert tiers is not None and tiers.disk is not None
    gate = threading.Event()
    real = tiers.disk.read

    def slow(key: Any, *rest: Any) -> Any:
        assert threading.current_thread().name == "tier-reader"
        gate.wait(60)
        return real(key, *rest)

    tiers.disk.read = slow  # type: ignore[method-assign]
    eng = m.engine
    eng.add_request("warm", prompt, SP)
    eng.add_request("other", other, SP)
    done: dict[str, Any] = {}
    while "other" not in done:  # the warm request waits on its read all along
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert "warm" not in done and tiers.reading()
    gate.set()
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    w = done["warm"]
    assert w.cached_tokens == 256
    _same(w, cold, lp_tol(engine_model_dir))
    st = eng.stats().tiers
    assert st is not None and st.disk_hits == 1 and st.disk_reads_ahead == 1
    assert_idle(m)
    eng.close()


def _paced(m: LLM, nbytes: int) -> list[tuple[int, bool]]:
    """Restores write at most ``nbytes`` per step while others run; returns a log of every
    device write: (KV bytes, whether it carried the snapshot)."""
    from dataclasses import replace

    sched = m.engine.scheduler
    sched.config = replace(sched.config, restore_bytes_per_step=nbytes)
    log: list[tuple[int, bool]] = []
    real = m.engine.backend.write_unit

    def spy(blocks: Any, data: Any, slot: int, snapshot: Any) -> None:
        log.append((sum(len(d) for d in data), snapshot is not None))
        real(blocks, data, slot, snapshot)

    m.engine.backend.write_unit = spy  # type: ignore[method-assign]
    return log


def test_a_restore_lands_in_pieces_while_others_run(engine_model_dir: Path) -> None:
    """With another request decoding, a 16-block restore is written a few blocks per step (the
    snapshot in the first piece), a second request on the same history admitted meanwhile
    waits for the blocks too, and both answer as the cold run; alone, a restore lands whole."""
    head = toks(256, 41)
    prompt, twin, alone = head + toks(40, 42), head + toks(40, 47), head + toks(40, 48)
    kw: dict[str, Any] = dict(SMALL, kv_blocks=60, max_batch_size=3)
    cold = dict(
        zip(
            ("warm", "twin", "alone"),
            llm(engine_model_dir, prefix_caching=False, **kw).generate([prompt, twin, alone], SP),
            strict=True,
        )
    )
    m = llm(engine_model_dir, host_cache_gb=0.05, **kw)
    m.generate([head + toks(30, 43)], SP)
    _flood(m, 44)
    assert m.engine.scheduler.cache.match(prompt) == 0
    block = m.spec.kv_bytes_per_block(16, 4)
    log = _paced(m, 3 * block)
    eng = m.engine
    eng.add_request("busy", toks(20, 45), SamplingParams(max_tokens=40, temperature=0.0))
    eng.step()
    eng.add_request("warm", prompt, SP)
    eng.step()  # admitted: the first piece
    eng.add_request("twin", twin, SP)
    eng.step()  # the twin is admitted on the restored blocks, and waits with the restore
    pieces = len(log)
    (twin_req,) = [r for r in eng.scheduler.running if r.request_id == "twin"]
    assert twin_req.num_computed == twin_req.cached_tokens == 256
    done: dict[str, Any] = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    assert [snap for _, snap in log] == [True] + [False] * (len(log) - 1)
    assert len(log) >= 5 and len(log) > pieces and max(n for n, _ in log) == 3 * block
    for rid in ("warm", "twin"):  # the twin: a device hit on blocks still being written
        assert done[rid].cached_tokens == 256
        _same(done[rid], cold[rid], lp_tol(engine_model_dir))
    st = eng.stats().tiers
    assert st is not None and st.host_hits == 1 and st.restores == 1
    assert sum(n for n, _ in log) + m.spec.state_bytes_per_slot() == st.restore_bytes
    assert_idle(m)
    # alone: the whole unit in one write
    _flood(m, 46)
    log.clear()
    (w,) = m.generate([alone], SP)
    assert w.cached_tokens == 256 and len(log) == 1 and log[0][1]
    _same(w, cold["alone"], lp_tol(engine_model_dir))


def test_a_restore_whose_request_ends_lands_before_its_blocks_are_reused(
    engine_model_dir: Path,
) -> None:
    """The restoring request is aborted after its first piece: the rest is written in the next
    step, before any admission can reuse the blocks, and the history still restores right."""
    head = toks(256, 51)
    prompt = head + toks(40, 52)
    kw: dict[str, Any] = dict(SMALL, kv_blocks=60, max_batch_size=3)
    cold = llm(engine_model_dir, prefix_caching=False, **kw).generate([prompt], SP)[0]
    m = llm(engine_model_dir, host_cache_gb=0.05, **kw)
    m.generate([head + toks(30, 53)], SP)
    _flood(m, 54)
    block = m.spec.kv_bytes_per_block(16, 4)
    log = _paced(m, 3 * block)
    eng = m.engine
    eng.add_request("busy", toks(20, 55), SamplingParams(max_tokens=30, temperature=0.0))
    eng.step()
    eng.add_request("warm", prompt, SP)
    eng.step()
    eng.abort("warm")
    eng.step()
    assert len(log) == 2 and log[0][1]  # the rest at once
    while eng.has_unfinished():
        eng.step()
    assert_idle(m)
    st = eng.stats().tiers
    assert st is not None
    assert sum(n for n, _ in log) + m.spec.state_bytes_per_slot() == st.restore_bytes
    (w,) = m.generate([prompt], SP)  # a device hit on the restored blocks
    assert w.cached_tokens == 256 and len(log) == 2
    _same(w, cold, lp_tol(engine_model_dir))
