"""The tiers below the device pool: host memory and disk, behind one object the prefix cache asks.

Data flow (the prefix cache drives it; the engine moves the bytes):

* **Write-through on publish.** When a snapshot at b is published on the device, its unit (the
  snapshot + the KV of blocks [0, b), ``host_tier.py``) is read out at once, before anything
  can reuse the slot or the blocks, and stored here: only the blocks no tier holds yet are
  read (a conversation's next unit shares its head). Device eviction then simply drops: what
  it drops is already below.
* The host tier takes every unit in the engine thread (a dict insert, evicting by value). The
  **disk** takes the units a restart or another replica will want (``TierPolicy.writeback``):
  under ``resume`` (the default) a request's first and last message cuts (the shared head and
  where the conversation's next turn resumes; without message cuts, its last chunk cut), plus
  any unit a host-tier restore proved reused; chunk ends and prompt ends in between stay in
  host memory. ``all`` writes every unit through (the A/B control). The writes go to a bounded
  queue served by one write-back thread, paced to ``write_bytes_per_s``, so a request never
  waits on a disk write. A full queue drops the write-back (counted): the unit stays on the
  host, it just will not survive a restart.
* **Restore.** ``candidates`` says which of a request's cuts a tier holds; ``fetch`` returns the
  unit's bytes (host first; a disk unit is checked, then promoted to the host tier). The bytes
  are immutable and the caller holds them, so a host eviction racing the restore of the same
  unit changes nothing.
* **The engine step never reads the disk** (``TierPolicy.read_ahead_bytes`` > 0): ``fetch`` of
  a disk-only unit queues it for one reader thread and answers ``READING``; the request waits
  (the scheduler admits others behind it) while the step runs, and the next ``fetch`` after the
  read takes the checked bytes from memory. Reads in flight and read but not yet taken are
  bounded in bytes; a read nobody takes within ``_UNCLAIMED_S`` (its request ended) is dropped.
  ``read_ahead_bytes=0`` reads on the engine thread (the A/B control).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tt_serve.cache.disk_store import DiskStore, DiskStoreError
from tt_serve.cache.hashing import BlockHash
from tt_serve.cache.host_tier import HostTier, UnitData
from tt_serve.cache.snapshot_pool import SnapshotKey

log = logging.getLogger(__name__)

HOST, DISK = "host", "disk"
WRITEBACK_POLICIES = ("resume", "all")
_UNCLAIMED_S = 30.0  # a unit read ahead and not taken for this long is dropped
# While the engine steps, the reader runs niced and sleeps _READ_YIELD_S after each
# _READ_BURST bytes: on a CPU the step's threads hold every core, and a reader that reads on
# holds the GIL through the step's ops (2 cores, 128k-token units: the step p99 rose from 10 to
# over 200 ms reading block by block without pauses, and stayed at 9 ms with them).
_READER_NICE = 10
_READ_BURST = 4 << 20
_READ_YIELD_S = 0.01


@dataclass(frozen=True)
class TierPolicy:
    """How the tiers use the disk (module docstring; ``--disk-read-ahead-mb``,
    ``--disk-writeback``, ``--disk-write-mb-per-s``)."""

    read_ahead_bytes: int = 1 << 30  # 0: reads on the engine thread
    writeback: str = "resume"
    write_bytes_per_s: int = 0  # 0: unpaced

    def __post_init__(self) -> None:
        if self.writeback not in WRITEBACK_POLICIES:
            raise ValueError(
                f"disk write-back must be one of {WRITEBACK_POLICIES}, got {self.writeback!r}"
            )
        if self.read_ahead_bytes < 0 or self.write_bytes_per_s < 0:
            raise ValueError("the disk read-ahead and write budgets must not be negative")


class Reading:
    """``fetch``'s answer while the unit is being read from disk: ask again after the step."""


READING = Reading()


@dataclass(frozen=True)
class TierStats:
    """Counters and gauges of the tiers (Prometheus: ``server/metrics.py``)."""

    host_units: int = 0
    host_bytes: int = 0
    host_budget_bytes: int = 0
    host_evictions: int = 0
    host_hits: int = 0  # restores served by the host tier ...
    host_hit_tokens: int = 0  # ... and the prompt tokens they spared
    disk_units: int = 0
    disk_bytes: int = 0
    disk_budget_bytes: int = 0
    disk_evictions: int = 0
    disk_hits: int = 0
    disk_hit_tokens: int = 0
    disk_errors: int = 0  # I/O errors; the first write error turns the disk tier off
    disk_corrupt: int = 0  # files that failed a check on read (a miss, removed)
    disk_enabled: bool = False
    units_stored: int = 0  # units written through from the device
    restores: int = 0
    restore_seconds: float = 0.0  # fetch + device write, summed over restores
    restore_seconds_max: float = 0.0
    restore_bytes: int = 0
    writethrough_seconds: float = 0.0  # engine-thread time reading units out of the device
    writebacks_queued: int = 0
    writebacks_pending: int = 0
    writebacks_dropped: int = 0  # the queue was full (in units or bytes)
    writebacks_pending_bytes: int = 0
    writebacks_done: int = 0
    writebacks_skipped: int = 0  # units the write-back policy kept off the disk
    disk_bytes_written: int = 0  # by this process (unit and block files, headers included)
    disk_reads_ahead: int = 0  # units the reader thread read for a waiting request
    disk_read_wait_seconds: float = 0.0  # from queueing a read to the request taking it
    disk_read_ahead_bytes: int = 0  # bytes read ahead or being read, not yet taken
    disk_reads_dropped: int = 0  # read ahead, never taken (the request ended)


@dataclass
class _Read:
    hashes: tuple[BlockHash, ...]
    nbytes: int  # an estimate until the read is done
    queued: float
    done: bool = False
    data: UnitData | None = None  # None when done: a miss (a bad file, removed)
    finished: float = 0.0


_STOP = object()


@dataclass(frozen=True)
class _WriteBack:
    key: SnapshotKey
    hashes: tuple[BlockHash, ...]
    data: UnitData


class Tiers:
    """A host tier, a disk store, or both (module docstring)."""

    def __init__(
        self,
        host: HostTier | None,
        disk: DiskStore | None,
        *,
        queue_units: int = 64,
        queue_bytes: int = 1 << 30,
        policy: TierPolicy | None = None,
    ) -> None:
        """``queue_units`` / ``queue_bytes``: the most write-backs, and their bytes, waiting
        for the disk (a unit the host tier evicts meanwhile is held by its write-back alone,
        so the queue is bounded in bytes too; one unit always fits an empty queue).
        ``policy``: how the disk is used (None: everything written through, reads on the
        calling thread, unpaced: the plain behaviour unit tests drive step by step)."""
        if host is None and disk is None:
            raise ValueError("Tiers needs a host tier, a disk store or both")
        self.host = host
        self.disk = disk
        self.policy = policy or TierPolicy(read_ahead_bytes=0, writeback="all")
        self._skipped = 0
        self._pace_until = 0.0  # the write-back thread's next free moment under the budget
        # The reader (module docstring): key -> read in flight or done, under _read_lock.
        self._reads: dict[SnapshotKey, _Read] = {}
        self._read_bytes = 0
        self._read_lock = threading.Lock()
        self._read_q: queue.Queue[object] = queue.Queue()
        self._read_done = threading.Event()
        self._reader: threading.Thread | None = None
        self._reads_ahead = 0
        self._read_wait_s = 0.0
        self._reads_dropped = 0
        self.busy = False  # the engine is stepping other requests (set by the engine thread)
        self._burst = 0  # bytes the reader read since it last paused
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, queue_units))
        self._queue_bytes = queue_bytes
        self._pending_bytes = 0
        self._pending_keys: set[SnapshotKey] = set()
        self._pending_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._hits = {HOST: 0, DISK: 0}
        self._hit_tokens = {HOST: 0, DISK: 0}
        self._stored = 0
        self._restores = 0
        self._restore_s = 0.0
        self._restore_max = 0.0
        self._restore_bytes = 0
        self._writethrough_s = 0.0
        self._queued = 0
        self._dropped = 0
        self._done = 0

    @classmethod
    def open(
        cls,
        *,
        block_size: int,
        host_bytes: int = 0,
        disk_dir: str | None = None,
        disk_bytes: int = 0,
        fingerprint: bytes = b"",
        policy: TierPolicy | None = None,
    ) -> Tiers | None:
        """The tiers asked for (None when neither): a host tier of ``host_bytes`` (> 0) and a
        disk store in ``disk_dir`` under ``fingerprint``. ValueError naming the folder when it
        cannot be used: a startup error, never a silent cold start."""
        host = HostTier(host_bytes, block_size) if host_bytes > 0 else None
        disk = None
        if disk_dir is not None:
            if len(fingerprint) < 8:
                raise ValueError("the disk tier needs a checkpoint fingerprint")
            try:
                disk = DiskStore.open(disk_dir, fingerprint, disk_bytes)
            except DiskStoreError as exc:
                raise ValueError(f"--disk-cache-dir: {exc}") from exc
            log.info(
                "disk tier: %s (%d units, %d of %d bytes)",
                disk_dir,
                disk.num_units,
                disk.used_bytes,
                disk_bytes,
            )
        if host is None and disk is None:
            return None
        return cls(host, disk, policy=policy or TierPolicy())

    # -- lookup and restore ------------------------------------------------------------------

    def holds(self, key: SnapshotKey) -> bool:
        return (self.host is not None and self.host.contains(key)) or (
            self.disk is not None and self.disk.contains(key)
        )

    def candidates(self, keys: Sequence[SnapshotKey]) -> list[SnapshotKey]:
        """The keys a tier holds, longest (last given) first."""
        return [k for k in reversed(keys) if self.holds(k)]

    def fetch(
        self, key: SnapshotKey, hashes: tuple[BlockHash, ...]
    ) -> tuple[UnitData, str] | Reading | None:
        """The unit's bytes and the tier that had them; None on a miss (a bad disk file is a
        miss); ``READING`` while the reader thread reads it (module docstring). A disk unit is
        promoted to the host tier; a host unit the disk lacks is written back now (a restore
        proved it reused)."""
        if self.host is not None:
            got = self.host.get(key)
            if got is not None:
                if self.disk is not None and self.policy.writeback == "resume":
                    self._write_back(key, hashes, got.snapshot, {})
                return got, HOST
        if self.disk is None:
            return None
        if self.policy.read_ahead_bytes:
            taken = self._take_read(key, hashes)
            if isinstance(taken, Reading):
                return taken
            data = taken
        else:
            data = self.disk.read(key)
        if data is None:
            return None
        if self.host is not None:
            self.host.put(key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True)))
        return data, DISK

    # -- the reader --------------------------------------------------------------------------

    def _take_read(
        self, key: SnapshotKey, hashes: tuple[BlockHash, ...]
    ) -> UnitData | Reading | None:
        """The unit read ahead (None: it turned out a miss), else queue its read: READING."""
        assert self.disk is not None
        now = time.monotonic()
        with self._read_lock:
            self._drop_unclaimed(now)
            r = self._reads.get(key)
            if r is not None:
                if not r.done:
                    return READING
                del self._reads[key]
                self._read_bytes -= r.nbytes
                self._read_wait_s += now - r.queued
                return r.data
            size = self.disk.unit_nbytes(key, len(hashes))
            if self._reads and self._read_bytes + size > self.policy.read_ahead_bytes:
                return READING  # past the bound: asked again once a read is taken
            self._reads[key] = _Read(hashes, size, now)
            self._read_bytes += size
        self._read_q.put(key)
        if self._reader is None:
            self._reader = threading.Thread(target=self._read_loop, name="tier-reader", daemon=True)
            self._reader.start()
        return READING

    def _drop_unclaimed(self, now: float) -> None:
        for key, r in list(self._reads.items()):
            if r.done and now - r.finished > _UNCLAIMED_S:
                del self._reads[key]
                self._read_bytes -= r.nbytes
                self._reads_dropped += 1

    def _read_loop(self) -> None:
        assert self.disk is not None
        _lower_priority()
        while True:
            key = self._read_q.get()
            if key is _STOP:
                return
            assert isinstance(key, tuple)
            try:
                data = self.disk.read(key, self._pause)
            except Exception as exc:  # a miss, never a dead reader
                log.error("disk cache: read-ahead failed: %r", exc)
                data = None
            with self._read_lock:
                r = self._reads.get(key)
                if r is not None:
                    self._read_bytes += (data.nbytes if data else 0) - r.nbytes
                    r.nbytes = data.nbytes if data else 0
                    r.data, r.done, r.finished = data, True, time.monotonic()
                    self._reads_ahead += 1
            self._read_done.set()

    def _pause(self, nbytes: int) -> None:
        self._burst += nbytes
        if self._burst >= _READ_BURST:
            self._burst = 0
            if self.busy:
                time.sleep(_READ_YIELD_S)

    def reading(self) -> bool:
        """Whether a read ahead is still in flight."""
        with self._read_lock:
            return any(not r.done for r in self._reads.values())

    def wait_read(self, timeout: float) -> None:
        """Block until a read ahead finishes (or ``timeout``): the engine when nothing else can
        run."""
        if self._read_done.wait(timeout):
            self._read_done.clear()

    def record_restore(self, tier: str, tokens: int, nbytes: int, seconds: float) -> None:
        """A unit from ``tier`` sparing ``tokens`` prompt tokens is on the device."""
        self._hits[tier] += 1
        self._hit_tokens[tier] += tokens
        self._restores += 1
        self._restore_s += seconds
        self._restore_max = max(self._restore_max, seconds)
        self._restore_bytes += nbytes

    # -- write-through -----------------------------------------------------------------------

    def record_writethrough(self, seconds: float) -> None:
        """Engine-thread time spent reading a unit out of the device (the write-through's
        only cost on the request path)."""
        self._writethrough_s += seconds

    def missing(self, hashes: Sequence[BlockHash]) -> list[int]:
        """Indices of the blocks to read from the device for a new unit: those the host tier
        lacks (without one: those the disk lacks)."""
        if self.host is not None:
            return [i for i, h in enumerate(hashes) if not self.host.has_block(h)]
        assert self.disk is not None
        return [i for i, h in enumerate(hashes) if not self.disk.has_block(h)]

    def takes(self, to_disk: bool) -> bool:
        """Whether a unit the write-back policy would (``to_disk``) or would not send to disk
        is worth reading out of the device at all (without a host tier, one the disk would
        not take is not: counted as skipped)."""
        if self.host is not None or self._disk_keeps(to_disk):
            return True
        self._skipped += 1
        return False

    def _disk_keeps(self, to_disk: bool) -> bool:
        """Whether the write-back policy sends a unit to disk (``to_disk``: a cut it keeps)."""
        return to_disk or self.policy.writeback == "all"

    def store(
        self,
        key: SnapshotKey,
        hashes: tuple[BlockHash, ...],
        snapshot: bytes,
        new: dict[BlockHash, bytes],
        *,
        to_disk: bool = True,
    ) -> None:
        """Take a unit read from the device: into the host tier now, to disk in the background
        when the write-back policy takes it (``to_disk``: a cut the policy keeps)."""
        self._stored += 1
        if self.host is not None:
            self.host.put(key, hashes, snapshot, new)
        if self.disk is None:
            return
        if not self._disk_keeps(to_disk):
            self._skipped += 1
            return
        self._write_back(key, hashes, snapshot, new)

    def _write_back(
        self,
        key: SnapshotKey,
        hashes: tuple[BlockHash, ...],
        snapshot: bytes,
        new: dict[BlockHash, bytes],
    ) -> None:
        """Queue ``key``'s unit for the disk (blocks not in ``new`` come from the host tier)."""
        assert self.disk is not None
        if not self.disk.enabled or key in self._pending_keys or self.disk.contains(key):
            return
        # Blocks the disk already has travel as b"" (the writer skips them, and refuses the
        # unit if one of them vanished meanwhile).
        blocks = []
        for h in hashes:
            got = new.get(h) or (self.host.block(h) if self.host is not None else None)
            blocks.append(got or b"")
        item = _WriteBack(key, hashes, UnitData(snapshot, tuple(blocks)))
        size = item.data.nbytes
        with self._pending_lock:
            if self._pending_bytes and self._pending_bytes + size > self._queue_bytes:
                self._dropped += 1
                return
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                self._dropped += 1
                return
            self._pending_bytes += size
            self._pending_keys.add(key)
        self._queued += 1
        self._start_writer()

    def _start_writer(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._write_loop, name="tier-writer", daemon=True
            )
            self._thread.start()

    def _write_loop(self) -> None:
        assert self.disk is not None
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                assert isinstance(item, _WriteBack)
                self._pace(item.data.nbytes)
                try:
                    self.disk.write(item.key, item.hashes, item.data)
                finally:
                    with self._pending_lock:
                        self._pending_bytes -= item.data.nbytes
                        self._pending_keys.discard(item.key)
                self._done += 1
            except Exception as exc:  # never let the writer die: the engine must not notice
                log.error("disk cache: write-back failed: %r", exc)
                self.disk.errors += 1
            finally:
                self._queue.task_done()

    def _pace(self, nbytes: int) -> None:
        """Hold the write-back thread to ``write_bytes_per_s`` on average (a unit larger
        than a second's budget still goes, and the next waits longer)."""
        rate = self.policy.write_bytes_per_s
        if not rate:
            return
        now = time.monotonic()
        wait = self._pace_until - now
        if wait > 0:
            time.sleep(wait)
        self._pace_until = max(now, self._pace_until) + nbytes / rate

    def flush(self) -> None:
        """Wait until every queued write-back is on disk (shutdown, tests)."""
        if self._thread is not None:
            self._queue.join()

    def close(self, timeout: float = 30.0) -> None:
        """Finish queued write-backs (up to ``timeout`` seconds) and stop the writer and the
        reader."""
        if self._reader is not None:
            self._read_q.put(_STOP)
            self._reader.join(timeout)
            self._reader = None
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            self._queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
            self._thread.join(max(0.0, deadline - time.monotonic()))
        except queue.Full:
            log.warning("disk cache: %d write-back(s) left unwritten", self._queue.qsize())
        self._thread = None

    # -- stats -------------------------------------------------------------------------------

    @property
    def stats(self) -> TierStats:
        h, d = self.host, self.disk
        return TierStats(
            host_units=h.num_units if h else 0,
            host_bytes=h.used_bytes if h else 0,
            host_budget_bytes=h.budget_bytes if h else 0,
            host_evictions=h.evictions if h else 0,
            host_hits=self._hits[HOST],
            host_hit_tokens=self._hit_tokens[HOST],
            disk_units=d.num_units if d else 0,
            disk_bytes=d.used_bytes if d else 0,
            disk_budget_bytes=d.budget_bytes if d else 0,
            disk_evictions=d.evictions if d else 0,
            disk_hits=self._hits[DISK],
            disk_hit_tokens=self._hit_tokens[DISK],
            disk_errors=d.errors if d else 0,
            disk_corrupt=d.corrupt if d else 0,
            disk_enabled=bool(d and d.enabled),
            units_stored=self._stored,
            restores=self._restores,
            restore_seconds=self._restore_s,
            restore_seconds_max=self._restore_max,
            restore_bytes=self._restore_bytes,
            writethrough_seconds=self._writethrough_s,
            writebacks_queued=self._queued,
            writebacks_pending=self._queue.unfinished_tasks,
            writebacks_dropped=self._dropped,
            writebacks_pending_bytes=self._pending_bytes,
            writebacks_done=self._done,
            writebacks_skipped=self._skipped,
            disk_bytes_written=d.bytes_written if d else 0,
            disk_reads_ahead=self._reads_ahead,
            disk_read_wait_seconds=self._read_wait_s,
            disk_read_ahead_bytes=self._read_bytes,
            disk_reads_dropped=self._reads_dropped,
        )


def _lower_priority() -> None:
    """Nice the calling thread (Linux: per thread) so its checksums yield the cores to the
    engine's step; elsewhere, or when refused, nothing changes."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _READER_NICE)
