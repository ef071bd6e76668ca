"""The tiers below the device pool: host memory and disk, behind one object the prefix cache asks.

Data flow (the prefix cache drives it; the engine moves the bytes):

* **Write-through on publish.** When a snapshot at b is published on the device, its unit (the
  snapshot + the KV of blocks [0, b), ``host_tier.py``) is read out at once, before anything
  can reuse the slot or the blocks, and stored here: only the blocks no tier holds yet are
  read (a conversation's next unit shares its head). Device eviction then simply drops: what
  it drops is already below.
* The host tier takes the unit in the engine thread (a dict insert, evicting by value); the
  **disk** write goes to a bounded queue served by one write-back thread, so a request never
  waits on a disk write. A full queue drops the write-back (counted): the unit stays on the
  host, it just will not survive a restart.
* **Restore.** ``longest`` says which of a request's cuts a tier holds; ``fetch`` returns the
  unit's bytes (host first; a disk unit is checked, then promoted to the host tier). The bytes
  are immutable and the caller holds them, so a host eviction racing the restore of the same
  unit changes nothing.
"""

from __future__ import annotations

import logging
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
    ) -> None:
        """``queue_units`` / ``queue_bytes``: the most write-backs, and their bytes, waiting
        for the disk (a unit the host tier evicts meanwhile is held by its write-back alone,
        so the queue is bounded in bytes too; one unit always fits an empty queue)."""
        if host is None and disk is None:
            raise ValueError("Tiers needs a host tier, a disk store or both")
        self.host = host
        self.disk = disk
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, queue_units))
        self._queue_bytes = queue_bytes
        self._pending_bytes = 0
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
        return cls(host, disk)

    # -- lookup and restore ------------------------------------------------------------------

    def holds(self, key: SnapshotKey) -> bool:
        return (self.host is not None and self.host.contains(key)) or (
            self.disk is not None and self.disk.contains(key)
        )

    def candidates(self, keys: Sequence[SnapshotKey]) -> list[SnapshotKey]:
        """The keys a tier holds, longest (last given) first."""
        return [k for k in reversed(keys) if self.holds(k)]

    def fetch(self, key: SnapshotKey, hashes: tuple[BlockHash, ...]) -> tuple[UnitData, str] | None:
        """The unit's bytes and the tier that had them; None on a miss (a bad disk file is a
        miss). A disk unit is promoted to the host tier."""
        if self.host is not None:
            got = self.host.get(key)
            if got is not None:
                return got, HOST
        if self.disk is None:
            return None
        data = self.disk.read(key)
        if data is None:
            return None
        if self.host is not None:
            self.host.put(key, hashes, data.snapshot, dict(zip(hashes, data.blocks, strict=True)))
        return data, DISK

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

    def store(
        self,
        key: SnapshotKey,
        hashes: tuple[BlockHash, ...],
        snapshot: bytes,
        new: dict[BlockHash, bytes],
    ) -> None:
        """Take a unit read from the device: into the host tier now, to disk in the background."""
        self._stored += 1
        if self.host is not None:
            self.host.put(key, hashes, snapshot, new)
        if self.disk is None or not self.disk.enabled or self.disk.contains(key):
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
                try:
                    self.disk.write(item.key, item.hashes, item.data)
                finally:
                    with self._pending_lock:
                        self._pending_bytes -= item.data.nbytes
                self._done += 1
            except Exception as exc:  # never let the writer die: the engine must not notice
                log.error("disk cache: write-back failed: %r", exc)
                self.disk.errors += 1
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued write-back is on disk (shutdown, tests)."""
        if self._thread is not None:
            self._queue.join()

    def close(self, timeout: float = 30.0) -> None:
        """Finish queued write-backs (up to ``timeout`` seconds) and stop the writer."""
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
        )
