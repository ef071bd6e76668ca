"""The GDN snapshot directory: M slots keyed by (hash at b, b).

A slot holds a copy of every GDN layer's state after the first ``b`` tokens of some prefix. The
device memory belongs to the backend; this class only decides which slot holds which key.

* Two-phase writes: ``reserve`` a slot for a key, the engine copies the state into it, then
  ``publish`` (now visible to lookups) or ``abort`` (slot back to free, nothing visible).
* ``pin``/``unpin`` around a restore in flight: a pinned entry is never evicted.
* LRU over published, unpinned entries: a reservation on a full pool evicts the least recently
  used one; if every slot is pinned or pending, the insert is skipped softly (counted).
* A duplicate key (published or pending) refreshes the LRU and asks for no copy.
* A snapshot never references a KV block: its KV may be reclaimed, which makes it a miss.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from tt_serve.cache.hashing import BlockHash

SnapshotKey = tuple[BlockHash, int]


class SnapshotPool:
    """Slot bookkeeping for GDN snapshots; see the module docstring."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        self._num_slots = num_slots
        self._key: list[SnapshotKey | None] = [None] * num_slots
        self._published = [False] * num_slots
        self._pins = [0] * num_slots
        self._by_key: dict[SnapshotKey, int] = {}
        self._free = list(range(num_slots - 1, -1, -1))
        # Published and unpinned slots, least recently used first.
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0
        self.skips = 0
        self.duplicates = 0
        self.publishes = 0
        self.aborts = 0

    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def num_used(self) -> int:
        """Slots holding a published or pending snapshot."""
        return self._num_slots - len(self._free)

    @property
    def num_published(self) -> int:
        return sum(self._published)

    def key_of(self, slot: int) -> SnapshotKey | None:
        return self._key[slot]

    def is_published(self, slot: int) -> bool:
        return self._published[slot]

    def pins(self, slot: int) -> int:
        return self._pins[slot]

    def lookup(self, key: SnapshotKey) -> int | None:
        """The published slot for ``key``, if any. No side effects."""
        slot = self._by_key.get(key)
        if slot is None or not self._published[slot]:
            return None
        return slot

    def contains(self, key: SnapshotKey) -> bool:
        """Whether ``key`` is published (cheap membership test for the matcher)."""
        slot = self._by_key.get(key)
        return slot is not None and self._published[slot]

    def published_keys(self) -> dict[SnapshotKey, int]:
        return {k: s for k, s in self._by_key.items() if self._published[s]}

    def reserve(self, key: SnapshotKey) -> int | None:
        """A slot to copy a new snapshot for ``key`` into, or None when no copy is wanted:
        the key is already present (LRU refreshed) or no slot can be had (skipped)."""
        slot = self._by_key.get(key)
        if slot is not None:
            if slot in self._lru:
                self._lru.move_to_end(slot)
            self.duplicates += 1
            return None
        if self._free:
            slot = self._free.pop()
        elif self._lru:
            slot, _ = self._lru.popitem(last=False)
            old = self._key[slot]
            assert old is not None
            del self._by_key[old]
            self._published[slot] = False
            self.evictions += 1
        else:
            self.skips += 1
            return None
        self._key[slot] = key
        self._by_key[key] = slot
        return slot

    def publish(self, slot: int) -> None:
        key = self._key[slot]
        if key is None or self._published[slot]:
            raise ValueError(f"snapshot slot {slot} is not reserved")
        self._published[slot] = True
        self._lru[slot] = None
        self.publishes += 1

    def abort(self, slot: int) -> None:
        key = self._key[slot]
        if key is None or self._published[slot]:
            raise ValueError(f"snapshot slot {slot} is not reserved")
        del self._by_key[key]
        self._key[slot] = None
        self._free.append(slot)
        self.aborts += 1

    def pin(self, slot: int) -> None:
        """Protect a published slot from eviction while a restore reads it; marks it used."""
        if not self._published[slot]:
            raise ValueError(f"snapshot slot {slot} is not published")
        if self._pins[slot] == 0:
            del self._lru[slot]
        self._pins[slot] += 1

    def unpin(self, slot: int) -> None:
        if self._pins[slot] <= 0:
            raise ValueError(f"snapshot slot {slot} is not pinned")
        self._pins[slot] -= 1
        if self._pins[slot] == 0:
            self._lru[slot] = None  # most recently used: it was just restored

    def check_invariants(self, pins: Counter[int] | None = None) -> None:
        """Raise AssertionError if inconsistent; ``pins`` (slot -> restores in flight), when
        given, must equal the pin counts exactly."""
        free = set(self._free)
        assert len(free) == len(self._free), "a slot is on the free list twice"
        for s in range(self._num_slots):
            key = self._key[s]
            if s in free:
                assert key is None and not self._published[s] and self._pins[s] == 0, (
                    f"free slot {s} holds state"
                )
                continue
            assert key is not None, f"used slot {s} has no key"
            assert isinstance(key[0], bytes) and isinstance(key[1], int), f"slot {s} key {key!r}"
            assert self._by_key.get(key) == s, f"slot {s} key map out of sync"
            assert self._pins[s] >= 0, f"slot {s} negative pins"
            if not self._published[s]:
                assert self._pins[s] == 0, f"pending slot {s} is pinned"
            in_lru = s in self._lru
            assert in_lru == (self._published[s] and self._pins[s] == 0), f"slot {s} LRU state"
        assert len(self._by_key) == self._num_slots - len(free), "key map size"
        assert self.num_published == self.publishes - self.evictions, "publish/evict counts"
        if pins is not None:
            for s in range(self._num_slots):
                assert self._pins[s] == pins.get(s, 0), f"slot {s} pins != restores in flight"
