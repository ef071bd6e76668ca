"""The joint prefix cache: the one place that reconciles paged KV with GDN snapshots.

A GDN layer's state after token t summarizes the whole prefix and cannot be rebuilt from KV, so
a hit of length b needs both the KV blocks of [0, b) and a snapshot taken at exactly b, for the
same content hash. The scheduler talks only to :class:`PrefixCache`; it gets plain ints back
(cached token counts, block tables, snapshot slots) and hands the engine the state copies.

Rules enforced here (where a prompt is cut and may resume: ``cache/resume.py``):

* Lookup: b is one of the request's own cuts (``ResumePoints``; all are <= prompt_len - 1, so
  one prompt token is always computed), every block of [0, b) is registered and a snapshot is
  published at (h(b), b). KV alone or a snapshot alone is a miss and reports 0 cached tokens.
  Without ``ResumePoints`` a request is cut at multiples of the stride S only.
* Admission reserves a request's lifetime up front: ``prompt`` tokens if max_tokens <= 1 else
  ``prompt + max_tokens``, in pages, minus the hit pages already active (shared for free).
  The answer is NOW (everything reserved), LATER (nothing changed) or NEVER (too big for the
  pool). A running request therefore never waits for memory.
* Registration only after compute, and only of prefill: ``on_computed`` registers the full
  blocks below both the tokens whose KV is written and the request's ``register_limit`` (never
  past the prompt: decode writes KV with other kernels, and a hit must give the cold run's
  bits).
* Snapshots are offered at every ``on_computed`` with ``snapshot_ok`` that lands on one of the
  request's ``saves``; the engine passes ``snapshot_ok`` only for prefill chunks, whose state
  is exactly the state after ``num_computed`` tokens. Every returned :class:`SnapshotSave` must
  be published or aborted; it survives the release of its request (which may finish in the
  same step).
* Memory: at most ``snapshots_per_conversation`` snapshots lie on one request's path (its own
  save points, shared ones included); a new save past the cap first evicts the path's entry
  of least value (``SnapshotPool``), and the pool as a whole evicts by value.
* A failed step: the engine calls ``release``; nothing of that step was registered or
  published. If admission had to reclaim inactive blocks, their registrations stay dropped
  (the failed forward may have written into them).
* Tiers (``cache/tiers.py``), when given: every published snapshot's unit is handed out to be
  read (``take_unit_reads``) and stored (``store_unit``) at once; lookup also asks the tiers
  for a longer cut than the device holds, and a tier hit is admitted like a device hit whose
  missing blocks and snapshot are allocated, registered and published at once, with a
  ``UnitWrite`` the engine applies before the step that first reads them (the cuts are the
  same, so the restored bits are the cold run's).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tt_serve.cache.block_pool import BlockPool
from tt_serve.cache.hashing import BlockHash, extend_block_hashes, root_hash
from tt_serve.cache.results import (
    Admission,
    AdmitResult,
    CacheStats,
    SnapshotSave,
    UnitRead,
    UnitWrite,
)
from tt_serve.cache.resume import ResumeKind, ResumePoints, ResumeRule
from tt_serve.cache.snapshot_pool import SnapshotKey, SnapshotPool
from tt_serve.cache.tier_link import Later, TierLink
from tt_serve.cache.tiers import Reading, Tiers


@dataclass
class _Request:
    points: ResumePoints
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
        snapshot_policy: str = "value",
        snapshots_per_conversation: int = 0,
        tiers: Tiers | None = None,
    ) -> None:
        """``stride``: the prefill chunk, the cut rule of requests that come without
        ``ResumePoints``. ``snapshots_per_conversation``: the cap (0: none). ``tiers``: the
        host / disk tiers below the device pool (none: the device pool only)."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if stride < 1 or stride % block_size:
            raise ValueError(
                f"stride ({stride}) must be a positive multiple of block_size ({block_size})"
            )
        if snapshots_per_conversation < 0:
            raise ValueError(
                f"snapshots_per_conversation must be >= 0, got {snapshots_per_conversation}"
            )
        self._bs = block_size
        self._stride = stride
        self._chunks_only = ResumeRule(chunk=stride, grid=block_size, messages=False)
        self._cap = snapshots_per_conversation
        self._enabled = enabled
        self._root = root_hash(salt)
        self._blocks = BlockPool(num_blocks, enabled=enabled)
        self._snapshots = SnapshotPool(num_snapshot_slots, policy=snapshot_policy)
        self._requests: dict[str, _Request] = {}
        # (hash at b, b) -> number of admitted requests that will still compute boundary b,
        # plus reserved saves at b not yet published or aborted.
        self._inflight: Counter[SnapshotKey] = Counter()
        # Reserved snapshot slot -> (request id, key, parent key: ``_parent_key``). Outlives
        # the request: one that finishes in the step that reserved a save is released before
        # the engine publishes.
        self._unpublished: dict[int, tuple[str, SnapshotKey, SnapshotKey | None]] = {}
        self._queries = 0
        self._hits = 0
        self._restores = 0
        self._resumes: Counter[ResumeKind] = Counter()
        self._cap_evictions = 0
        self._peak_path = 0  # most snapshots seen on one request's path
        self._link = (
            TierLink(tiers, self._blocks, self._snapshots, block_size)
            if tiers is not None and enabled and num_snapshot_slots
            else None
        )

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
    def tiers(self) -> Tiers | None:
        return self._link.tiers if self._link is not None else None

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
            resumes_message=self._resumes[ResumeKind.MESSAGE],
            resumes_prompt_end=self._resumes[ResumeKind.PROMPT_END],
            resumes_chunk=self._resumes[ResumeKind.CHUNK],
            snapshot_cap_evictions=self._cap_evictions,
            snapshots_per_conversation_peak=self._peak_path,
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

    def _points(self, tokens: Sequence[int], points: ResumePoints | None) -> ResumePoints:
        if points is None:
            return self._chunks_only.points(tokens)
        if points.prompt_len != len(tokens):
            raise ValueError(
                f"resume points are for {points.prompt_len} tokens, the prompt has {len(tokens)}"
            )
        return points

    def _lookup(self, tokens: Sequence[int], hashes: list[BlockHash], points: ResumePoints) -> int:
        """Longest joint hit b for ``tokens``, filling ``hashes`` as far as it looked."""
        if not self._enabled or self._snapshots.num_slots == 0:
            return 0
        registered = self._blocks.is_registered
        best = 0
        checked = 0  # blocks known to be registered
        # Walking forward and stopping at the first unregistered block is equivalent to
        # scanning cuts from the longest down, and hashes only what can matter.
        for b in points.cuts:
            n = b // self._bs
            extend_block_hashes(hashes, tokens, self._bs, self._root, n)
            if not all(registered(h) for h in hashes[checked:n]):
                break
            checked = n
            if self._snapshots.contains((hashes[n - 1], b)):
                best = b
        return best

    def match(self, tokens: Sequence[int], points: ResumePoints | None = None) -> int:
        """Cached prompt tokens a request with these tokens would get now (0 on a miss).
        Pure lookup: no side effects."""
        return self._lookup(tokens, [], self._points(tokens, points))

    def inflight_boundary(
        self,
        tokens: Sequence[int],
        points: ResumePoints | None = None,
        hashes: list[BlockHash] | None = None,
    ) -> int:
        """Longest cut b of ``tokens`` that an admitted request with the same prefix has still
        to compute (and snapshot) itself; 0 if none. A boundary stays in flight until that
        request computed past it, or until its pending snapshot there is published or
        aborted. ``hashes``: the prompt's block hashes known so far (extended in place)."""
        if not self._inflight:
            return 0
        cuts = self._points(tokens, points).cuts
        if not cuts:
            return 0
        hashes = [] if hashes is None else hashes
        extend_block_hashes(hashes, tokens, self._bs, self._root, cuts[-1] // self._bs)
        for b in reversed(cuts):
            if self._inflight.get((hashes[b // self._bs - 1], b), 0) > 0:
                return b
        return 0

    # -- admission ---------------------------------------------------------------------------

    def admit(
        self,
        request_id: str,
        tokens: Sequence[int],
        max_tokens: int,
        points: ResumePoints | None = None,
        hashes: list[BlockHash] | None = None,
    ) -> AdmitResult:
        """Reserve a request's whole lifetime atomically (see module docstring). ``hashes``:
        the prompt's block hashes known so far, extended in place (a request retried while it
        waits is hashed once); the admitted request keeps the list."""
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
        points = self._points(tokens, points)
        hashes = [] if hashes is None else hashes
        b = self._lookup(tokens, hashes, points)
        if self._link is not None:
            tier = self._admit_from_tier(request_id, tokens, hashes, points, b, pages)
            if tier is not None:
                return tier
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
            self._resumes[points.kind(b)] += 1
        self._add_request(request_id, tokens, points, table, b, hashes, slot)
        return AdmitResult(Admission.NOW, b, table, slot)

    def _add_request(
        self,
        request_id: str,
        tokens: Sequence[int],
        points: ResumePoints,
        table: tuple[int, ...],
        b: int,
        hashes: list[BlockHash],
        slot: int | None,
    ) -> None:
        req = _Request(
            points=points,
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

    def _admit_from_tier(
        self,
        request_id: str,
        tokens: Sequence[int],
        hashes: list[BlockHash],
        points: ResumePoints,
        b_dev: int,
        pages: int,
    ) -> AdmitResult | None:
        """Admit with a hit restored from a tier at a cut past ``b_dev`` (``tier_link.py``),
        or None: the device hit applies."""
        assert self._link is not None
        cuts = [q for q in points.cuts if q > b_dev]
        if not cuts:
            return None
        extend_block_hashes(hashes, tokens, self._bs, self._root, cuts[-1] // self._bs)
        got = self._link.restore(hashes, [(hashes[q // self._bs - 1], q) for q in cuts], pages)
        if got is None:
            return None
        if isinstance(got, Later):
            return AdmitResult(Admission.LATER)
        if isinstance(got, Reading):
            return AdmitResult(Admission.READING)
        self._restores += 1
        self._resumes[points.kind(got.b)] += 1
        self._add_request(request_id, tokens, points, got.table, got.b, hashes, got.snapshot_slot)
        return AdmitResult(Admission.NOW, got.b, got.table, got.snapshot_slot, unit_write=got.write)

    def _hit_block(self, block_hash: BlockHash) -> int:
        block = self._blocks.lookup(block_hash)
        assert block is not None, "a matched block is registered"
        return block

    def _add_inflight(self, req: _Request, tokens: Sequence[int]) -> None:
        # Boundaries this request will compute and may snapshot, up to its prompt end.
        todo = sorted(b for b in req.points.saves if b > req.cached_tokens)
        if not todo:
            return
        extend_block_hashes(req.hashes, tokens, self._bs, self._root, todo[-1] // self._bs)
        for b in todo:
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

        Registers every full block below ``num_computed`` (and below the request's registration
        limit) and, if ``snapshot_ok`` and ``num_computed`` is one of the request's save points,
        reserves a snapshot slot for it.
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
        n_full = min(num_computed, req.points.register_limit) // self._bs
        if n_full > req.num_registered:
            extend_block_hashes(req.hashes, tokens, self._bs, self._root, n_full)
            for i in range(req.num_registered, n_full):
                self._blocks.register(req.table[i], req.hashes[i])
            req.num_registered = n_full
        while req.inflight and req.inflight[0][1] <= num_computed:
            self._drop_inflight(req.inflight.popleft())
        if not (snapshot_ok and num_computed in req.points.saves):
            return None
        if self._snapshots.num_slots == 0:
            return None
        extend_block_hashes(req.hashes, tokens, self._bs, self._root, num_computed // self._bs)
        key = (req.hashes[num_computed // self._bs - 1], num_computed)
        held: list[tuple[int, SnapshotKey]] = []
        if self._snapshots.slot_for(key) is None:
            held = self._held_below(req, num_computed)
            if not self._within_cap(held):
                self._snapshots.skips += 1
                return None
        slot = self._snapshots.reserve(key)
        if slot is None:
            return None
        if self._link is not None:
            n = num_computed // self._bs
            to_disk = num_computed in _disk_cuts(req.points)
            self._link.reserved(slot, req.table[:n], tuple(req.hashes[:n]), to_disk)
        self._unpublished[slot] = (request_id, key, self._parent_key(req, num_computed, held))
        self._inflight[key] += 1  # still in flight until published or aborted
        return SnapshotSave(request_id, slot, num_computed)

    def _held_below(self, req: _Request, b: int) -> list[tuple[int, SnapshotKey]]:
        """The snapshots (slot, key) held on ``req``'s path below ``b``, shallowest first."""
        held = []
        for q in sorted(q for q in req.points.saves if q < b):
            key = (req.hashes[q // self._bs - 1], q)
            slot = self._snapshots.slot_for(key)
            if slot is not None:
                held.append((slot, key))
        return held

    def _parent_key(
        self, req: _Request, b: int, held: list[tuple[int, SnapshotKey]]
    ) -> SnapshotKey | None:
        """The snapshot a save at ``b`` hangs from in the pool's tree: the deepest of ``held``
        (``_held_below``) the pool still holds. None for a prompt-end save: it serves only
        requests cut there too, not the conversation's next turn, so its parent stays a
        leaf."""
        pts = req.points
        if b in pts.cuts and pts.kind(b) is ResumeKind.PROMPT_END:
            return None
        for slot, key in reversed(held):
            if self._snapshots.slot_for(key) == slot:
                return key
        return None

    def _within_cap(self, held: list[tuple[int, SnapshotKey]]) -> bool:
        """Make room on a request's path (``held``, updated in place) for a new snapshot: while
        the path holds the cap (if any), evict its entry of least value. False when what is
        left is pinned or pending."""
        while self._cap and len(held) >= self._cap:
            evictable = [h for h in held if self._snapshots.is_evictable(h[0])]
            if not evictable:
                return False
            victim = min(evictable, key=lambda h: self._snapshots.rank(h[0]))
            self._snapshots.evict(victim[0])
            self._cap_evictions += 1
            held.remove(victim)
        self._peak_path = max(self._peak_path, len(held) + 1)
        return True

    def _take_unpublished(
        self, save: SnapshotSave
    ) -> tuple[str, SnapshotKey, SnapshotKey | None] | None:
        entry = self._unpublished.get(save.snapshot_slot)
        if entry is None or entry[0] != save.request_id or entry[1][1] != save.boundary:
            return None
        del self._unpublished[save.snapshot_slot]
        self._drop_inflight(entry[1])
        return entry

    def publish(self, save: SnapshotSave) -> None:
        """The engine copied the state into the slot: make the snapshot visible. Valid even
        after the request was released (it may finish in the step that reserved the save)."""
        entry = self._take_unpublished(save)
        if entry is None:
            raise ValueError(f"{save} is not pending (already published or aborted)")
        self._snapshots.publish(save.snapshot_slot, parent=entry[2])
        if self._link is not None:
            self._link.published(save.snapshot_slot, save.boundary)

    def drop_unit(self, write: UnitWrite) -> None:
        """A restore's write failed: forget what it registered (its blocks, and its snapshot
        once no request pins it), so no later lookup finds what the write left. The engine
        first ends every request holding one of its blocks."""
        for blk in write.blocks:
            self._blocks.unregister(blk)
        slot = write.snapshot_slot
        if write.snapshot is not None and self._snapshots.is_evictable(slot):
            self._snapshots.evict(slot)

    def narrow_unit_read(self, read: UnitRead) -> UnitRead | None:
        """``read`` cut to the blocks the tiers lack now, right before its device read (None:
        nothing to read, a tier holds the unit)."""
        return self._link.narrow(read) if self._link is not None else None

    def restoring_from(self, slot: int) -> list[str]:
        """Requests whose state is restored from snapshot ``slot`` (pinned, not yet done)."""
        return [rid for rid, r in self._requests.items() if r.restore_slot == slot]

    def take_unit_reads(self) -> list[UnitRead]:
        """The units published since the last call, to read from the device now: before the
        next admission can reuse their blocks or evict their snapshot slot."""
        return self._link.take_reads() if self._link is not None else []

    def store_unit(self, read: UnitRead, snapshot: bytes, blocks: Sequence[bytes]) -> None:
        """The bytes of ``read`` (its snapshot and its ``blocks``, in order) go to the tiers."""
        if self._link is None:
            raise ValueError("store_unit without tiers")
        self._link.store(read, snapshot, tuple(blocks))

    def abort(self, save: SnapshotSave) -> None:
        """The copy failed or the step is dropped: free the slot. Idempotent."""
        if self._take_unpublished(save) is not None:
            if self._link is not None:
                self._link.aborted(save.snapshot_slot)
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
            assert req.cached_tokens in (0, *req.points.cuts), f"{rid}: hit off its cuts"
            assert req.cached_tokens < req.prompt_len, f"{rid}: whole prompt cached"
            assert req.num_registered * self._bs <= req.points.register_limit, (
                f"{rid}: registered past the registration limit"
            )
            assert req.num_registered <= req.num_computed // self._bs, (
                f"{rid}: registered past the computed tokens"
            )
        self._blocks.check_invariants(owners)
        self._snapshots.check_invariants(pins)
        for slot, (_, key, _) in self._unpublished.items():
            assert self._snapshots.key_of(slot) == key, f"pending slot {slot} key"
            assert not self._snapshots.is_published(slot), f"pending slot {slot} published"
            inflight[key] += 1
        if self._link is not None:
            self._link.check_invariants(set(self._unpublished))
        n_unpublished = self._snapshots.num_used - self._snapshots.num_published
        assert n_unpublished == len(self._unpublished), "reserved snapshot slots without an owner"
        assert +inflight == self._inflight, "in-flight boundary index out of sync"
        s = self.stats
        assert 0 <= s.hits <= s.queries, "hits exceed queries"
        assert s.snapshot_restores <= s.hits, "more restores than hit tokens"
        if not self._enabled:
            assert s.hits == 0 and s.kv_registrations == 0, "disabled cache hit or registered"


def _disk_cuts(points: ResumePoints) -> tuple[int, ...]:
    """The cuts the disk's ``resume`` write-back keeps (``cache/tiers.py``): the first and last
    message cuts (the shared head; where the next turn resumes), or without any, the last chunk
    cut (the deepest state a longer prompt can share)."""
    cuts = list(zip(points.cuts, points.kinds, strict=True))
    messages = [q for q, k in cuts if k is ResumeKind.MESSAGE]
    if messages:
        return (messages[0], messages[-1])
    return tuple([q for q, k in cuts if k is ResumeKind.CHUNK][-1:])
