"""The host tier: resume-point units in host memory, one byte budget, evicted by value.

A **unit** is everything a hit at a resume point b needs: the GDN snapshot at (h(b), b) and the
KV of every block of [0, b), keyed by the block hashes of the device pool (``hashing.py``). The
tier stores a unit whole or not at all, and drops it whole:

* a block's bytes are shared by every unit whose prefix holds it (a conversation's units at
  successive turns share their head) and are kept exactly while some unit references them, so
  no KV is ever held without a snapshot it can resume from, and no snapshot without its KV
  (the dead host memory a by-device-bytes split of KV and state leaves behind);
* one budget in bytes (snapshots + distinct blocks), never exceeded once ``put`` returns;
* eviction by value, as the device ``SnapshotPool``: ``L + b * uses`` (tokens a hit spares
  times how often the unit was stored or restored), L the value of the last unit evicted, so
  an idle unit ages out whatever its depth. Evicting a unit frees the blocks no other unit
  shares.

Payloads are opaque ``bytes`` (the backend's encoding of its tensors); this class never looks
inside them. Single-threaded: ``Tiers`` calls it from the engine thread only.
"""

from __future__ import annotations

from dataclasses import dataclass

from tt_serve.cache.hashing import BlockHash
from tt_serve.cache.snapshot_pool import SnapshotKey


@dataclass(frozen=True)
class UnitData:
    """A unit's payload: the snapshot and the KV of blocks [0, b), in block order."""

    snapshot: bytes
    blocks: tuple[bytes, ...]

    @property
    def nbytes(self) -> int:
        return len(self.snapshot) + sum(len(b) for b in self.blocks)


@dataclass
class _Unit:
    hashes: tuple[BlockHash, ...]
    snapshot: bytes
    uses: int
    value: float
    clock: int


class HostTier:
    """Units in host memory under ``budget_bytes`` (module docstring)."""

    def __init__(self, budget_bytes: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._bs = block_size
        if budget_bytes < 0:
            raise ValueError(f"the host tier budget must be >= 0 bytes, got {budget_bytes}")
        self._budget = budget_bytes
        self._units: dict[SnapshotKey, _Unit] = {}
        self._blocks: dict[BlockHash, bytes] = {}
        self._refs: dict[BlockHash, int] = {}
        self._used = 0
        self._inflation = 0.0
        self._clock = 0
        self.evictions = 0
        self.rejected = 0  # units larger than the whole budget

    @property
    def budget_bytes(self) -> int:
        return self._budget

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def num_units(self) -> int:
        return len(self._units)

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    def contains(self, key: SnapshotKey) -> bool:
        return key in self._units

    def has_block(self, block_hash: BlockHash) -> bool:
        return block_hash in self._blocks

    def block(self, block_hash: BlockHash) -> bytes | None:
        return self._blocks.get(block_hash)

    def unit_keys(self) -> list[SnapshotKey]:
        return list(self._units)

    def get(self, key: SnapshotKey) -> UnitData | None:
        """The unit's payload (a use: its value rises), or None."""
        unit = self._units.get(key)
        if unit is None:
            return None
        unit.uses += 1
        self._revalue(key, unit)
        return UnitData(unit.snapshot, tuple(self._blocks[h] for h in unit.hashes))

    def put(
        self,
        key: SnapshotKey,
        hashes: tuple[BlockHash, ...],
        snapshot: bytes,
        new: dict[BlockHash, bytes],
    ) -> bool:
        """Store the unit at ``key`` (b = key[1]; ``hashes`` are blocks [0, b)). ``new`` holds
        the bytes of every block the tier lacks (more is fine). Evicts units of least value
        until the budget holds; False (nothing stored) when the unit alone exceeds it."""
        if key[1] <= 0 or key[1] % self._bs or len(hashes) != key[1] // self._bs:
            raise ValueError(
                f"unit at b={key[1]} with {len(hashes)} blocks: b must be a positive multiple "
                f"of the block size {self._bs} and the unit hold its b / {self._bs} blocks"
            )
        if key in self._units:
            unit = self._units[key]
            unit.uses += 1
            self._revalue(key, unit)
            return True
        missing = [h for h in set(hashes) if h not in self._blocks and h not in new]
        if missing:
            raise ValueError(f"unit at b={key[1]}: {len(missing)} block(s) have no bytes")
        # The unit's whole size, shared blocks included: evicting every other unit frees
        # at most the rest, so a unit larger than the budget can never stay.
        size = len(snapshot) + sum(len(self._blocks.get(h) or new[h]) for h in set(hashes))
        if size > self._budget:
            self.rejected += 1
            return False
        for h in hashes:
            if h not in self._blocks:
                self._blocks[h] = new[h]
                self._refs[h] = 0
                self._used += len(new[h])
            self._refs[h] += 1
        self._used += len(snapshot)
        unit = _Unit(hashes, snapshot, uses=1, value=0.0, clock=0)
        self._units[key] = unit
        self._revalue(key, unit)
        while self._used > self._budget:
            victim = min((k for k in self._units if k != key), key=self._rank)
            self.drop(victim)
        return True

    def _rank(self, key: SnapshotKey) -> tuple[float, int]:
        unit = self._units[key]
        return (unit.value, unit.clock)

    def _revalue(self, key: SnapshotKey, unit: _Unit) -> None:
        self._clock += 1
        unit.value = self._inflation + key[1] * unit.uses
        unit.clock = self._clock

    def drop(self, key: SnapshotKey) -> bool:
        """Drop the unit at ``key`` and the blocks only it held. False if absent."""
        unit = self._units.pop(key, None)
        if unit is None:
            return False
        # L rises to the value of what left, so what stays idle ages.
        self._inflation = max(self._inflation, unit.value)
        self._used -= len(unit.snapshot)
        for h in unit.hashes:
            self._refs[h] -= 1
            if self._refs[h] == 0:
                del self._refs[h]
                self._used -= len(self._blocks.pop(h))
        self.evictions += 1
        return True

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant."""
        refs: dict[BlockHash, int] = {}
        total = 0
        for key, unit in self._units.items():
            assert len(unit.hashes) == key[1] // self._bs, f"unit {key[1]}: block count"
            total += len(unit.snapshot)
            for h in unit.hashes:
                assert h in self._blocks, f"unit {key[1]} lost a block: KV dropped under a snapshot"
                refs[h] = refs.get(h, 0) + 1
        assert refs == self._refs, "block references out of sync"
        assert set(self._blocks) == set(refs), "a block no unit references: dead KV"
        total += sum(len(b) for b in self._blocks.values())
        assert total == self._used, f"used bytes {self._used} != held {total}"
        assert self._used <= self._budget, f"host tier over budget: {self._used} > {self._budget}"
