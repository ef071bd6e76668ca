"""The prefix-cache state machine again, with a host tier below the device pool.

Every unit the cache hands out to be read is checked against the machine's model of what the
device holds (a unit read from a block or slot that holds other content would be a wrong
answer later), stored with payloads that *are* that content, and every tier restore writes
its payload into the model, so the base machine's oracles (a hit block holds exactly the
prefix its position names, a restored state summarizes exactly [0, b)) judge the restored
bits too. The host tier is small, so it evicts constantly; after every step it holds only
whole units within its budget.
"""

from __future__ import annotations

import ast
import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from tests.unit.cache.test_prefix_cache_machine import (
    BS,
    GARBAGE,
    SALT,
    SLOTS,
    CacheMachine,
    N,
    Run,
    S,
    hashes_of,
)
from tt_serve.cache import Admission, PrefixCache, Tiers
from tt_serve.cache.host_tier import HostTier

pytestmark = pytest.mark.slow

HOST_BUDGET = 700  # bytes: a few short units; the payloads below are their reprs


def _enc(prefix: tuple[int, ...]) -> bytes:
    return repr(prefix).encode()


def _dec(data: bytes) -> tuple[int, ...]:
    out = ast.literal_eval(data.decode())
    assert isinstance(out, tuple)
    return out


class TieredCacheMachine(CacheMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tiers = Tiers(HostTier(HOST_BUDGET, BS), None)
        self.cache = PrefixCache(
            num_blocks=N,
            block_size=BS,
            num_snapshot_slots=SLOTS,
            stride=S,
            salt=SALT,
            tiers=self.tiers,
        )
        self.tier_restores = 0

    # The engine reads published units in the step that published them, before anything else
    # is admitted: settle pending saves before any admission or cold filler.
    def admit(self) -> None:
        if self.pending:
            self._settle(random.Random(len(self.pending)))
        super().admit()

    def evict(self, size: int) -> None:
        if self.pending:
            self._settle(random.Random(size))
        super().evict(size)

    def _settle(self, rng: random.Random) -> None:
        super()._settle(rng)
        for read in self.cache.take_unit_reads():
            prefix = self.snap[read.snapshot_slot]
            assert len(prefix) == read.b and hashes_of(prefix)[-1] == read.hashes[-1]
            assert read.hashes == tuple(hashes_of(prefix)), "unit hashes are not its prefix's"
            blocks = []
            for blk, h in zip(read.blocks, read.block_hashes, strict=True):
                content = self.kv.get(blk)
                assert content is not GARBAGE and content is not None, f"unit reads block {blk}"
                assert hashes_of(content)[-1] == h, f"unit reads other content in block {blk}"
                blocks.append(_enc(content))
            self.cache.store_unit(read, _enc(prefix), blocks)

    def _tier_match(self, prompt: list[int], b_dev: int) -> int:
        """The longest stride cut past ``b_dev`` the host tier holds and the device is not
        saving right now."""
        hashes = hashes_of(tuple(prompt))
        sp = self.cache.snapshot_pool
        for b in range((len(prompt) - 1) // S * S, b_dev, -S):
            key = (hashes[b // BS - 1], b)
            pending = sp.slot_for(key) is not None and sp.lookup(key) is None
            if self.tiers.host is not None and self.tiers.host.contains(key) and not pending:
                return b
        return 0

    def _fits(self, prompt: list[int], pages: int, b: int) -> bool:
        owners = self._owners()
        hit = [self.cache.block_pool.lookup(h) for h in hashes_of(tuple(prompt))[: b // BS]]
        shared = sum(1 for blk in hit if blk is not None and owners[blk])
        return pages - shared <= self.cache.num_free_blocks + self.cache.num_inactive_blocks

    def _admit_head(self) -> None:
        prompt, max_tokens = self.waiting[0]
        rid = f"r{self.next_id}"
        self.next_id += 1
        b_dev = self._check_lookups(prompt)
        b_tier = self._tier_match(prompt, b_dev) if self.cache.enabled else 0
        lifetime = len(prompt) if max_tokens <= 1 else len(prompt) + max_tokens
        pages = -(-lifetime // BS)
        fits_dev = self._fits(prompt, pages, b_dev)
        fits_tier = self._fits(prompt, pages, b_tier) if b_tier else fits_dev
        res = self.cache.admit(rid, prompt, max_tokens)
        if pages > N - 1:
            assert res.admission is Admission.NEVER
            self.waiting.pop(0)
            return
        if res.admission is Admission.LATER:
            assert not fits_tier or not fits_dev
            self.blocked = True
            return
        assert res.admission is Admission.NOW
        self.waiting.pop(0)
        b = res.cached_tokens
        w = res.unit_write
        if w is not None:
            assert b == b_tier and fits_tier, "restored another cut than the tier's longest"
            for blk, data in zip(w.blocks, w.block_data, strict=True):
                self.kv[blk] = _dec(data)
            if w.snapshot is not None:
                self.snap[w.snapshot_slot] = _dec(w.snapshot)
                self.saves += 1  # a restored snapshot is published like a saved one
            self.tier_restores += 1
        else:
            assert b == b_dev and fits_dev
        for j, blk in enumerate(res.block_table[: b // BS]):
            assert self.kv[blk] == tuple(prompt[: (j + 1) * BS]), f"hit block {blk} content"
        for blk in res.block_table[b // BS :]:
            self.kv[blk] = GARBAGE
        if b:
            assert res.restore_snapshot is not None
            assert self.snap[res.restore_snapshot] == tuple(prompt[:b]), "restored wrong state"
            self.restores += 1
        self.queries += len(prompt)
        self.hits += b
        cap = max(1, max_tokens)
        self.running[rid] = Run(list(prompt), len(prompt), cap, res.block_table, b, b, b > 0)

    @invariant()
    def pools_content_and_stats_add_up(self) -> None:
        super().pools_content_and_stats_add_up()
        if self.tiers.host is not None:
            self.tiers.host.check_invariants()  # whole units only, within the budget


TestTieredCacheMachine = TieredCacheMachine.TestCase
TestTieredCacheMachine.settings = settings(
    max_examples=600,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_the_machine_restores_from_the_tier() -> None:
    """Not vacuous: a short fixed run where the device pool turns over restores from the tier."""
    m = TieredCacheMachine()
    m.setup(enabled=True, first=0)
    rng = random.Random(3)
    for i in range(200):
        m.compute(rng.randrange(1 << 16))
        m.release(i % 8)
        if i % 5 == 0:
            m.evict(4)
        if i % 3 == 0:
            m.add(rng.randrange(8), 2)
        m.pools_content_and_stats_add_up()
    assert m.tier_restores > 0
