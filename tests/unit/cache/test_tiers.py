"""Host tier, disk store and the tiers object: joint units, budgets, atomic checksummed files."""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tt_serve.cache import PrefixCache, Tiers, block_hashes
from tt_serve.cache.disk_store import DiskStore, DiskStoreError
from tt_serve.cache.host_tier import HostTier, UnitData

BS = 4
FP = b"f" * 16


def unit(tokens: list[int], b: int) -> tuple[tuple[bytes, int], tuple[bytes, ...], UnitData]:
    """The key, hashes and a payload (derived from the content) of the unit at b of tokens."""
    hashes = tuple(block_hashes(tokens[:b], BS))
    blocks = tuple(h * 4 for h in hashes)  # 64 bytes per block, unique per content
    return (hashes[-1], b), hashes, UnitData(b"S" * 100 + hashes[-1], blocks)


def put(tier: HostTier, tokens: list[int], b: int) -> bool:
    key, hashes, data = unit(tokens, b)
    return tier.put(key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=40))
def test_host_tier_past_its_budget_keeps_only_whole_units(ops: list[tuple[int, int]]) -> None:
    """Filled past its budget by conversations of shared heads: never over budget, every block
    held belongs to a unit that also holds its snapshot, and every unit restores exactly."""
    convs = [[c % 3] * 8 + [c] * 16 for c in range(6)]  # heads shared by c % 3
    tier = HostTier(budget_bytes=1200, block_size=BS)
    for c, k in ops:
        put(tier, convs[c], k * BS)
        tier.check_invariants()
        assert tier.used_bytes <= tier.budget_bytes
        for key in tier.unit_keys():
            got = tier.get(key)
            assert got is not None
            c2 = next(
                i for i in range(6) if len(convs[i]) >= key[1] and unit(convs[i], key[1])[0] == key
            )
            assert got == unit(convs[c2], key[1])[2]
    assert tier.evictions > 0 or tier.used_bytes <= 1200


def test_host_tier_evicts_by_value_and_rejects_oversize() -> None:
    tier = HostTier(budget_bytes=700, block_size=BS)  # units: 372, 180, 244 bytes
    deep, shallow = [1] * 24, [2] * 24
    assert put(tier, deep, 16)
    for _ in range(3):
        assert tier.get(unit(deep, 16)[0]) is not None  # a deep, often used unit
    assert put(tier, shallow, 4)
    assert put(tier, [3] * 24, 8)  # room needed: the shallow one goes, not the deep one
    assert tier.contains(unit(deep, 16)[0]) and not tier.contains(unit(shallow, 4)[0])
    assert not HostTier(budget_bytes=200, block_size=BS).put(*_args(deep, 16))
    tier.check_invariants()


def _args(tokens: list[int], b: int) -> tuple:  # type: ignore[type-arg]
    key, hashes, data = unit(tokens, b)
    return key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True))


def test_disk_store_round_trip_and_restart(tmp_path: Path) -> None:
    toks = list(range(40))
    key, hashes, data = unit(toks, 16)
    d = DiskStore.open(tmp_path, FP, 1 << 20)
    assert d.write(key, hashes, data)
    assert d.read(key) == data
    again = DiskStore.open(tmp_path, FP, 1 << 20)  # a restart finds it
    assert again.contains(key) and again.read(key) == data
    other = DiskStore.open(tmp_path, b"g" * 16, 1 << 20)  # another checkpoint: its own folder
    assert not other.contains(key) and other.read(key) is None


@pytest.mark.parametrize("target", ["unit", "block"])
def test_disk_store_flipped_byte_is_a_miss_and_removed(tmp_path: Path, target: str) -> None:
    key, hashes, data = unit(list(range(40)), 16)
    d = DiskStore.open(tmp_path, FP, 1 << 20)
    d.write(key, hashes, data)
    folder = tmp_path / FP.hex() / ("units" if target == "unit" else "blocks")
    path = sorted(folder.iterdir())[0]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    fresh = DiskStore.open(tmp_path, FP, 1 << 20)
    assert fresh.read(key) is None
    assert fresh.corrupt == 1 and not path.exists()
    assert fresh.read(key) is None  # and stays a miss


def test_disk_store_torn_file_and_leftover_temp_are_never_read(tmp_path: Path) -> None:
    key, hashes, data = unit(list(range(40)), 16)
    d = DiskStore.open(tmp_path, FP, 1 << 20)
    d.write(key, hashes, data)
    upath = next((tmp_path / FP.hex() / "units").iterdir())
    upath.write_bytes(upath.read_bytes()[:-7])  # torn: a crash of a non-atomic writer
    (upath.parent / (upath.name + ".tmp.1.ab")).write_bytes(b"half")
    fresh = DiskStore.open(tmp_path, FP, 1 << 20)
    assert fresh.read(key) is None and fresh.corrupt == 1


def test_disk_store_stays_within_budget(tmp_path: Path) -> None:
    d = DiskStore.open(tmp_path, FP, 4000)
    for c in range(20):
        key, hashes, data = unit([c] * 40, 16)
        assert d.write(key, hashes, data)
        assert d.used_bytes <= 4000 + 1000  # at most the unit just written over
    on_disk = sum(p.stat().st_size for p in (tmp_path / FP.hex()).rglob("*") if p.is_file())
    assert on_disk == d.used_bytes <= 4000
    assert d.evictions > 0
    key, hashes, data = unit([19] * 40, 16)
    assert d.read(key) == data  # the newest survives


def test_disk_store_unusable_folder_is_a_startup_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DiskStoreError, match="not writable"):
        DiskStore.open(blocker / "cache", FP, 1 << 20)
    with pytest.raises(DiskStoreError, match="positive size"):
        DiskStore.open(tmp_path, FP, 0)


def test_disk_write_error_degrades_to_no_disk_tier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk mid-run: the write fails, is counted, and the disk tier turns off."""
    d = DiskStore.open(tmp_path, FP, 1 << 20)

    def full(path: Path, *parts: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(d, "_atomic_write", full)
    key, hashes, data = unit(list(range(40)), 16)
    assert not d.write(key, hashes, data)
    assert not d.enabled and d.errors == 1
    assert not d.contains(key) and d.read(key) is None
    assert not list((tmp_path / FP.hex()).rglob("*.tmp.*"))


def test_tiers_write_back_queue_drops_when_full(tmp_path: Path) -> None:
    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    tiers = Tiers(HostTier(1 << 20, BS), disk, queue_units=1)
    import threading

    gate = threading.Event()
    real = disk.write

    def slow(*a: object) -> bool:
        gate.wait(5)
        return real(*a)  # type: ignore[arg-type]

    disk.write = slow  # type: ignore[method-assign]
    for c in range(4):
        key, hashes, data = unit([c] * 40, 16)
        tiers.store(key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True)))
    gate.set()
    tiers.flush()
    st = tiers.stats
    assert st.writebacks_dropped >= 2 and st.writebacks_done + st.writebacks_dropped == 4
    assert st.host_units == 4  # the host tier keeps what the disk queue dropped
    tiers.close()


def test_prefix_cache_restores_a_unit_from_the_host_tier() -> None:
    """Admission with a tier hit: blocks allocated and registered, the snapshot published and
    pinned, the bytes to write handed out; everything returns to the pools on release."""
    tiers = Tiers(HostTier(1 << 20, BS), None)
    cache = PrefixCache(num_blocks=12, block_size=BS, num_snapshot_slots=2, stride=8, tiers=tiers)
    rng = random.Random(0)
    prompt = [rng.randrange(100) for _ in range(20)]
    key, hashes, data = unit(prompt, 16)
    tiers.store(key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True)))
    res = cache.admit("a", prompt, 4)
    assert res.cached_tokens == 16 and res.unit_write is not None
    w = res.unit_write
    assert w.blocks == res.block_table[:4] and w.block_data == data.blocks
    assert w.snapshot == data.snapshot and w.snapshot_slot == res.restore_snapshot
    cache.check_invariants()
    assert cache.match(prompt) == 16  # now a device hit too
    cache.restore_done("a")
    cache.release("a")
    cache.check_invariants()
    assert cache.num_active_blocks == 0


def test_two_replicas_sharing_a_folder_do_not_corrupt_it(tmp_path: Path) -> None:
    """Two stores on one folder write the same and different units at once (shared heads:
    the same block files): afterwards each reads every unit intact, nothing is torn, no
    temporary file is left."""
    import threading

    a, b = DiskStore.open(tmp_path, FP, 1 << 22), DiskStore.open(tmp_path, FP, 1 << 22)
    convs = [[c % 3] * 8 + [c] * 32 for c in range(12)]
    units = [unit(t, k) for t in convs for k in (8, 16, 32)]

    def writer(store: DiskStore, order: list[int]) -> None:
        for i in order:
            key, hashes, data = units[i]
            assert store.write(key, hashes, data)

    n = len(units)
    threads = [
        threading.Thread(target=writer, args=(a, list(range(n)))),
        threading.Thread(target=writer, args=(b, list(reversed(range(n))))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for store in (a, b, DiskStore.open(tmp_path, FP, 1 << 22)):
        for key, _, data in units:
            assert store.read(key) == data
        assert store.corrupt == 0 and store.errors == 0
    assert not list(tmp_path.rglob("*.tmp.*"))


def test_tiers_write_back_queue_is_bounded_in_bytes(tmp_path: Path) -> None:
    """Units the disk has not taken yet hold their bytes: past ``queue_bytes`` they are
    dropped (the first always fits an empty queue)."""
    import threading

    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    tiers = Tiers(None, disk, queue_units=64, queue_bytes=500)
    gate = threading.Event()
    real = disk.write

    def slow(*a: object) -> bool:
        gate.wait(5)
        return real(*a)  # type: ignore[arg-type]

    disk.write = slow  # type: ignore[method-assign]
    for c in range(3):  # 372 bytes each: one fits, the rest would exceed 500
        key, hashes, data = unit([c] * 40, 16)
        tiers.store(key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True)))
    assert tiers.stats.writebacks_pending_bytes == 372
    gate.set()
    tiers.flush()
    st = tiers.stats
    assert st.writebacks_done == 1 and st.writebacks_dropped == 2
    assert st.writebacks_pending_bytes == 0
    tiers.close()


def test_disk_store_evicts_by_value(tmp_path: Path) -> None:
    """A deep unit restored often outlives shallow ones written after it."""
    d = DiskStore.open(tmp_path, FP, 2600)
    deep = unit([7] * 40, 32)  # 8 blocks
    d.write(*deep)
    for _ in range(3):
        assert d.read(deep[0]) == deep[2]
    for c in range(8):  # shallow units (1 block each) push the folder past its budget
        d.write(*unit([c] * 40, 4))
    assert d.evictions > 0
    assert d.read(deep[0]) == deep[2]
    assert d.used_bytes <= 2600
