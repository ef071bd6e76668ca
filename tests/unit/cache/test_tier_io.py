"""The disk tier off the engine thread: reads ahead by a reader thread (bounded, dropped when
nobody takes them) and the write-back policy (which cuts go to disk, paced in bytes/s)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.unit.cache.test_tiers import BS, FP, unit
from tt_serve.cache import PrefixCache, ResumeRule, TierPolicy, Tiers
from tt_serve.cache import tiers as tiers_mod
from tt_serve.cache.disk_store import DiskStore
from tt_serve.cache.host_tier import HostTier
from tt_serve.cache.prefix_cache import _disk_cuts
from tt_serve.cache.results import Admission
from tt_serve.cache.tiers import READING

AHEAD = TierPolicy(read_ahead_bytes=1 << 20)


def _written(tmp_path: Path, *convs: list[int], b: int = 16) -> list[tuple]:
    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    units = [unit(c, b) for c in convs]
    for key, hashes, data in units:
        assert disk.write(key, hashes, data)
    return units


def _take(tiers: Tiers, key: tuple, hashes: tuple) -> object:
    """fetch until the read ahead is in (the engine's loop, without an engine)."""
    for _ in range(200):
        got = tiers.fetch(key, hashes)
        if got is not READING:
            return got
        tiers.wait_read(0.05)
    raise AssertionError("the read ahead never finished")


def test_a_disk_unit_is_read_by_the_reader_thread_not_the_caller(tmp_path: Path) -> None:
    ((key, hashes, data),) = _written(tmp_path, [1] * 40)
    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    tiers = Tiers(HostTier(1 << 20, BS), disk, policy=AHEAD)
    readers: list[str] = []
    real = disk.read

    def spy(k: tuple, *rest: object) -> object:
        readers.append(threading.current_thread().name)
        return real(k, *rest)  # type: ignore[arg-type]

    disk.read = spy  # type: ignore[method-assign]
    assert tiers.fetch(key, hashes) is READING  # queued: the caller does not wait
    got = _take(tiers, key, hashes)
    assert got == (data, "disk") and readers == ["tier-reader"]
    st = tiers.stats
    assert st.disk_reads_ahead == 1 and st.disk_read_ahead_bytes == 0
    # promoted to the host tier: the next fetch is a host hit, no disk read
    assert tiers.fetch(key, hashes) == (data, "host") and readers == ["tier-reader"]
    tiers.close()


def test_reads_ahead_are_bounded_in_bytes(tmp_path: Path) -> None:
    """Past the bound a second unit is not even queued while the first is in flight."""
    (a, b) = _written(tmp_path, [1] * 40, [2] * 40)
    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    size = disk.unit_nbytes(a[0], len(a[1]))
    assert size > a[2].nbytes  # the estimate: the files, headers and checksums included
    tiers = Tiers(None, disk, policy=TierPolicy(read_ahead_bytes=size + size // 2))
    gate = threading.Event()
    real = disk.read
    read: list[int] = []

    def slow(k: tuple, *rest: object) -> object:
        gate.wait(5)
        read.append(k[1])
        return real(k, *rest)  # type: ignore[arg-type]

    disk.read = slow  # type: ignore[method-assign]
    assert tiers.fetch(a[0], a[1]) is READING
    assert tiers.fetch(b[0], b[1]) is READING  # over the bound: waits, unqueued
    assert tiers.stats.disk_read_ahead_bytes == size and tiers.reading()
    gate.set()
    assert _take(tiers, a[0], a[1]) == (a[2], "disk")
    assert _take(tiers, b[0], b[1]) == (b[2], "disk")  # queued once a's bytes were taken
    assert len(read) == 2 and not tiers.reading()
    tiers.close()


def test_a_read_nobody_takes_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The request ended while its unit was read: the bytes do not stay held."""
    (a, b) = _written(tmp_path, [1] * 40, [2] * 40)
    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    tiers = Tiers(None, disk, policy=AHEAD)
    assert tiers.fetch(a[0], a[1]) is READING
    while tiers.reading():
        tiers.wait_read(0.05)
    assert tiers.stats.disk_read_ahead_bytes == a[2].nbytes
    monkeypatch.setattr(tiers_mod, "_UNCLAIMED_S", 0.0)
    time.sleep(0.01)
    assert tiers.fetch(b[0], b[1]) is READING  # any later fetch sweeps
    monkeypatch.undo()
    st = tiers.stats
    assert st.disk_reads_dropped == 1
    assert _take(tiers, b[0], b[1]) == (b[2], "disk")
    assert tiers.stats.disk_read_ahead_bytes == 0
    tiers.close()


def test_a_torn_file_read_ahead_is_a_miss(tmp_path: Path) -> None:
    ((key, hashes, _),) = _written(tmp_path, [3] * 40)
    (path,) = tmp_path.rglob("*.unit")
    path.write_bytes(path.read_bytes()[:-5])
    tiers = Tiers(None, DiskStore.open(tmp_path, FP, 1 << 20), policy=AHEAD)
    assert _take(tiers, key, hashes) is None
    assert tiers.stats.disk_corrupt == 1 and not path.exists()
    tiers.close()


def test_admission_waits_for_the_read_and_changes_nothing_meanwhile(tmp_path: Path) -> None:
    prompt = [5] * 20
    ((_, _, data),) = _written(tmp_path, prompt)
    tiers = Tiers(None, DiskStore.open(tmp_path, FP, 1 << 20), policy=AHEAD)
    cache = PrefixCache(num_blocks=12, block_size=BS, num_snapshot_slots=2, stride=8, tiers=tiers)
    free = cache.block_pool.num_allocatable
    assert cache.admit("a", prompt, 4).admission is Admission.READING
    assert cache.block_pool.num_allocatable == free and cache.num_snapshots_used == 0
    cache.check_invariants()
    while tiers.reading():
        tiers.wait_read(0.05)
    res = cache.admit("a", prompt, 4)
    assert res.admission is Admission.NOW and res.cached_tokens == 16
    assert res.unit_write is not None and res.unit_write.block_data == data.blocks
    cache.restore_done("a")
    cache.release("a")
    cache.check_invariants()
    tiers.close()


# -- write-back --------------------------------------------------------------------------------


def test_resume_write_back_keeps_the_disk_to_the_cuts_it_names(tmp_path: Path) -> None:
    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    tiers = Tiers(HostTier(1 << 20, BS), disk, policy=TierPolicy(writeback="resume"))
    kept, skipped = unit([1] * 40, 16), unit([1] * 40, 8)
    for (key, hashes, data), to_disk in ((kept, True), (skipped, False)):
        new = dict(zip(hashes, data.blocks, strict=True))
        tiers.store(key, hashes, data.snapshot, new, to_disk=to_disk)
    tiers.flush()
    assert disk.contains(kept[0]) and not disk.contains(skipped[0])
    st = tiers.stats
    assert st.writebacks_skipped == 1 and st.host_units == 2
    assert st.disk_bytes_written == disk.used_bytes > 0
    # a host restore proves the skipped unit reused: it goes to disk now
    assert tiers.fetch(skipped[0], skipped[1]) == (skipped[2], "host")
    tiers.flush()
    assert disk.read(skipped[0]) == skipped[2]
    tiers.close()


def test_all_write_back_writes_every_unit(tmp_path: Path) -> None:
    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    tiers = Tiers(None, disk, policy=TierPolicy(writeback="all"))
    key, hashes, data = unit([2] * 40, 8)
    assert tiers.takes(False)
    tiers.store(
        key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True)), to_disk=False
    )
    tiers.flush()
    assert disk.read(key) == data
    # without a host tier, a unit the resume policy skips is not even read off the device
    resume = Tiers(None, disk, policy=TierPolicy(writeback="resume"))
    assert not resume.takes(False) and resume.stats.writebacks_skipped == 1
    tiers.close()


def test_write_back_is_paced_to_its_byte_budget(tmp_path: Path) -> None:
    disk = DiskStore.open(tmp_path, FP, 1 << 20)
    units = [unit([c] * 40, 16) for c in range(4)]
    size = units[0][2].nbytes
    rate = size * 20  # 50 ms a unit
    tiers = Tiers(None, disk, policy=TierPolicy(writeback="all", write_bytes_per_s=rate))
    start = time.monotonic()
    for key, hashes, data in units:
        tiers.store(key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True)))
    tiers.flush()
    assert time.monotonic() - start >= 3 * size / rate  # the first goes at once
    assert tiers.stats.writebacks_done == 4
    tiers.close()


def test_the_disk_cuts_of_a_request() -> None:
    """A chat prompt: its first and last message cuts; raw tokens: the last chunk cut."""
    rule = ResumeRule(chunk=8, grid=4, boundary_ids=frozenset({99}))
    chat = [99] + [1] * 9 + [99] + [2] * 9 + [99] + [3] * 12 + [99] + [4] * 5
    pts = rule.points(chat)
    assert _disk_cuts(pts) == (8, 32) and set(pts.cuts) > {8, 32}
    assert _disk_cuts(rule.points([1] * 30)) == (24,)
    assert _disk_cuts(rule.points([1] * 7)) == ()
