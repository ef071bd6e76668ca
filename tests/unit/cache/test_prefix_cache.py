"""One test per rule of the joint prefix cache (block size 4, stride 8 unless stated)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import pytest

from tt_serve.cache import Admission, PrefixCache, SnapshotSave, block_hashes

BS, S = 4, 8


def make(num_blocks: int = 32, slots: int = 8, enabled: bool = True) -> PrefixCache:
    return PrefixCache(
        num_blocks=num_blocks,
        block_size=BS,
        num_snapshot_slots=slots,
        stride=S,
        enabled=enabled,
        salt=b"test-model",
    )


def toks(n: int, seed: int = 0) -> list[int]:
    return [(seed * 1000 + i) % 50_000 for i in range(n)]


def prefill(
    cache: PrefixCache,
    rid: str,
    tokens: Sequence[int],
    *,
    snapshot: bool = True,
    publish: bool = True,
) -> list[SnapshotSave]:
    """Run a request's prefill the way the engine does: chunks end on stride multiples or at
    the prompt end; each save is published (or aborted) right after its step."""
    cache.restore_done(rid)
    start = cache.cached_tokens(rid)
    saves = []
    while start < len(tokens):
        end = min((start // S + 1) * S, len(tokens))
        save = cache.on_computed(rid, tokens, end, snapshot_ok=snapshot)
        if save is not None:
            saves.append(save)
            (cache.publish if publish else cache.abort)(save)
        start = end
    cache.check_invariants()
    return saves


def warm(cache: PrefixCache, tokens: Sequence[int], rid: str = "warm") -> None:
    """Compute ``tokens`` once (snapshots at every stride) and release the request."""
    assert cache.admit(rid, tokens, 1).admission is Admission.NOW
    prefill(cache, rid, tokens)
    cache.release(rid)
    cache.check_invariants()


def state(cache: PrefixCache) -> tuple[object, ...]:
    bp, sp = cache.block_pool, cache.snapshot_pool
    pins = tuple(sp.pins(s) for s in range(sp.num_slots))
    return (
        bp.free_blocks(),
        frozenset(bp.inactive_blocks()),
        bp.registered(),
        sp.published_keys(),
        sp.num_used,
        pins,
    )


def test_stride_must_be_a_multiple_of_block_size() -> None:
    with pytest.raises(ValueError, match=r"stride \(6\).*block_size \(4\)"):
        PrefixCache(num_blocks=8, block_size=4, num_snapshot_slots=1, stride=6)


def test_kv_only_is_a_miss() -> None:
    cache = make()
    t = toks(20)
    assert cache.admit("a", t, 1).admission is Admission.NOW
    prefill(cache, "a", t, snapshot=False)
    cache.release("a")
    assert cache.num_inactive_blocks == 5, "all 5 full blocks stay registered"
    assert cache.match(t) == 0
    res = cache.admit("b", t, 1)
    assert res.cached_tokens == 0 and res.restore_snapshot is None
    assert cache.stats.hits == 0
    cache.check_invariants()


def test_snapshot_only_is_a_miss_and_cold_allocation_reclaims_kv_not_snapshots() -> None:
    cache = make(num_blocks=9)  # 8 usable blocks
    t = toks(24)
    warm(cache, t)
    assert cache.match(t + [1]) == 24
    used = cache.num_snapshots_used
    assert used == 3
    # A cold request needing every block reclaims all the inactive KV...
    res = cache.admit("cold", toks(32, seed=7), 1)
    assert res.admission is Admission.NOW and res.cached_tokens == 0
    stats = cache.stats
    assert stats.kv_evictions == 6
    # ...but no snapshot was evicted to make room.
    assert cache.num_snapshots_used == used and stats.snapshot_evictions == 0
    cache.release("cold")
    # The snapshots survive without their KV: a miss with 0 cached tokens.
    assert cache.match(t + [1]) == 0
    assert cache.admit("b", t + [1], 1).cached_tokens == 0
    cache.check_invariants()


def test_prompt_of_exactly_k_strides_restores_k_minus_one() -> None:
    cache = make()
    t = toks(3 * S)
    warm(cache, t)
    assert cache.match(t) == 2 * S, "one prompt token is always computed"
    res = cache.admit("b", t, 1)
    assert res.cached_tokens == 2 * S and res.restore_snapshot is not None
    assert cache.match(t[:S]) == 0, "a one-stride prompt is always cold"
    assert cache.match(t[: S + 1]) == S
    cache.check_invariants()


def test_scan_takes_the_longest_joint_boundary() -> None:
    cache = make()
    t = toks(3 * S)
    assert cache.admit("a", t, 1).admission is Admission.NOW
    saves = prefill(cache, "a", t, publish=False)  # every save aborted...
    assert len(saves) == 3 and cache.num_snapshots_used == 0
    cache.release("a")
    assert cache.match(t + [1]) == 0, "...so KV to 24 alone gives nothing"
    # Publish at 8 and 16 only: KV reaches 24, the longest joint boundary is 16.
    assert cache.admit("d", t, 1).admission is Admission.NOW
    for end in (S, 2 * S):
        save = cache.on_computed("d", t, end, snapshot_ok=True)
        assert save is not None
        cache.publish(save)
    cache.on_computed("d", t, 3 * S, snapshot_ok=False)
    cache.release("d")
    assert cache.match(t + [1]) == 2 * S
    cache.check_invariants()


def test_snapshots_only_on_the_stride_grid() -> None:
    cache = make()
    t = toks(3 * S)
    cache.admit("a", t, 1)
    assert cache.on_computed("a", t, BS, snapshot_ok=True) is None, "block but not stride"
    assert cache.on_computed("a", t, S, snapshot_ok=False) is None, "engine said no"
    save = cache.on_computed("a", t, 2 * S, snapshot_ok=True)
    assert save is not None and save.boundary == 2 * S
    cache.check_invariants()


def test_save_reserved_in_the_last_step_is_published_after_release() -> None:
    # A request that finishes on the step that reserved a save is released by the scheduler
    # before the engine copies and publishes: the save must survive the release.
    cache = make()
    t = toks(2 * S)
    cache.admit("a", t, 1)
    cache.on_computed("a", t, S, snapshot_ok=False)
    save = cache.on_computed("a", t, 2 * S, snapshot_ok=True)
    assert save is not None
    cache.release("a")
    assert cache.inflight_boundary(t + [1]) == 2 * S, "in flight until published"
    cache.check_invariants()
    cache.publish(save)
    assert cache.match(t + [1]) == 2 * S and cache.inflight_boundary(t + [1]) == 0
    cache.check_invariants()


def test_inactive_hit_blocks_do_not_count_as_free_space() -> None:
    cache = make(num_blocks=11)  # 10 usable blocks
    t = toks(2 * S)
    warm(cache, t)  # 4 inactive blocks hold t
    cache.admit("other", toks(4, seed=9), 1)  # 1 active block; 5 free + 4 inactive remain
    # 20 + 20 tokens = 10 pages: the 4 inactive hit blocks are reused, 6 more are needed but
    # only 5 are free once the hit blocks leave the reclaimable pool.
    prompt = t + [1, 2, 3, 4]
    assert cache.match(prompt) == 2 * S
    assert cache.admit("b", prompt, 20).admission is Admission.LATER
    cache.release("other")
    assert cache.admit("b", prompt, 20).admission is Admission.NOW
    cache.check_invariants()


def test_salt_keys_the_cache() -> None:
    cache = make()
    t = toks(2 * S)
    warm(cache, t)
    assert set(cache.block_pool.registered()) == set(block_hashes(t, BS, b"test-model"))


def test_shared_prefix_requests_are_admitted_together() -> None:
    prefix = toks(32)  # 8 blocks
    cache = make(num_blocks=27, slots=4)  # 26 usable blocks
    owner = prefix + [1]
    assert cache.admit("owner", owner, 1).admission is Admission.NOW  # 9 pages
    prefill(cache, "owner", owner)
    # Each follower: 36-token prompt + 4 new tokens = 10 pages, 8 of them the shared prefix.
    followers = [prefix + [100 + i] * 4 for i in range(8)]
    assert cache.lifetime_tokens(36, 4) == 40
    full_charge = 9 + 8 * 10
    assert full_charge > cache.num_usable_blocks, "full-lifetime charging would serialize"
    for i, t in enumerate(followers):
        res = cache.admit(f"f{i}", t, 4)
        assert res.admission is Admission.NOW, f"follower {i} not admitted"
        assert res.cached_tokens == 32 and len(res.block_table) == 10
        assert res.block_table[:8] == cache.block_table("owner")[:8]
    assert cache.num_active_blocks == 9 + 8 * 2
    for i in range(8):
        cache.restore_done(f"f{i}")
    cache.check_invariants()
    # The prefix blocks have 9 owners; releasing all returns them to inactive, not free.
    for rid in ["owner", *(f"f{i}" for i in range(8))]:
        cache.release(rid)
    assert cache.num_active_blocks == 0
    cache.check_invariants()


def test_lifetime_rule_and_admission_answers() -> None:
    cache = make(num_blocks=6)  # 5 usable blocks
    assert cache.lifetime_tokens(10, 0) == 10
    assert cache.lifetime_tokens(10, 1) == 10
    assert cache.lifetime_tokens(10, 2) == 12
    # prompt + max_tokens = 9 = 1 (mod 4): "prompt + max_tokens - 1" would reserve 2 pages.
    res = cache.admit("a", toks(6), 3)
    assert res.admission is Admission.NOW and len(res.block_table) == 3
    res1 = cache.admit("one", toks(8, seed=1), 1)
    assert len(res1.block_table) == 2, "max_tokens == 1 reserves the prompt only"
    before = (state(cache), cache.stats)
    assert cache.admit("b", toks(4, seed=2), 1).admission is Admission.LATER
    assert (state(cache), cache.stats) == before, "LATER changes nothing"
    never = cache.admit("c", toks(21, seed=3), 1)
    assert never.admission is Admission.NEVER
    assert "6 KV pages" in never.reason and "5 usable" in never.reason
    assert cache.admit("d", toks(20, seed=3), 1).admission is Admission.LATER, "fits when idle"
    with pytest.raises(ValueError):
        cache.lifetime_tokens(0, 4)
    with pytest.raises(ValueError, match="already admitted"):
        cache.admit("a", toks(6), 3)
    cache.check_invariants()


def test_block_with_an_uncomputed_or_decoded_token_is_never_registered() -> None:
    cache = make()
    prompt = toks(7)
    res = cache.admit("a", prompt, 4)
    table = res.block_table
    cache.on_computed("a", prompt, 7, snapshot_ok=True)
    pool = cache.block_pool
    assert pool.hash_of(table[0]) is not None
    assert pool.hash_of(table[1]) is None, "positions 4..6 computed, 7 not yet"
    # The sampled token at position 7 fills the block, but its KV is not written yet.
    seq = [*prompt, 42]
    cache.on_computed("a", seq, 7, snapshot_ok=False)
    assert pool.hash_of(table[1]) is None
    # Decode wrote position 7 with other kernels than a prefill would: a longer prompt that
    # re-sends this answer must prefill it itself, or its hit would not be the cold run's bits.
    cache.on_computed("a", [*seq, 43], 8, snapshot_ok=False)
    assert pool.hash_of(table[1]) is None
    with pytest.raises(ValueError, match="num_computed"):
        cache.on_computed("a", [*seq, 43], 10, snapshot_ok=False)
    cache.check_invariants()


def test_padding_block_is_never_handed_out() -> None:
    cache = make(num_blocks=5)
    tables = [cache.admit(f"r{i}", toks(4, seed=i), 1).block_table for i in range(4)]
    assert sorted(b for t in tables for b in t) == [1, 2, 3, 4]
    assert cache.admit("r4", toks(4, seed=9), 1).admission is Admission.LATER
    cache.check_invariants()


def test_disabled_mode_registers_nothing() -> None:
    cache = make(enabled=False)
    t = toks(24)
    for rid in ("a", "b"):
        res = cache.admit(rid, t, 2)
        assert res.cached_tokens == 0 and res.restore_snapshot is None
        assert prefill(cache, rid, t) == []
        assert cache.inflight_boundary(t) == 0
        cache.release(rid)
        assert cache.num_free_blocks == cache.num_usable_blocks
        assert cache.num_inactive_blocks == 0
    stats = cache.stats
    assert stats.queries == 48 and stats.hits == 0 and stats.kv_registrations == 0
    assert stats.snapshot_saves == 0 and cache.num_snapshots_used == 0
    assert cache.match(t) == 0
    cache.check_invariants()


def test_failed_step_rolls_back_to_the_state_before_admit() -> None:
    cache = make()
    t = toks(24)
    warm(cache, t)
    longer = t + toks(10, seed=5)
    before = state(cache)
    res = cache.admit("b", longer, 8)
    assert res.cached_tokens == 24 and res.restore_snapshot is not None
    assert state(cache) != before
    # The forward raised: the engine calls release; on_computed never ran for that step.
    cache.release("b")
    assert state(cache) == before
    # A save that is aborted publishes nothing and frees its slot.
    res = cache.admit("c", longer, 8)
    cache.restore_done("c")
    save = cache.on_computed("c", longer, 32, snapshot_ok=True)
    assert save is not None and save.boundary == 32
    cache.abort(save)
    cache.abort(save)  # idempotent
    with pytest.raises(ValueError, match="not pending"):
        cache.publish(save)
    assert cache.match(longer + [1]) == 24
    cache.release("c")
    assert cache.snapshot_pool.published_keys() == before[3]
    cache.check_invariants()


def test_snapshot_pinned_until_restore_done() -> None:
    cache = make(slots=1)
    t = toks(9)
    warm(cache, t)
    res = cache.admit("b", t, 1)
    assert res.restore_snapshot is not None
    other = toks(8, seed=4)
    cache.admit("c", other, 1)
    assert cache.on_computed("c", other, 8, snapshot_ok=True) is None
    assert cache.stats.snapshot_skips == 1, "only slot is pinned by b's restore"
    cache.restore_done("b")
    cache.release("c")
    cache.admit("c2", other, 1)
    save = cache.on_computed("c2", other, 8, snapshot_ok=True)
    assert save is not None and cache.stats.snapshot_evictions == 1
    cache.release("c2")
    cache.release("b")
    cache.check_invariants()


def test_duplicate_computation_and_duplicate_snapshot() -> None:
    cache = make()
    t = toks(16)
    for rid in ("a", "b"):
        assert cache.admit(rid, t, 1).cached_tokens == 0
    first = cache.on_computed("a", t, 8, snapshot_ok=True)
    assert first is not None
    cache.publish(first)
    assert cache.on_computed("b", t, 8, snapshot_ok=True) is None, "duplicate key: no copy"
    assert cache.stats.snapshot_duplicates == 1
    cache.release("a")
    cache.release("b")
    assert cache.num_inactive_blocks == 2 and cache.num_free_blocks == cache.num_usable_blocks - 2
    cache.check_invariants()


def test_inflight_boundary_tracks_prefixes_being_computed() -> None:
    cache = make()
    t = toks(20)
    query = t + [7, 7, 7]
    assert cache.inflight_boundary(query) == 0
    cache.admit("a", t, 1)
    assert cache.inflight_boundary(query) == 16 and cache.match(query) == 0
    assert cache.inflight_boundary(t[:12]) == 8, "boundaries beyond len - 1 do not count"
    s8 = cache.on_computed("a", t, 8, snapshot_ok=True)
    assert s8 is not None
    cache.publish(s8)
    assert cache.inflight_boundary(query) == 16 and cache.match(query) == 8
    s16 = cache.on_computed("a", t, 16, snapshot_ok=True)
    assert s16 is not None
    assert cache.inflight_boundary(query) == 16, "pending until published"
    cache.publish(s16)
    assert cache.inflight_boundary(query) == 0 and cache.match(query) == 16
    cache.admit("b", query, 1)
    assert cache.inflight_boundary(query + [1]) == 0, "b starts at 16: nothing left to share"
    cache.release("a")
    cache.release("b")
    cache.admit("x", toks(20, seed=1), 1)
    cache.release("x")
    assert cache.inflight_boundary(toks(20, seed=1)) == 0, "released requests drop out"
    cache.check_invariants()


def test_zero_snapshot_slots_never_hit() -> None:
    cache = make(slots=0)
    t = toks(24)
    warm(cache, t)
    assert cache.match(t) == 0 and cache.inflight_boundary(t) == 0
    assert cache.admit("b", t, 1).cached_tokens == 0


def test_stats_count_tokens() -> None:
    cache = make()
    t = toks(24)
    warm(cache, t)
    cache.admit("b", t + [1], 1)
    stats = cache.stats
    assert stats.queries == 24 + 25 and stats.hits == 24
    assert stats.snapshot_saves == 3 and stats.snapshot_restores == 1
    assert stats.hit_rate == pytest.approx(24 / 49)


def test_import_pulls_no_torch() -> None:
    code = (
        "import sys, tt_serve.cache; "
        "bad = [m for m in ('torch', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
