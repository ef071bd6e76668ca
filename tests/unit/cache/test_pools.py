"""BlockPool and SnapshotPool on their own."""

from __future__ import annotations

from collections import Counter

import pytest

from tt_serve.cache import PAD_BLOCK, BlockPool, SnapshotPool
from tt_serve.model.interface import PAD_BLOCK as INTERFACE_PAD_BLOCK


def key(i: int, b: int = 4) -> tuple[bytes, int]:
    return (bytes([i]) * 16, b)


def test_pad_block_matches_backend_boundary() -> None:
    assert PAD_BLOCK == INTERFACE_PAD_BLOCK == 0


def test_padding_block_is_never_handed_out() -> None:
    pool = BlockPool(6)
    got = pool.allocate(5)
    assert sorted(got) == [1, 2, 3, 4, 5]
    assert pool.num_allocatable == 0
    with pytest.raises(ValueError, match="cannot allocate"):
        pool.allocate(1)
    pool.check_invariants(Counter(got))


def test_release_registered_goes_inactive_unregistered_goes_free() -> None:
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    assert pool.register(a, b"h" * 16)
    assert not pool.register(b, b"h" * 16), "same content twice: second block stays unregistered"
    pool.release([a, b])
    assert (pool.num_free, pool.num_inactive, pool.num_active) == (2, 1, 0)
    assert pool.lookup(b"h" * 16) == a
    pool.check_invariants(Counter())


def test_reclaim_is_lru_and_drops_registration() -> None:
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.register(a, b"a" * 16)
    pool.register(b, b"b" * 16)
    pool.release([a])
    pool.release([b])
    (c,) = pool.allocate(1)
    assert c == a, "least recently released block is reclaimed first"
    assert pool.lookup(b"a" * 16) is None and pool.lookup(b"b" * 16) == b
    assert pool.evictions == 1
    pool.acquire(b)
    assert pool.num_active == 2 and pool.num_inactive == 0
    pool.check_invariants(Counter([b, c]))


def test_table_tail_is_reclaimed_first() -> None:
    pool = BlockPool(4)
    table = pool.allocate(3)
    for i, blk in enumerate(table):
        pool.register(blk, bytes([i]) * 16)
    pool.release(table)
    assert pool.inactive_blocks()[0] == table[-1]


def test_disabled_pool_registers_nothing() -> None:
    pool = BlockPool(4, enabled=False)
    (a,) = pool.allocate(1)
    assert not pool.register(a, b"h" * 16)
    pool.release([a])
    assert pool.num_free == 3 and pool.num_inactive == 0
    pool.check_invariants(Counter())


def test_invariant_check_catches_refcount_drift() -> None:
    pool = BlockPool(4)
    (a,) = pool.allocate(1)
    with pytest.raises(AssertionError, match="refcount"):
        pool.check_invariants(Counter())
    pool.check_invariants(Counter([a]))


def test_snapshot_two_phase_publish_and_abort() -> None:
    snaps = SnapshotPool(2)
    s = snaps.reserve(key(1))
    assert s is not None and snaps.lookup(key(1)) is None, "pending is not visible"
    snaps.publish(s)
    assert snaps.lookup(key(1)) == s
    t = snaps.reserve(key(2))
    assert t is not None
    snaps.abort(t)
    assert snaps.lookup(key(2)) is None and snaps.num_used == 1
    with pytest.raises(ValueError):
        snaps.publish(t)
    snaps.check_invariants(Counter())


def test_snapshot_duplicate_refreshes_lru_without_copy() -> None:
    snaps = SnapshotPool(2)
    for i in (1, 2):
        slot = snaps.reserve(key(i))
        assert slot is not None
        snaps.publish(slot)
    assert snaps.reserve(key(1)) is None and snaps.duplicates == 1
    slot = snaps.reserve(key(3))  # evicts key 2, the least recently used after the refresh
    assert slot is not None
    assert snaps.lookup(key(1)) is not None and snaps.lookup(key(2)) is None
    assert snaps.evictions == 1


def test_snapshot_full_or_pinned_pool_skips_softly() -> None:
    snaps = SnapshotPool(1)
    slot = snaps.reserve(key(1))
    assert slot is not None
    assert snaps.reserve(key(2)) is None, "only slot is pending"
    snaps.publish(slot)
    snaps.pin(slot)
    assert snaps.reserve(key(2)) is None, "only slot is pinned"
    assert snaps.skips == 2 and snaps.lookup(key(1)) == slot
    snaps.check_invariants(Counter({slot: 1}))
    snaps.unpin(slot)
    assert snaps.reserve(key(2)) == slot and snaps.evictions == 1


def test_zero_snapshot_slots() -> None:
    snaps = SnapshotPool(0)
    assert snaps.reserve(key(1)) is None and snaps.skips == 1
