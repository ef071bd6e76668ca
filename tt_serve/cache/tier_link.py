"""The prefix cache's side of the tiers (``cache/tiers.py``): which units to read out of the
device when snapshots are published, and how a tier hit becomes device blocks and a snapshot.

* **Write-through.** A reserved save remembers its unit's blocks and hashes (the request may be
  released before the save is published); on publish, a unit no tier holds yet becomes a
  ``UnitRead`` of its snapshot slot and of the blocks no tier holds. The engine reads them in
  the step that published them, before the next admission can reuse a block or a slot.
* **Restore.** For the longest cut a tier holds (past the device's own hit, and not being saved
  on the device right now): blocks of [0, b) still registered on the device are shared, the
  rest are allocated and registered at once, the snapshot is reserved and published at once
  (or the device's own published copy is used), and a ``UnitWrite`` carries the bytes the
  engine writes before any step reads them. Validation (capacity, a snapshot slot) happens
  before any change, like every admission.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from tt_serve.cache.block_pool import BlockPool
from tt_serve.cache.hashing import BlockHash
from tt_serve.cache.results import UnitRead, UnitWrite
from tt_serve.cache.snapshot_pool import SnapshotKey, SnapshotPool
from tt_serve.cache.tiers import Reading, Tiers


@dataclass(frozen=True)
class Restored:
    """A tier hit made a device hit: the request's table and its pinned snapshot slot."""

    b: int
    table: tuple[int, ...]
    snapshot_slot: int
    write: UnitWrite


class Later:
    """The pool cannot take the request now (it could not without the tier hit either)."""


LATER = Later()


class TierLink:
    """Units between a prefix cache's pools and its tiers (module docstring)."""

    def __init__(
        self, tiers: Tiers, blocks: BlockPool, snapshots: SnapshotPool, block_size: int
    ) -> None:
        self.tiers = tiers
        self._bs = block_size
        self._blocks = blocks
        self._snapshots = snapshots
        # Reserved snapshot slot -> the blocks and hashes of its unit, and whether the
        # write-back policy sends it to disk.
        self._unit_of: dict[int, tuple[tuple[int, ...], tuple[BlockHash, ...], bool]] = {}
        self._reads: list[UnitRead] = []

    # -- write-through -----------------------------------------------------------------------

    def reserved(
        self, slot: int, blocks: tuple[int, ...], hashes: tuple[BlockHash, ...], to_disk: bool
    ) -> None:
        self._unit_of[slot] = (blocks, hashes, to_disk)

    def aborted(self, slot: int) -> None:
        self._unit_of.pop(slot, None)

    def published(self, slot: int, b: int) -> None:
        blocks, hashes, to_disk = self._unit_of.pop(slot)
        if self.tiers.holds((hashes[-1], b)) or not self.tiers.takes(to_disk):
            return
        # The whole unit; ``narrow`` picks the blocks to read just before the read, since
        # storing an earlier unit of the same step may evict blocks this one shares.
        self._reads.append(
            UnitRead(
                b=b,
                hashes=hashes,
                snapshot_slot=slot,
                blocks=blocks,
                block_hashes=hashes,
                to_disk=to_disk,
            )
        )

    def narrow(self, read: UnitRead) -> UnitRead | None:
        """``read`` cut to the blocks no tier holds now (None: a tier holds the unit)."""
        if self.tiers.holds((read.hashes[-1], read.b)):
            return None
        idx = self.tiers.missing(read.hashes)
        return replace(
            read,
            blocks=tuple(read.blocks[i] for i in idx),
            block_hashes=tuple(read.hashes[i] for i in idx),
        )

    def take_reads(self) -> list[UnitRead]:
        reads, self._reads = self._reads, []
        return reads

    def store(
        self, read: UnitRead, snapshot: bytes, blocks: list[bytes] | tuple[bytes, ...]
    ) -> None:
        if len(blocks) != len(read.blocks):
            raise ValueError(f"unit at b={read.b}: {len(blocks)} blocks for {len(read.blocks)}")
        new = dict(zip(read.block_hashes, blocks, strict=True))
        key = (read.hashes[-1], read.b)
        self.tiers.store(key, read.hashes, snapshot, new, to_disk=read.to_disk)

    # -- restore -----------------------------------------------------------------------------

    def restore(
        self, hashes: list[BlockHash], keys: list[SnapshotKey], pages: int
    ) -> Restored | Later | Reading | None:
        """Admit ``pages`` blocks with a hit at the longest of ``keys`` (ascending cuts, all
        past the device's hit; ``hashes`` cover them) a tier holds; None when there is none,
        or no snapshot slot for it (the device hit applies); ``READING`` while the longest is
        read from disk (nothing changed: the request asks again)."""
        for key in self.tiers.candidates(keys):
            slot = self._snapshots.lookup(key)
            if slot is None and self._snapshots.slot_for(key) is not None:
                continue  # being computed and saved right now: the device will have it
            b = key[1]
            n = b // self._bs
            on_device = [self._blocks.lookup(h) for h in hashes[:n]]
            shared = [blk for blk in on_device if blk is not None]
            inactive = sum(1 for blk in shared if self._blocks.refcount(blk) == 0)
            if pages - len(shared) > self._blocks.num_allocatable - inactive:
                return LATER
            start = time.perf_counter()
            got = self.tiers.fetch(key, tuple(hashes[:n]))
            if isinstance(got, Reading):
                return got
            if got is None:
                continue  # a bad disk file (removed): try a shorter cut
            data, tier = got
            fetched = time.perf_counter() - start
            snapshot: bytes | None = None
            if slot is None:
                slot = self._snapshots.reserve(key)
                if slot is None:
                    return None  # every snapshot slot pinned or pending
                self._snapshots.publish(slot)
                snapshot = data.snapshot
            # Validated: from here on nothing can fail. Acquire before allocating, so that the
            # allocation cannot reclaim a block of the hit.
            for blk in shared:
                self._blocks.acquire(blk)
            fresh = iter(self._blocks.allocate(pages - len(shared)))
            table: list[int] = []
            written: list[int] = []
            for i, dev in enumerate(on_device):
                blk = next(fresh) if dev is None else dev
                if dev is None:
                    self._blocks.register(blk, hashes[i])
                    written.append(i)
                table.append(blk)
            table.extend(fresh)
            self._snapshots.pin(slot)
            write = UnitWrite(
                blocks=tuple(table[i] for i in written),
                block_data=tuple(data.blocks[i] for i in written),
                snapshot_slot=slot,
                snapshot=snapshot,
                tokens=b,
                tier=tier,
                fetch_seconds=fetched,
            )
            return Restored(b, tuple(table), slot, write)
        return None

    def check_invariants(self, pending: set[int]) -> None:
        """``pending``: the snapshot slots of saves not yet published or aborted."""
        assert self._unit_of.keys() == pending, "units of pending saves"
        if self.tiers.host is not None:
            self.tiers.host.check_invariants()
