"""The disk tier: resume-point units as files that survive a restart, never read back wrong.

Layout under the cache directory, one folder per fingerprint (model checkpoint + precision +
block size: a changed checkpoint or profile looks in another folder, so it never restores an
old state)::

    <dir>/<fingerprint>/blocks/<block hash>.blk    the KV of one block (all attention layers)
    <dir>/<fingerprint>/units/<hash at b>-<b>.unit the snapshot at b + the hashes of [0, b)

Every file is ``magic | fingerprint | body | blake2b-256 of all before``; a read checks the
magic, the fingerprint, the key, the length and the checksum, and anything else is a **miss**:
the file is removed and counted, never returned. A unit's blocks are written before the unit
file, so a unit file on disk means its blocks were complete when it was written.

Writes are atomic: a temporary file with a unique name in the same folder, fsync, rename. A
reader never sees a half-written file (SIGKILL mid-write leaves only a ``*.tmp.*`` file, swept
at the next start), and two replicas sharing the folder write identical bytes under one name
(content addressing), so the last rename wins harmlessly. One replica evicting what another
still lists makes the other's read a miss, nothing worse.

The folder is bounded by ``budget_bytes``: past it, the units of least value are removed (as the
host tier: tokens a hit spares x uses, aging; units found at start count one use, the least
recently touched first), then blocks no remaining unit lists. An I/O
error while writing (a full disk, a folder gone read-only) is logged and counted and turns the
tier off for the rest of the process: a degradation, never a crash. ``open`` checks at start
that the folder is usable and raises ``DiskStoreError`` with the reason if it is not.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tt_serve.cache.hashing import DIGEST_SIZE, BlockHash
from tt_serve.cache.host_tier import UnitData
from tt_serve.cache.snapshot_pool import SnapshotKey

log = logging.getLogger(__name__)

_UNIT_MAGIC = b"TTSUNIT1"
_BLOCK_MAGIC = b"TTSBLK01"
_SUM = 32  # blake2b-256 checksum at the end of every file
_TMP_SWEEP_S = 600.0  # a temporary file this old is a dead writer's (another may be writing)
_BLOCK_GRACE_S = 60.0  # an unlisted block this young may belong to a unit being written


class DiskStoreError(RuntimeError):
    """The cache directory cannot be used (the message says why)."""


def _checksum(*parts: bytes | memoryview) -> bytes:
    """The checksum of the parts' concatenation (fed one by one: nothing is joined)."""
    h = hashlib.blake2b(digest_size=_SUM)
    for part in parts:
        h.update(part)
    return h.digest()


class DiskStore:
    """Units as checksummed files (module docstring). Thread-safe: the engine thread reads, the
    write-back thread writes; the lock guards the in-memory index only, never file I/O."""

    def __init__(self, root: Path, fingerprint: bytes, budget_bytes: int) -> None:
        self._fp = fingerprint
        self._dir = root / fingerprint.hex()
        self._units_dir = self._dir / "units"
        self._blocks_dir = self._dir / "blocks"
        self._budget = budget_bytes
        self._lock = threading.Lock()
        self._units: dict[SnapshotKey, tuple[BlockHash, ...]] = {}
        self._blocks: set[BlockHash] = set()
        self._uses: dict[SnapshotKey, tuple[float, int]] = {}  # key -> (value, uses)
        self._inflation = 0.0  # L: the value of the last unit evicted
        self._bytes = 0
        self.enabled = True
        self.errors = 0  # I/O errors (writes, reads, removals)
        self.corrupt = 0  # files that failed a check on read and were removed
        self.evictions = 0
        self.writes = 0
        self.bytes_written = 0  # unit and block files this process wrote
        self._block_file = 0  # the size of a block file seen (they are all one size)

    @classmethod
    def open(cls, root: str | Path, fingerprint: bytes, budget_bytes: int) -> DiskStore:
        """Create or reopen the store; DiskStoreError if the folder is unusable."""
        if budget_bytes <= 0:
            raise DiskStoreError(f"the disk cache needs a positive size, got {budget_bytes} bytes")
        store = cls(Path(root), fingerprint, budget_bytes)
        try:
            store._units_dir.mkdir(parents=True, exist_ok=True)
            store._blocks_dir.mkdir(parents=True, exist_ok=True)
            probe = store._dir / f".probe.{os.getpid()}.{secrets.token_hex(4)}"
            store._atomic_write(probe, b"ok")
            probe.unlink()
        except OSError as exc:
            raise DiskStoreError(f"disk cache directory {root} is not writable: {exc}") from exc
        store._scan()
        return store

    # -- index -------------------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._bytes

    @property
    def budget_bytes(self) -> int:
        return self._budget

    @property
    def num_units(self) -> int:
        return len(self._units)

    def _unit_path(self, key: SnapshotKey) -> Path:
        return self._units_dir / f"{key[0].hex()}-{key[1]}.unit"

    def _block_path(self, h: BlockHash) -> Path:
        return self._blocks_dir / f"{h.hex()}.blk"

    def _scan(self) -> None:
        """Index what a previous run (or another replica) left; sweep dead temporary files."""
        now = time.time()
        for folder in (self._units_dir, self._blocks_dir):
            for p in folder.iterdir():
                try:
                    st = p.stat()
                    if ".tmp." in p.name:
                        if now - st.st_mtime > _TMP_SWEEP_S:
                            p.unlink(missing_ok=True)
                        continue
                    if p.suffix == ".blk":
                        self._blocks.add(bytes.fromhex(p.stem))
                        self._block_file = st.st_size
                    elif p.suffix == ".unit":
                        hashes = self._read_unit_hashes(p)
                        if hashes is None:
                            continue
                        h, b = p.stem.split("-")
                        self._units[(bytes.fromhex(h), int(b))] = hashes
                    self._bytes += st.st_size
                except (OSError, ValueError):
                    self.errors += 1

    def _read_unit_hashes(self, path: Path) -> tuple[BlockHash, ...] | None:
        """The block list of a unit file, from its header only (the checksum is checked on
        restore); None when the header is not ours."""
        with path.open("rb") as f:
            size = len(_UNIT_MAGIC) + len(self._fp) + DIGEST_SIZE + 12
            head = f.read(size)
            if len(head) < size or not head.startswith(_UNIT_MAGIC + self._fp):
                return None
            (n,) = struct.unpack_from("<I", head, len(head) - 4)
            raw = f.read(n * DIGEST_SIZE)
        if len(raw) != n * DIGEST_SIZE:
            return None
        return tuple(raw[i : i + DIGEST_SIZE] for i in range(0, len(raw), DIGEST_SIZE))

    def contains(self, key: SnapshotKey) -> bool:
        """Whether a unit file for ``key`` is listed, or exists (another replica's)."""
        if not self.enabled:
            return False
        with self._lock:
            if key in self._units:
                return True
        return self._unit_path(key).exists()

    def unit_nbytes(self, key: SnapshotKey, num_blocks: int) -> int:
        """About the bytes a read of ``key`` returns (its unit file and ``num_blocks`` block
        files; one stat): what the reader bounds its memory by."""
        try:
            unit = self._unit_path(key).stat().st_size
        except OSError:
            unit = 0
        return unit + num_blocks * self._block_file

    def has_block(self, h: BlockHash) -> bool:
        with self._lock:
            return h in self._blocks

    # -- read --------------------------------------------------------------------------------

    def read(self, key: SnapshotKey, pause: Callable[[int], None] | None = None) -> UnitData | None:
        """The unit at ``key`` with every block, all checks passed; else None (a bad file is
        removed). ``pause(nbytes)`` is called after each block file (the reader yields
        there)."""
        if not self.enabled:
            return None
        path = self._unit_path(key)
        got = self._read_checked(path, _UNIT_MAGIC)
        if got is None:
            return None
        body = got[1]
        try:
            h, b, n = struct.unpack_from(f"<{DIGEST_SIZE}sQI", body)
            off = DIGEST_SIZE + 12
            hashes = tuple(
                body[off + i * DIGEST_SIZE : off + (i + 1) * DIGEST_SIZE] for i in range(n)
            )
            off += n * DIGEST_SIZE
            (snap_len,) = struct.unpack_from("<Q", body, off)
            snapshot = body[off + 8 : off + 8 + snap_len]
            if (h, b) != key or off + 8 + snap_len != len(body):
                raise ValueError("unit header does not match its name")
        except (struct.error, ValueError):
            self._bad(path)
            return None
        blocks = []
        for bh in hashes:
            data = self._read_block(bh)
            if data is None:
                self._forget_unit(key, path)  # its KV is gone: the unit can never be restored
                return None
            blocks.append(data)
            if pause is not None:
                pause(len(data))
        with self._lock:
            self._units[key] = hashes
        self._touch(path)
        self._used(key)
        return UnitData(snapshot, tuple(blocks))

    def _read_block(self, h: BlockHash) -> bytes | None:
        path = self._block_path(h)
        got = self._read_checked(path, _BLOCK_MAGIC, DIGEST_SIZE)
        if got is None:
            return None
        if got[0] != h:
            self._bad(path)
            return None
        return got[1]

    def _read_checked(self, path: Path, magic: bytes, lead: int = 0) -> tuple[bytes, bytes] | None:
        """The body of a file (between magic + fingerprint and checksum) if every check passes,
        as its first ``lead`` bytes and the rest. Each part is read straight into its own
        bytes and checksummed in place: no copy of the payload after the read (a 128k-token
        unit is ~130 MB of block files)."""
        head = len(magic) + len(self._fp)
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < head + lead + _SUM:
                    parts = None
                else:
                    parts = (f.read(head), f.read(lead), f.read(size - head - lead - _SUM))
                    tail = f.read(_SUM)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("disk cache: reading %s failed: %r", path, exc)
            self.errors += 1
            return None
        if parts is None or parts[0] != magic + self._fp or _checksum(*parts) != tail:
            self._bad(path)
            return None
        return parts[1], parts[2]

    def _bad(self, path: Path) -> None:
        log.warning("disk cache: %s failed its checks (torn or corrupted): removed", path)
        self.corrupt += 1
        self._remove(path)

    def _remove(self, path: Path) -> None:
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        except OSError:
            self.errors += 1
            return
        with self._lock:
            self._bytes -= size
            if path.suffix == ".blk":
                self._blocks.discard(bytes.fromhex(path.stem))

    def _forget_unit(self, key: SnapshotKey, path: Path) -> None:
        with self._lock:
            self._units.pop(key, None)
        self._remove(path)

    def _touch(self, path: Path) -> None:
        # Another replica may have evicted it meanwhile: only its recency is lost.
        with contextlib.suppress(OSError):
            os.utime(path)

    # -- write (the write-back thread) -------------------------------------------------------

    def write(self, key: SnapshotKey, hashes: tuple[BlockHash, ...], data: UnitData) -> bool:
        """Write the unit's missing blocks, then the unit file; evict past the budget. False
        (and the tier off) on an I/O error."""
        if not self.enabled:
            return False
        try:
            for h, blk in zip(hashes, data.blocks, strict=True):
                if not self.has_block(h):
                    if not blk:  # listed when queued, evicted since: the unit cannot go
                        return False
                    self._write_file(self._block_path(h), _BLOCK_MAGIC, h, blk)
                    with self._lock:
                        self._blocks.add(h)
            body = (
                struct.pack(f"<{DIGEST_SIZE}sQI", key[0], key[1], len(hashes))
                + b"".join(hashes)
                + struct.pack("<Q", len(data.snapshot))
                + data.snapshot
            )
            self._write_file(self._unit_path(key), _UNIT_MAGIC, body)
            with self._lock:
                self._units[key] = hashes
            self._used(key)
            self.writes += 1
            self._evict()
        except OSError as exc:
            self.errors += 1
            self.enabled = False
            log.error("disk cache: write failed (%r): the disk tier is off from now on", exc)
            return False
        return True

    def _write_file(self, path: Path, magic: bytes, *body: bytes) -> None:
        """``magic | fingerprint | body... | checksum``, the parts written one after another
        (the payload is never joined into a copy)."""
        parts = (magic + self._fp, *body)
        self._atomic_write(path, *parts, _checksum(*parts))
        size = sum(len(x) for x in parts) + _SUM
        with self._lock:
            self._bytes += size
            self.bytes_written += size
            if magic == _BLOCK_MAGIC:
                self._block_file = size

    def _atomic_write(self, path: Path, *parts: bytes) -> None:
        tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{secrets.token_hex(6)}")
        try:
            with tmp.open("wb") as f:
                for part in parts:
                    f.write(part)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _used(self, key: SnapshotKey) -> None:
        """A write or a restore of ``key``: its value (as the host tier's) rises."""
        with self._lock:
            uses = self._uses.get(key, (0.0, 0))[1] + 1
            self._uses[key] = (self._inflation + key[1] * uses, uses)

    def _evict(self) -> None:
        """Past the budget: drop the units of least value (``L + b x uses``, as the host tier;
        units a previous run or another replica wrote count one use at this run's start, the
        least recently touched first), then the blocks no unit lists."""
        if self._bytes <= self._budget:
            return
        with self._lock:
            units = list(self._units)
        ranked = []
        for key in units:
            try:
                mtime = self._unit_path(key).stat().st_mtime
            except FileNotFoundError:
                with self._lock:
                    self._units.pop(key, None)
                continue
            value = self._uses.get(key, (float(key[1]), 0))[0]
            ranked.append((value, mtime, key))
        ranked.sort()
        for value, _, key in ranked:
            if self._bytes <= self._budget:
                break
            self._forget_unit(key, self._unit_path(key))
            with self._lock:
                self._uses.pop(key, None)
                self._inflation = max(self._inflation, value)
            self.evictions += 1
            self._sweep_blocks()

    def _sweep_blocks(self) -> None:
        with self._lock:
            listed = {h for hashes in self._units.values() for h in hashes}
            orphans = self._blocks - listed
        now = time.time()
        for h in orphans:
            path = self._block_path(h)
            try:
                if now - path.stat().st_mtime < _BLOCK_GRACE_S and self._bytes <= self._budget:
                    continue
            except FileNotFoundError:
                with self._lock:
                    self._blocks.discard(h)
                continue
            self._remove(path)
