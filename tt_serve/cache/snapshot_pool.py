"""The GDN snapshot directory: M slots keyed by (hash at b, b).

A slot holds a copy of every GDN layer's state after the first ``b`` tokens of some prefix. The
device memory belongs to the backend; this class only decides which slot holds which key.

* Two-phase writes: ``reserve`` a slot for a key, the engine copies the state into it, then
  ``publish`` (now visible to lookups) or ``abort`` (slot back to free, nothing visible).
* ``pin``/``unpin`` around a restore in flight: a pinned entry is never evicted.
* Eviction by value over published, unpinned entries (GreedyDual-Size-Frequency): an entry's
  value is ``L + b * uses`` where b is its depth (prompt tokens a hit there spares), ``uses``
  counts its publish and every restore or duplicate offer since, and L is the value of the
  last entry evicted (so what was not used for a while ages out whatever its depth). A
  reservation on a full pool evicts the entry of least value; if every slot is pinned or
  pending, the insert is skipped softly (counted). Plain LRU (``policy="lru"``) is the A/B
  control: it lets a burst of shallow states push out a deep, often resumed one (SGLang's
  users lost most branch hits that way).
* Redundant first: a snapshot published with a ``parent`` (the deepest snapshot below it on
  the publishing request's path) makes that parent an interior node; one with exactly one
  child is *redundant* (every conversation that went through it went on to the deeper one,
  which a resumed turn now hits instead) and goes before any other, whatever its value, and
  without raising L. Without this an agent's shallow state, restored turn after turn while its
  fresher deeper ones were evicted, kept gaining value from those very restores and pushed out
  the state its next turn needed. A branch point (two children or more: a head several
  conversations share) and a leaf keep their value. A dropped entry's children hang from its
  parent.
* A duplicate key (published or pending) counts as a use and asks for no copy.
* ``evict`` drops one chosen entry (the prefix cache's per-conversation cap).
* A snapshot never references a KV block: its KV may be reclaimed, which makes it a miss.
"""

from __future__ import annotations

from collections import Counter

from tt_serve.cache.hashing import BlockHash

SnapshotKey = tuple[BlockHash, int]
EVICTION_POLICIES = ("value", "lru")


class SnapshotPool:
    """Slot bookkeeping for GDN snapshots; see the module docstring."""

    def __init__(self, num_slots: int, policy: str = "value") -> None:
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"policy must be one of {EVICTION_POLICIES}, got {policy!r}")
        self._num_slots = num_slots
        self._lru_policy = policy == "lru"
        self._key: list[SnapshotKey | None] = [None] * num_slots
        self._published = [False] * num_slots
        self._pins = [0] * num_slots
        self._by_key: dict[SnapshotKey, int] = {}
        self._free = list(range(num_slots - 1, -1, -1))
        # Published and unpinned slots -> (value, last use): the victim is the least.
        self._evictable: dict[int, tuple[float, int]] = {}
        self._uses = [0] * num_slots
        self._inflation = 0.0  # L: the value of the last entry evicted for room
        # The snapshot tree among published entries: parent slot, child slots.
        self._parent: list[int | None] = [None] * num_slots
        self._children: list[set[int]] = [set() for _ in range(num_slots)]
        self._clock = 0
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

    def slot_for(self, key: SnapshotKey) -> int | None:
        """The slot holding ``key``, published or pending, if any. No side effects."""
        return self._by_key.get(key)

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
            self._used(slot)
            self.duplicates += 1
            return None
        if self._free:
            slot = self._free.pop()
        elif self._evictable:
            slot = min(self._evictable, key=self.rank)
            kept_over_redundant, value, _ = self.rank(slot)
            self._drop(slot)
            if kept_over_redundant and not self._lru_policy:
                # L rises to the least value: what stays idle ages.
                self._inflation = max(self._inflation, value)
        else:
            self.skips += 1
            return None
        self._key[slot] = key
        self._by_key[key] = slot
        self._uses[slot] = 0
        return slot

    def rank(self, slot: int) -> tuple[bool, float, int]:
        """An evictable slot's eviction rank, the least evicted first: (not redundant, value,
        last use). Under ``policy="lru"`` the last use alone."""
        value, last = self._evictable[slot]
        if self._lru_policy:
            return (True, value, last)
        return (not self.is_redundant(slot), value, last)

    def is_redundant(self, slot: int) -> bool:
        """Whether the entry has exactly one child: a deeper snapshot every path through it
        went on to (see the module docstring)."""
        return len(self._children[slot]) == 1

    def is_evictable(self, slot: int) -> bool:
        return slot in self._evictable

    def evict(self, slot: int) -> None:
        """Drop a published, unpinned entry now; its slot returns to the free list."""
        if slot not in self._evictable:
            raise ValueError(f"snapshot slot {slot} is not evictable (free, pending or pinned)")
        self._drop(slot)
        self._free.append(slot)

    def _drop(self, slot: int) -> None:
        """Forget an evictable slot's entry (the caller frees or reuses the slot); its
        children hang from its parent."""
        del self._evictable[slot]
        parent = self._parent[slot]
        if parent is not None:
            self._children[parent].discard(slot)
            self._children[parent] |= self._children[slot]
        for child in self._children[slot]:
            self._parent[child] = parent
        self._parent[slot] = None
        self._children[slot] = set()
        old = self._key[slot]
        assert old is not None
        del self._by_key[old]
        self._key[slot] = None
        self._published[slot] = False
        self.evictions += 1

    def _used(self, slot: int) -> None:
        """Count a use (publish, restore, duplicate offer) and, if evictable, re-value it."""
        self._uses[slot] += 1
        if slot in self._evictable:
            self._evictable[slot] = self._valued(slot)

    def _valued(self, slot: int) -> tuple[float, int]:
        self._clock += 1
        if self._lru_policy:
            return (float(self._clock), self._clock)
        key = self._key[slot]
        assert key is not None
        return (self._inflation + key[1] * max(self._uses[slot], 1), self._clock)

    def publish(self, slot: int, parent: SnapshotKey | None = None) -> None:
        """Make a reserved slot visible. ``parent``: the key of the snapshot below it on the
        path it was computed on, if any (the entry it makes interior; ignored when that key is
        not published)."""
        key = self._key[slot]
        if key is None or self._published[slot]:
            raise ValueError(f"snapshot slot {slot} is not reserved")
        if parent is not None and parent[1] >= key[1]:
            raise ValueError(f"parent depth {parent[1]} is not below {key[1]}")
        above = None if parent is None else self.lookup(parent)
        if above is not None:
            self._parent[slot] = above
            self._children[above].add(slot)
        self._published[slot] = True
        self._uses[slot] += 1
        self._evictable[slot] = self._valued(slot)
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
            del self._evictable[slot]
        self._pins[slot] += 1
        self._uses[slot] += 1

    def unpin(self, slot: int) -> None:
        if self._pins[slot] <= 0:
            raise ValueError(f"snapshot slot {slot} is not pinned")
        self._pins[slot] -= 1
        if self._pins[slot] == 0:
            self._evictable[slot] = self._valued(slot)  # valued now: it was just restored

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
                assert self._parent[s] is None and not self._children[s], f"free slot {s} linked"
                continue
            assert key is not None, f"used slot {s} has no key"
            assert isinstance(key[0], bytes) and isinstance(key[1], int), f"slot {s} key {key!r}"
            assert self._by_key.get(key) == s, f"slot {s} key map out of sync"
            assert self._pins[s] >= 0, f"slot {s} negative pins"
            if not self._published[s]:
                assert self._pins[s] == 0, f"pending slot {s} is pinned"
            evictable = s in self._evictable
            assert evictable == (self._published[s] and self._pins[s] == 0), (
                f"slot {s} eviction state"
            )
            parent = self._parent[s]
            if parent is not None:
                assert self._published[s] and self._published[parent], f"slot {s} tree link"
                assert s in self._children[parent], f"slot {s} not its parent's child"
            for child in self._children[s]:
                assert self._parent[child] == s, f"slot {s} child {child} parent link"
        assert len(self._by_key) == self._num_slots - len(free), "key map size"
        assert self.num_published == self.publishes - self.evictions, "publish/evict counts"
        if pins is not None:
            for s in range(self._num_slots):
                assert self._pins[s] == pins.get(s, 0), f"slot {s} pins != restores in flight"
