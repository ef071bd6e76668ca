"""What the prefix cache hands the scheduler: admission answers, snapshot saves, stats.

Plain frozen values (ints and tuples only), so they cross into the engine without exposing any
cache state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Admission(enum.Enum):
    NOW = "now"
    LATER = "later"
    NEVER = "never"
    READING = "reading"  # its hit is being read from disk: ask again after a step


@dataclass(frozen=True)
class AdmitResult:
    """The outcome of :meth:`PrefixCache.admit`.

    ``block_table`` has ceil(lifetime_tokens / block_size) blocks, the first
    ``cached_tokens / block_size`` being the shared hit blocks. ``restore_snapshot`` is the
    snapshot slot to copy into the request's GDN state slot before its first compute; it stays
    pinned until :meth:`PrefixCache.restore_done`.
    """

    admission: Admission
    cached_tokens: int = 0
    block_table: tuple[int, ...] = ()
    restore_snapshot: int | None = None
    reason: str = ""
    unit_write: UnitWrite | None = None  # a hit restored from a tier: its bytes to write first


@dataclass(frozen=True)
class SnapshotSave:
    """Copy the request's GDN state into ``snapshot_slot``, then publish (or abort) it.
    The state summarizes tokens [0, boundary)."""

    request_id: str
    snapshot_slot: int
    boundary: int


@dataclass(frozen=True)
class CacheStats:
    """Counters since construction. ``queries``/``hits`` count prompt tokens."""

    queries: int = 0
    hits: int = 0
    kv_evictions: int = 0
    kv_registrations: int = 0
    snapshot_evictions: int = 0
    snapshot_saves: int = 0
    snapshot_restores: int = 0
    snapshot_skips: int = 0
    snapshot_duplicates: int = 0
    # Admissions that resumed at a cut of each kind (``cache/resume.py``).
    resumes_message: int = 0
    resumes_prompt_end: int = 0
    resumes_chunk: int = 0
    snapshot_cap_evictions: int = 0  # evicted to keep one path within the per-conversation cap
    snapshots_per_conversation_peak: int = 0  # most snapshots one request's path has held

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True)
class UnitWrite:
    """A restore from a tier (``cache/tiers.py``): write ``block_data`` into the device blocks
    ``blocks`` and, unless ``snapshot`` is None (the device still had it), the snapshot bytes
    into ``snapshot_slot``, all before the step that first uses them. ``tier`` and
    ``fetch_seconds`` are for the metrics."""

    blocks: tuple[int, ...]
    block_data: tuple[bytes, ...]
    snapshot_slot: int
    snapshot: bytes | None
    tokens: int
    tier: str
    fetch_seconds: float

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.block_data) + len(self.snapshot or b"")


@dataclass(frozen=True)
class UnitRead:
    """A write-through to the tiers: read the snapshot slot ``snapshot_slot`` and the device
    blocks ``blocks`` (the unit's blocks no tier holds yet, hashes ``block_hashes``) now, then
    hand the bytes back (``PrefixCache.store_unit``). The unit is keyed ``(hashes[-1], b)``."""

    b: int
    hashes: tuple[bytes, ...]
    snapshot_slot: int
    blocks: tuple[int, ...]
    block_hashes: tuple[bytes, ...]
    to_disk: bool = True  # a cut the disk's write-back policy keeps (``cache/tiers.py``)
