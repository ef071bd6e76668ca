"""The paged KV block pool: free, active (refcounted) and inactive-registered blocks.

Every usable block (all but the reserved padding block 0) is in exactly one state:

* **free**: no owner, no content worth keeping;
* **active**: refcount > 0 (the number of requests whose block table holds it), registered or
  not;
* **inactive**: refcount 0 but registered under a content hash, kept in an LRU so a later
  request can reuse its KV; reclaimable by any allocation once the free list is empty.

A block is registered only by the coordinator, and only once all of its KV is written.
Reclaiming an inactive block drops its registration (a later lookup through it misses).
With caching disabled nothing is registered, so released blocks go straight back to free: a
true cold control for A/B runs.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

from tt_serve.cache.hashing import BlockHash

PAD_BLOCK = 0
"""The reserved padding block: never handed out; block tables are padded with it."""


class BlockPool:
    """N blocks with refcounts, a hash -> block map and an LRU of inactive blocks."""

    def __init__(self, num_blocks: int, *, enabled: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self._num_blocks = num_blocks
        self._enabled = enabled
        self._refcount = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._by_hash: dict[BlockHash, int] = {}
        # A stack popped from the end: low block ids are handed out first.
        self._free = list(range(num_blocks - 1, PAD_BLOCK, -1))
        # Oldest first; reclaimed from the front.
        self._inactive: OrderedDict[int, None] = OrderedDict()
        self._num_active = 0
        self.evictions = 0
        self.registrations = 0

    # -- sizes -------------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_usable(self) -> int:
        return self._num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_active(self) -> int:
        return self._num_active

    @property
    def num_inactive(self) -> int:
        return len(self._inactive)

    @property
    def num_allocatable(self) -> int:
        """Blocks an allocation can take right now: free plus reclaimable inactive."""
        return len(self._free) + len(self._inactive)

    # -- queries -----------------------------------------------------------------------------

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The block registered under ``block_hash`` (active or inactive), if any."""
        return self._by_hash.get(block_hash)

    def is_registered(self, block_hash: BlockHash) -> bool:
        return block_hash in self._by_hash

    def hash_of(self, block: int) -> BlockHash | None:
        return self._hash[block]

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def free_blocks(self) -> frozenset[int]:
        return frozenset(self._free)

    def inactive_blocks(self) -> tuple[int, ...]:
        """Inactive blocks, least recently used first."""
        return tuple(self._inactive)

    def registered(self) -> dict[BlockHash, int]:
        """A copy of the hash -> block map."""
        return dict(self._by_hash)

    # -- mutations ---------------------------------------------------------------------------

    def acquire(self, block: int) -> None:
        """Take one more reference on a registered block (reactivating it if inactive)."""
        if self._hash[block] is None:
            raise ValueError(f"block {block} is not registered; only cached blocks are shared")
        if self._refcount[block] == 0:
            del self._inactive[block]
            self._num_active += 1
        self._refcount[block] += 1

    def allocate(self, n: int) -> list[int]:
        """Hand out ``n`` fresh blocks (refcount 1): free ones first, then reclaim the least
        recently used inactive ones, dropping their registration."""
        if n > self.num_allocatable:
            raise ValueError(f"cannot allocate {n} blocks: only {self.num_allocatable} available")
        out: list[int] = []
        for _ in range(n):
            if self._free:
                block = self._free.pop()
            else:
                block, _ = self._inactive.popitem(last=False)
                h = self._hash[block]
                assert h is not None
                del self._by_hash[h]
                self._hash[block] = None
                self.evictions += 1
            self._refcount[block] = 1
            out.append(block)
        self._num_active += n
        return out

    def register(self, block: int, block_hash: BlockHash) -> bool:
        """Register an owned block whose KV is fully written. Returns False (and changes
        nothing) when caching is disabled, the block is already registered, or another block
        already holds this content."""
        if self._refcount[block] <= 0:
            raise ValueError(f"block {block} is not owned; only active blocks are registered")
        if not self._enabled or self._hash[block] is not None or block_hash in self._by_hash:
            return False
        self._hash[block] = block_hash
        self._by_hash[block_hash] = block
        self.registrations += 1
        return True

    def unregister(self, block: int) -> None:
        """Drop a block's registration (its content is not what its hash names: a restore
        into it failed). An inactive block becomes free; an owned one stays owned. Counted
        as an eviction."""
        h = self._hash[block]
        if h is None:
            return
        del self._by_hash[h]
        self._hash[block] = None
        self.evictions += 1
        if self._refcount[block] == 0:
            del self._inactive[block]
            self._free.append(block)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block. Blocks reaching refcount 0 become inactive if
        registered, free otherwise. The table's tail is released first so that, among one
        request's blocks, the deepest (least shareable) are reclaimed first."""
        for block in reversed(blocks):
            rc = self._refcount[block]
            if rc <= 0:
                raise ValueError(f"block {block} released more often than acquired")
            self._refcount[block] = rc - 1
            if rc == 1:
                self._num_active -= 1
                if self._hash[block] is not None:
                    self._inactive[block] = None
                else:
                    self._free.append(block)

    # -- checks ------------------------------------------------------------------------------

    def check_invariants(self, owners: Counter[int] | None = None) -> None:
        """Raise AssertionError if the pool is inconsistent. ``owners`` (block -> number of
        tables holding it), when given, must equal the refcounts exactly."""
        free = set(self._free)
        inactive = set(self._inactive)
        active = {b for b in range(1, self._num_blocks) if self._refcount[b] > 0}
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert PAD_BLOCK not in free | inactive | active, "the padding block is in circulation"
        assert self._refcount[PAD_BLOCK] == 0, "the padding block has references"
        assert not free & inactive, f"blocks both free and inactive: {free & inactive}"
        assert not free & active, f"blocks both free and owned: {free & active}"
        assert not inactive & active, f"blocks both inactive and owned: {inactive & active}"
        assert len(active) == self._num_active, "active count out of sync"
        total = len(free) + len(active) + len(inactive)
        assert total == self.num_usable, f"free+active+inactive = {total} != {self.num_usable}"
        assert all(rc >= 0 for rc in self._refcount), "negative refcount"
        for b in free:
            assert self._hash[b] is None, f"free block {b} is still registered"
        for b in inactive:
            assert self._hash[b] is not None, f"inactive block {b} is not registered"
        for h, b in self._by_hash.items():
            assert self._hash[b] == h, f"hash map entry for block {b} out of sync"
        n_hashed = sum(h is not None for h in self._hash)
        assert n_hashed == len(self._by_hash), "registered blocks and hash map differ"
        assert len(self._by_hash) == self.registrations - self.evictions, "registration count"
        if not self._enabled:
            assert not self._by_hash, "disabled pool has registrations"
        if owners is not None:
            for b in range(self._num_blocks):
                assert self._refcount[b] == owners.get(b, 0), (
                    f"block {b}: refcount {self._refcount[b]} != owners {owners.get(b, 0)}"
                )
