"""The joint prefix cache: the one place that reconciles paged KV with GDN snapshots.

A GDN layer's state after token t summarizes the whole prefix and cannot be rebuilt from KV, so
a hit of length b needs both the KV blocks of [0, b) and a snapshot taken at exactly b, for the
same content hash. The scheduler talks only to :class:`PrefixCache`; it gets plain ints back
(cached token counts, block tables, snapshot slots) and hands the engine the state copies.

Rules enforced here:

* Lookup: b is a multiple of the stride S, b <= prompt_len - 1 (one prompt token is always
  computed), every block of [0, b) is registered and a snapshot is published at (h(b), b).
  KV alone or a snapshot alone is a miss and reports 0 cached tokens.
* Admission reserves a request's lifetime up front: ``prompt`` tokens if max_tokens <= 1 else
  ``prompt + max_tokens``, in pages, minus the hit pages already active (shared for free).
  The answer is NOW (everything reserved), LATER (nothing changed) or NEVER (too big for the
  pool). A running request therefore never waits for memory.
* Registration only after compute: ``on_computed`` registers the full blocks below the number
  of tokens whose KV is written; the block holding a sampled, not yet computed token is not.
* Snapshots are offered at every ``on_computed`` with ``snapshot_ok`` whose count is a multiple
  of S, including the prompt end (a later, longer prompt - the next chat turn - can resume
  there); the engine passes ``snapshot_ok`` only for prefill chunks, whose state is exactly the
  state after ``num_computed`` tokens. Every returned :class:`SnapshotSave` must be published
  or aborted; it survives the release of its request (which may finish in the same step).
* A failed step: the engine calls ``release``; nothing of that step was registered or
  published. If admission had to reclaim inactive blocks, their registrations stay dropped
  (the failed forward may have written into them).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tt_serve.cache.block_pool import BlockPool
from tt_serve.cache.hashing import BlockHash, extend_block_hashes, root_hash
from tt_serve.cache.results import Admission, AdmitResult, CacheStats, SnapshotSave
from tt_serve.cache.snapshot_pool import SnapshotKey, SnapshotPool


@dataclass
class _Request:
    prompt_len: int
    table: tuple[int, ...]
    cached_tokens: int
    hashes: list[BlockHash]  # chain over the request's tokens, extended lazily
    num_registered: int  # leading blocks already registered (or deliberately skipped)
    num_computed: int
    restore_slot: int | None
    inflight: deque[SnapshotKey] = field(default_factory=deque)  # ascending boundaries


class PrefixCache:
    """KV blocks + GDN snapshots behind one content-addressed interface (module docstring)."""

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        num_snapshot_slots: int,
        stride: int,
        enabled: bool = True,
        salt: bytes = b"",
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if stride < 1 or stride % block_size:
            raise ValueError(
                f"stride ({stride}) must be a positive multiple of block_size ({block_size})"
            )
        self._bs = block_size
        self._stride = stride
        self._enabled = enabled
        self._root = root_hash(salt)
        self._blocks = BlockPool(num_blocks, enabled=enabled)
        self._snapshots = SnapshotPool(num_snapshot_slots)
        self._requests: dict[str, _Request] = {}
        # (hash at b, b) -> number of admitted requests that will still compute boundary b,
        # plus reserved saves at b not yet published or aborted.
        self._inflight: Counter[SnapshotKey] = Counter()
        # Reserved snapshot slot -> (request id, key). Outlives the request: a request that
        # finishes in the step that reserved a save is released before the engine publishes.
        self._unpublished: dict[int, tuple[str, SnapshotKey]] = {}
        self._queries = 0
        self._hits = 0
        self._restores = 0

    # -- introspection -----------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def block_size(self) -> int:
        return self._bs

    @property
    def stride(self) -> int:
        return self._stride

    @property
    def block_pool(self) -> BlockPool:
        return self._blocks

    @property
    def snapshot_pool(self) -> SnapshotPool:
        return self._snapshots

    @property
    def num_free_blocks(self) -> int:
        return self._blocks.num_free

    @property
    def num_active_blocks(self) -> int:
        return self._blocks.num_active

    @property
    def num_inactive_blocks(self) -> int:
        return self._blocks.num_inactive

    @property
    def num_usable_blocks(self) -> int:
        return self._blocks.num_usable

    @property
    def num_snapshots_used(self) -> int:
        return self._snapshots.num_used

    @property
    def num_snapshot_slots(self) -> int:
        return self._snapshots.num_slots

    @property
    def stats(self) -> CacheStats:
        b, s = self._blocks, self._snapshots
        return CacheStats(
            queries=self._queries,
            hits=self._hits,
            kv_evictions=b.evictions,
            kv_registrations=b.registrations,
            snapshot_evictions=s.evictions,
            snapshot_saves=s.publishes,
            snapshot_restores=self._restores,
            snapshot_skips=s.skips,
            snapshot_duplicates=s.duplicates,
        )

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return self._requests[request_id].table

    def cached_tokens(self, request_id: str) -> int:
        return self._requests[request_id].cached_tokens

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    # -- lookup ------------------------------------------------------------------------------

    def lifetime_tokens(self, prompt_len: int, max_tokens: int) -> int:
        """Tokens whose KV a request may ever hold. A one-token completion ends after prefill;
        longer ones reserve ``prompt + max_tokens`` (one more than strictly written, which
        keeps the dangling generation block inside the reservation)."""
        if prompt_len < 1:
            raise ValueError(f"prompt must have at least one token, got {prompt_len}")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        return prompt_len if max_tokens <= 1 else prompt_len + max_tokens

    def _lookup(self, tokens: Sequence[int], hashes: list[BlockHash]) -> int:
        """Longest joint hit b for ``tokens``, filling ``hashes`` as far as it looked."""
        if not self._enabled or self._snapshots.num_slots == 0:
            return 0
        spb = self._stride // self._bs
        registered = self._blocks.is_registered
        best = 0
        # Walking forward and stopping at the first unregistered block is equivalent to
        # scanning boundaries from the longest down, and hashes only what can matter.
        for k in range(1, (len(tokens) - 1) // self._stride + 1):
            extend_block_hashes(hashes, tokens, self._bs, self._root, k * spb)
            if not all(registered(h) for h in hashes[(k - 1) * spb : k * spb]):
                break
            if self._snapshots.contains((hashes[k * spb - 1], k * self._stride)):
                best = k * self._stride
        return best

    def match(self, tokens: Sequence[int]) -> int:
        """Cached prompt tokens a request with these tokens would get now (0 on a miss).
        Pure lookup: no side effects."""
        return self._lookup(tokens, [])

    def inflight_boundary(self, tokens: Sequence[int]) -> int:
        """Longest stride boundary b <= len(tokens) - 1 that an admitted request with the same
        prefix has still to compute (and snapshot) itself; 0 if none. A boundary stays
        in flight until that request computed past it, or until its pending snapshot there is
        published or aborted."""
        if not self._inflight:
            return 0
        max_b = (len(tokens) - 1) // self._stride * self._stride
        hashes: list[BlockHash] = []
        extend_block_hashes(hashes, tokens, self._bs, self._root, max_b // self._bs)
        for b in range(max_b, 0, -self._stride):
            if self._inflight.get((hashes[b // self._bs - 1], b), 0) > 0:
                return b
        return 0

    # -- admission ---------------------------------------------------------------------------

    def admit(self, request_id: str, tokens: Sequence[int], max_tokens: int) -> AdmitResult:
        """Reserve a request's whole lifetime atomically (see module docstring)."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already admitted")
        lifetime = self.lifetime_tokens(len(tokens), max_tokens)
        pages = -(-lifetime // self._bs)
        usable = self._blocks.num_usable
        if pages > usable:
            reason = (
                f"request needs {pages} KV pages ({lifetime} tokens at block size {self._bs}) "
                f"but the pool has {usable} usable pages"
            )
            return AdmitResult(Admission.NEVER, reason=reason)
        hashes: list[BlockHash] = []
        b = self._lookup(tokens, hashes)
        hit = [self._hit_block(h) for h in hashes[: b // self._bs]]
        # Active hit blocks are shared for free; inactive ones leave the reclaimable pool.
        hit_inactive = sum(1 for blk in hit if self._blocks.refcount(blk) == 0)
        if pages - len(hit) > self._blocks.num_allocatable - hit_inactive:
            return AdmitResult(Admission.LATER)
        # Validated: from here on nothing can fail.
        for blk in hit:
            self._blocks.acquire(blk)
        table = (*hit, *self._blocks.allocate(pages - len(hit)))
        slot = None
        if b:
            slot = self._snapshots.lookup((hashes[b // self._bs - 1], b))
            assert slot is not None
            self._snapshots.pin(slot)
            self._restores += 1
        req = _Request(
            prompt_len=len(tokens),
            table=table,
            cached_tokens=b,
            hashes=hashes,
            num_registered=b // self._bs,
            num_computed=b,
            restore_slot=slot,
        )
        if self._enabled and self._snapshots.num_slots:
            self._add_inflight(req, tokens)
        self._requests[request_id] = req
        self._queries += len(tokens)
        self._hits += b
        return AdmitResult(Admission.NOW, b, table, slot)

    def _hit_block(self, block_hash: BlockHash) -> int:
        block = self._blocks.lookup(block_hash)
        assert block is not None, "a matched block is registered"
        return block

    def _add_inflight(self, req: _Request, tokens: Sequence[int]) -> None:
        # Boundaries this request will compute and may snapshot, up to its prompt end.
        last = req.prompt_len // self._stride * self._stride
        if last <= req.cached_tokens:
            return
        extend_block_hashes(req.hashes, tokens, self._bs, self._root, last // self._bs)
        for b in range(req.cached_tokens + self._stride, last + 1, self._stride):
            key = (req.hashes[b // self._bs - 1], b)
            req.inflight.append(key)
            self._inflight[key] += 1

    def _drop_inflight(self, key: SnapshotKey) -> None:
        n = self._inflight[key] - 1
        if n:
            self._inflight[key] = n
        else:
            del self._inflight[key]

    def restore_done(self, request_id: str) -> None:
        """The snapshot was copied into the request's state slot: unpin it."""
        req = self._requests.get(request_id)
        if req is not None and req.restore_slot is not None:
            self._snapshots.unpin(req.restore_slot)
            req.restore_slot = None

    # -- after compute -----------------------------------------------------------------------

    def on_computed(
        self, request_id: str, tokens: Sequence[int], num_computed: int, snapshot_ok: bool
    ) -> SnapshotSave | None:
        """Record a successful step: the KV of ``tokens[:num_computed]`` is written.

        Registers every full block below ``num_computed`` and, if ``snapshot_ok`` and
        ``num_computed`` is a multiple of the stride, reserves a snapshot slot for it.
        """
        req = self._requests.get(request_id)
        if req is None:
            raise KeyError(f"request {request_id!r} is not admitted")
        if not req.num_computed <= num_computed <= len(tokens):
            raise ValueError(
                f"num_computed {num_computed} must be in [{req.num_computed}, {len(tokens)}]"
            )
        if num_computed > len(req.table) * self._bs:
            raise ValueError(
                f"num_computed {num_computed} exceeds the reservation of {len(req.table)} blocks"
            )
        req.num_computed = num_computed
        if not self._enabled:
            return None
        n_full = num_computed // self._bs
        if n_full > req.num_registered:
            extend_block_hashes(req.hashes, tokens, self._bs, self._root, n_full)
            for i in range(req.num_registered, n_full):
                self._blocks.register(req.table[i], req.hashes[i])
            req.num_registered = n_full
        while req.inflight and req.inflight[0][1] <= num_computed:
            self._drop_inflight(req.inflight.popleft())
        if not (snapshot_ok and num_computed and num_computed % self._stride == 0):
            return None
        if self._snapshots.num_slots == 0:
            return None
        key = (req.hashes[n_full - 1], num_computed)
        slot = self._snapshots.reserve(key)
        if slot is None:
            return None
        self._unpublished[slot] = (request_id, key)
        self._inflight[key] += 1  # still in flight until published or aborted
        return SnapshotSave(request_id, slot, num_computed)

    def _take_unpublished(self, save: SnapshotSave) -> bool:
        entry = self._unpublished.get(save.snapshot_slot)
        if entry is None or entry[0] != save.request_id or entry[1][1] != save.boundary:
            return False
        del self._unpublished[save.snapshot_slot]
        self._drop_inflight(entry[1])
        return True

    def publish(self, save: SnapshotSave) -> None:
        """The engine copied the state into the slot: make the snapshot visible. Valid even
        after the request was released (it may finish in the step that reserved the save)."""
        if not self._take_unpublished(save):
            raise ValueError(f"{save} is not pending (already published or aborted)")
        self._snapshots.publish(save.snapshot_slot)

    def abort(self, save: SnapshotSave) -> None:
        """The copy failed or the step is dropped: free the slot. Idempotent."""
        if self._take_unpublished(save):
            self._snapshots.abort(save.snapshot_slot)

    # -- release -----------------------------------------------------------------------------

    def release(self, request_id: str) -> None:
        """Drop everything a finished, aborted or failed request holds: its blocks (registered
        ones become inactive, the rest free) and any pin. Idempotent. Saves it reserved stay
        pending until the engine publishes or aborts them."""
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        for key in req.inflight:
            self._drop_inflight(key)
        if req.restore_slot is not None:
            self._snapshots.unpin(req.restore_slot)
        self._blocks.release(req.table)

    # -- checks ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant."""
        owners: Counter[int] = Counter()
        pins: Counter[int] = Counter()
        inflight: Counter[SnapshotKey] = Counter()
        for rid, req in self._requests.items():
            owners.update(req.table)
            assert len(set(req.table)) == len(req.table), f"{rid}: duplicate blocks in table"
            assert 0 not in req.table, f"{rid}: padding block in table"
            if req.restore_slot is not None:
                pins[req.restore_slot] += 1
            inflight.update(req.inflight)
            assert req.cached_tokens % self._stride == 0, f"{rid}: unaligned hit"
            assert req.cached_tokens < req.prompt_len, f"{rid}: whole prompt cached"
            assert req.num_registered <= req.num_computed // self._bs, (
                f"{rid}: registered past the computed tokens"
            )
        self._blocks.check_invariants(owners)
        self._snapshots.check_invariants(pins)
        for slot, (_, key) in self._unpublished.items():
            assert self._snapshots.key_of(slot) == key, f"pending slot {slot} key"
            assert not self._snapshots.is_published(slot), f"pending slot {slot} published"
            inflight[key] += 1
        n_unpublished = self._snapshots.num_used - self._snapshots.num_published
        assert n_unpublished == len(self._unpublished), "reserved snapshot slots without an owner"
        assert +inflight == self._inflight, "in-flight boundary index out of sync"
        s = self.stats
        assert 0 <= s.hits <= s.queries, "hits exceed queries"
        assert s.snapshot_restores <= s.hits, "more restores than hit tokens"
        if not self._enabled:
            assert s.hits == 0 and s.kv_registrations == 0, "disabled cache hit or registered"
