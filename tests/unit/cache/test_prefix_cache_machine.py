"""Random interleavings of add / match / admit / compute / decode / release / evict / fail.

The machine drives the cache the way the engine does (FCFS admission, prefill chunks on the
stride grid, decode steps, snapshot saves published or aborted at once or after other events,
failed forwards, client aborts, cold fillers that reclaim KV) and keeps
its own model of what every KV block and snapshot slot *contains*: the token prefix whose KV or
state was written there, or garbage after a failed step. After every step it checks the pool
invariants, that the stats add up, that lookups agree with the spec, and that the cache only
ever registers or restores content that is really there.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tt_serve.cache import Admission, PrefixCache, SnapshotSave, block_hashes

pytestmark = pytest.mark.slow

BS, S, N, SLOTS = 2, 4, 16, 3
SALT = b"machine"
GARBAGE = None
# Three prompt heads; the first two share their first stride, so hits and partial hits are
# common. A prompt is one entry of a fixed table, drawn as a single integer: hypothesis'
# per-draw overhead dominates this machine's run time, and a list strategy
# costs a dozen draws per prompt. For the same reason an engine step draws one integer that
# seeds the choices inside the step (which rows run, how each save ends, whether it fails).
BASES = ([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], [1, 2, 3, 1, 3, 2, 1, 3, 2, 1, 3, 2], [2, 2, 2, 2])
PROMPTS = [
    base[:k] + tail or [0]
    for k in (9, 5, 12, 8, 4, 7, 3, 1, 0)  # hypothesis favours small indices: long ones first
    for tail in ([3, 1], [], [0], [2, 2, 2])
    for base in BASES
]
SEEDS = st.integers(0, 2**16 - 1)


@functools.cache
def hashes_of(tokens: tuple[int, ...]) -> list[bytes]:
    """Memoized reference hashes (the machine re-checks the same short prefixes constantly)."""
    return block_hashes(tokens, BS, SALT)


@dataclass
class Run:
    tokens: list[int]
    prompt_len: int
    cap: int  # tokens it may sample
    table: tuple[int, ...]
    computed: int
    cached: int
    restoring: bool

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prompt_len

    @property
    def done(self) -> bool:
        return len(self.tokens) - self.prompt_len >= self.cap


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cache = PrefixCache(
            num_blocks=N, block_size=BS, num_snapshot_slots=SLOTS, stride=S, salt=SALT
        )
        self.waiting: list[tuple[list[int], int]] = []
        self.running: dict[str, Run] = {}
        self.kv: dict[int, tuple[int, ...] | None] = {}  # block -> prefix written there
        self.snap: dict[int, tuple[int, ...]] = {}  # slot -> prefix its state summarizes
        self.pending: list[tuple[SnapshotSave, tuple[int, ...]]] = []  # saves not yet settled
        self.next_id = 0
        self.blocked = False  # the head of the queue got LATER; nothing was released since
        self.queries = self.hits = self.restores = self.saves = 0

    @initialize(
        enabled=st.sampled_from([True, True, True, False]),
        first=st.integers(0, len(PROMPTS) - 1),
    )
    def setup(self, enabled: bool, first: int) -> None:
        if not enabled:
            self.cache = PrefixCache(
                num_blocks=N,
                block_size=BS,
                num_snapshot_slots=SLOTS,
                stride=S,
                salt=SALT,
                enabled=False,
            )
        self.add(first, 2)

    # Hypothesis' swarm testing disables a random subset of the rules in each test case. So
    # every rule is valid in every state (a no-op where it does not apply: with preconditions
    # it often disabled every applicable rule and threw the test case away), and requests also
    # arrive during engine steps and at setup, so that a test case whose ``add`` is disabled
    # still exercises the cache.

    # Hypothesis favours the first rule in its order (fewest arguments, then name), so the
    # engine step sorts first and the arrival, with two arguments, last.

    @rule(prompt=st.integers(0, len(PROMPTS) - 1), max_tokens=st.sampled_from((0, 1, 2, 4)))
    def add(self, prompt: int, max_tokens: int) -> None:
        """A new request arrives (turned away when three are waiting) and admission runs."""
        if len(self.waiting) < 3:
            self.waiting.append((PROMPTS[prompt], max_tokens))
        self.admit()

    def admit(self) -> None:
        """Admission as the scheduler runs it: FCFS, offer the head of the queue until one
        gets LATER. It runs after every arrival and after blocks were returned; in between,
        the answer cannot change."""
        while self.waiting and not self.blocked:
            self._admit_head()

    def _admit_head(self) -> None:
        prompt, max_tokens = self.waiting[0]
        rid = f"r{self.next_id}"
        self.next_id += 1
        b = self._check_lookups(prompt)
        lifetime = len(prompt) if max_tokens <= 1 else len(prompt) + max_tokens
        pages = -(-lifetime // BS)
        owners = self._owners()
        hit = [self.cache.block_pool.lookup(h) for h in hashes_of(tuple(prompt))[: b // BS]]
        shared = sum(1 for blk in hit if owners[blk])
        fits = pages - shared <= self.cache.num_free_blocks + self.cache.num_inactive_blocks
        before = (self._pools(), self.cache.stats)
        res = self.cache.admit(rid, prompt, max_tokens)
        if pages > N - 1:
            assert res.admission is Admission.NEVER and res.reason
        elif not fits:
            assert res.admission is Admission.LATER
        else:
            assert res.admission is Admission.NOW
        if res.admission is not Admission.NOW:
            assert (self._pools(), self.cache.stats) == before, "LATER/NEVER changed state"
            if res.admission is Admission.NEVER:
                self.waiting.pop(0)
            else:
                self.blocked = True
            return
        self.waiting.pop(0)
        assert res.cached_tokens == b and len(res.block_table) == pages
        assert 0 not in res.block_table and tuple(hit) == res.block_table[: b // BS]
        for j, blk in enumerate(hit):
            assert blk is not None and self.kv[blk] == tuple(prompt[: (j + 1) * BS])
        for blk in res.block_table[b // BS :]:
            self.kv[blk] = GARBAGE  # fresh for this request, whatever it held before
        if b:
            assert res.restore_snapshot is not None
            assert self.snap[res.restore_snapshot] == tuple(prompt[:b]), "restored wrong state"
            self.restores += 1
        else:
            assert res.restore_snapshot is None
        self.queries += len(prompt)
        self.hits += b
        cap = max(1, max_tokens)
        self.running[rid] = Run(list(prompt), len(prompt), cap, res.block_table, b, b, b > 0)

    @rule(seed=SEEDS)
    def compute(self, seed: int) -> None:
        """One mixed engine step over a random subset of the running requests: a prefill
        chunk (to the next stride multiple or the prompt end) or a decode row each."""
        self._engine_step(random.Random(seed), lambda r: not r.done)

    @rule(seed=SEEDS)
    def decode(self, seed: int) -> None:
        """One all-decode step, or an all-prefill step when nothing decodes (the scheduler's
        unmixed steps)."""
        decoding = any(not r.in_prefill and not r.done for r in self.running.values())
        phase = (lambda r: not r.in_prefill) if decoding else (lambda r: r.in_prefill)
        self._engine_step(random.Random(seed), lambda r: phase(r) and not r.done)

    @rule(i=st.integers(0, 7))
    def release(self, i: int) -> None:
        """A finished request is released; now and then (i == 0) a client goes away instead
        and a running request is released mid-flight, whatever it holds (a pinned restore,
        blocks of a half-done prefill)."""
        rid = self._pick(i, lambda r: True) if i == 0 else self._pick(i, lambda r: r.done)
        if rid is not None:
            self._release(rid)
            self.admit()

    def _release(self, rid: str) -> None:
        del self.running[rid]
        self.cache.release(rid)
        self.cache.release(rid)  # idempotent
        self.blocked = False

    @rule(size=st.integers(1, 4))
    def evict(self, size: int) -> None:
        """A cold filler: reclaims inactive KV and must never evict a snapshot for it."""
        n = min(size, self.cache.num_free_blocks + self.cache.num_inactive_blocks)
        if n == 0:
            return
        filler = [100 + self.next_id] * (n * BS)
        rid = f"f{self.next_id}"
        self.next_id += 1
        snaps = (self.cache.snapshot_pool.published_keys(), self.cache.stats.snapshot_evictions)
        res = self.cache.admit(rid, filler, 1)
        assert res.admission is Admission.NOW and res.cached_tokens == 0
        after = (self.cache.snapshot_pool.published_keys(), self.cache.stats.snapshot_evictions)
        assert after == snaps, "a KV allocation evicted a snapshot"
        for blk in res.block_table:
            self.kv[blk] = GARBAGE
        self.queries += len(filler)
        self.cache.release(rid)

    # -- the engine step ---------------------------------------------------------------------

    def _engine_step(self, rng: random.Random, eligible: Callable[[Run], bool]) -> None:
        if rng.random() < 0.3:
            self.add(rng.randrange(len(PROMPTS)), rng.choice((0, 1, 2, 4)))
        rows = [rid for rid, run in self.running.items() if eligible(run) and rng.random() < 0.8]
        if not rows:
            return
        self._settle(rng)  # before the forward: last step's saves copied, restores copied in
        for rid in rows:
            run = self.running[rid]
            if run.restoring:
                self.cache.restore_done(rid)
                run.restoring = False
        if rng.random() < 1 / 16:
            self.fail(rows)
            return
        for rid in rows:
            run = self.running[rid]
            if run.in_prefill:
                start, end = run.computed, min((run.computed // S + 1) * S, run.prompt_len)
            else:
                start, end = len(run.tokens) - 1, len(run.tokens)
            for p in range(start, end):
                self.kv[run.table[p // BS]] = tuple(run.tokens[: p + 1])
            save = self.cache.on_computed(rid, run.tokens, end, snapshot_ok=end <= run.prompt_len)
            run.computed = end
            if save is not None:
                assert save.boundary == end and end % S == 0 and save.request_id == rid
                self.pending.append((save, tuple(run.tokens[:end])))
            if end >= run.prompt_len and not run.done:
                run.tokens.append(rng.randrange(4))
                if run.done and rng.random() < 0.5:  # released in the step that finished it
                    self._release(rid)
        if rng.random() < 0.7:  # usually settled at once; else other events come first
            self._settle(rng)
        self.admit()

    def _settle(self, rng: random.Random) -> None:
        """Publish (the state copy succeeded) or abort every pending save, even of requests
        released meanwhile."""
        for save, prefix in self.pending:
            if rng.random() < 0.8:
                self.cache.publish(save)
                self.snap[save.snapshot_slot] = prefix
                self.saves += 1
            else:
                self.cache.abort(save)
        self.pending.clear()

    def fail(self, rows: list[str]) -> None:
        """The forward raised: it may have scribbled on every block at or past each row's
        computed position; the engine releases every request of the batch."""
        for rid in rows:
            run = self.running.pop(rid)
            for blk in run.table[run.computed // BS :]:
                self.kv[blk] = GARBAGE
            self.cache.release(rid)
        self.blocked = False
        self.admit()

    # -- oracles -----------------------------------------------------------------------------

    def _pick(self, i: int, pred: Callable[[Run], object]) -> str | None:
        """The (i mod n)-th running request satisfying ``pred``."""
        ids = [r for r, run in self.running.items() if pred(run)]
        return ids[i % len(ids)] if ids else None

    def _pools(self) -> tuple[object, ...]:
        bp, sp = self.cache.block_pool, self.cache.snapshot_pool
        return (bp.free_blocks(), bp.inactive_blocks(), bp.registered(), sp.published_keys())

    def _owners(self) -> Counter[int]:
        owners: Counter[int] = Counter()
        for run in self.running.values():
            owners.update(run.table)
        return owners

    def _check_lookups(self, prompt: list[int]) -> int:
        b = self.cache.match(prompt)
        assert b == self._expected_match(prompt), "match disagrees with the spec"
        inflight = self.cache.inflight_boundary(prompt)
        assert inflight == self._expected_inflight(prompt), "inflight_boundary is wrong"
        return b

    def _expected_match(self, prompt: list[int]) -> int:
        """The spec: the longest stride multiple b <= len - 1 with every block of [0, b)
        registered and a published snapshot at (hash at b, b)."""
        registered = self.cache.block_pool.registered()
        published = self.cache.snapshot_pool.published_keys()
        hashes = hashes_of(tuple(prompt))
        for b in range((len(prompt) - 1) // S * S, 0, -S):
            kv = all(h in registered for h in hashes[: b // BS])
            if kv and (hashes[b // BS - 1], b) in published:
                return b
        return 0

    def _expected_inflight(self, prompt: list[int]) -> int:
        if not self.cache.enabled:
            return 0
        head = tuple(prompt)
        for b in range((len(prompt) - 1) // S * S, 0, -S):
            if any(save.boundary == b and prefix == head[:b] for save, prefix in self.pending):
                return b
            for run in self.running.values():
                ahead = run.cached < b <= run.prompt_len and run.computed < b
                if ahead and run.tokens[:b] == prompt[:b]:
                    return b
        return 0

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def pools_content_and_stats_add_up(self) -> None:
        cache = self.cache
        cache.check_invariants()
        bp, sp = cache.block_pool, cache.snapshot_pool
        assert cache.num_free_blocks + cache.num_active_blocks + cache.num_inactive_blocks == N - 1
        owners = self._owners()
        for blk in range(N):
            assert bp.refcount(blk) == owners[blk], "a refcount that is not a table owner"
        assert not bp.free_blocks() & set(owners), "a block both free and owned"
        stats = cache.stats
        assert (stats.queries, stats.hits) == (self.queries, self.hits)
        assert (stats.snapshot_restores, stats.snapshot_saves) == (self.restores, self.saves)
        assert sp.num_published == stats.snapshot_saves - stats.snapshot_evictions
        assert cache.num_snapshots_used == sp.num_published + len(self.pending)
        registered = bp.registered()
        assert len(registered) == stats.kv_registrations - stats.kv_evictions
        if not cache.enabled:
            assert not registered and cache.num_snapshots_used == 0 and stats.hits == 0
        # A registered block holds fully written KV of exactly the prefix its hash names; a
        # published snapshot summarizes exactly the prefix its key names. Snapshots hold no
        # block (the refcounts above equal the table owners), so neither can pin the other.
        for h, blk in registered.items():
            content = self.kv.get(blk)
            assert content is not None and len(content) % BS == 0, f"block {blk} not written"
            assert hashes_of(content)[-1] == h, f"block {blk} holds other content"
        for (h, b), slot in sp.published_keys().items():
            prefix = self.snap[slot]
            assert len(prefix) == b and hashes_of(prefix)[-1] == h, f"slot {slot} content"
        # match and inflight_boundary agree with the spec for every waiting prompt, after every
        # step (they are pure: the state checked above is not touched).
        for prompt, _ in self.waiting:
            self._check_lookups(prompt)


TestPrefixCacheMachine = CacheMachine.TestCase
TestPrefixCacheMachine.settings = settings(
    max_examples=2000,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
