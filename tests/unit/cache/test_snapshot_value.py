"""Snapshot memory: eviction by value (not plain LRU) and the per-conversation cap."""

from __future__ import annotations

import random

import pytest

from tt_serve.cache import PrefixCache, ResumeRule, SnapshotPool

IM, G, C = 5, 16, 64


def key(depth: int, tag: int) -> tuple[bytes, int]:
    return (tag.to_bytes(16, "little"), depth)


def publish(pool: SnapshotPool, k: tuple[bytes, int]) -> int | None:
    slot = pool.reserve(k)
    if slot is not None:
        pool.publish(slot)
    return slot


def resume(pool: SnapshotPool, k: tuple[bytes, int]) -> None:
    slot = pool.lookup(k)
    assert slot is not None
    pool.pin(slot)
    pool.unpin(slot)


@pytest.mark.parametrize(("policy", "survives"), [("value", True), ("lru", False)])
def test_deep_often_resumed_state_survives_a_burst_of_shallow_ones(
    policy: str, survives: bool
) -> None:
    """A shared 1,536-token head resumed by three agents, then a burst of 40 one-block
    branches: value eviction keeps the head (it spares 24 times the tokens of a shallow state,
    and was used more); LRU drops it (SGLang's users lost their hits that way)."""
    pool = SnapshotPool(4, policy=policy)
    deep = key(1536, 0)
    publish(pool, deep)
    for _ in range(3):
        resume(pool, deep)
    for i in range(40):
        publish(pool, key(64, i + 1))
        pool.check_invariants()
    assert pool.contains(deep) is survives
    assert pool.evictions == 41 - 4


def test_idle_states_age_out_whatever_their_depth() -> None:
    """Value is L + depth x uses, L rising with every eviction: a deep state nobody resumes
    makes way once enough shallow traffic went by (no state is kept for ever)."""
    pool = SnapshotPool(2)
    publish(pool, key(1024, 0))
    for i in range(100):
        publish(pool, key(64, i + 1))
    assert not pool.contains(key(1024, 0))


def test_evict_frees_only_published_unpinned_slots() -> None:
    pool = SnapshotPool(2)
    slot = pool.reserve(key(64, 1))
    assert slot is not None
    with pytest.raises(ValueError, match="not evictable"):
        pool.evict(slot)  # pending
    pool.publish(slot)
    pool.pin(slot)
    with pytest.raises(ValueError, match="not evictable"):
        pool.evict(slot)
    pool.unpin(slot)
    pool.evict(slot)
    assert pool.num_used == 0 and not pool.contains(key(64, 1))
    pool.check_invariants()


def _turns(rng: random.Random, n: int) -> list[list[int]]:
    """One conversation's prompts: a system prompt, then n turns of answer + tool result."""
    history = [IM, *(rng.randrange(10, 900) for _ in range(100))]
    out = []
    for _ in range(n):
        history += [IM, 2, 3]  # the generation prompt
        out.append(list(history))
        history += [rng.randrange(10, 900) for _ in range(20)] + [IM]
        history += [rng.randrange(10, 900) for _ in range(70)]
    return out


@pytest.mark.parametrize("cap", [2, 3, 5])
def test_a_conversation_holds_at_most_its_cap_and_still_resumes(cap: int) -> None:
    rule = ResumeRule(chunk=C, grid=G, boundary_ids=frozenset({IM}))
    cache = PrefixCache(
        num_blocks=512,
        block_size=G,
        num_snapshot_slots=64,
        stride=C,
        snapshots_per_conversation=cap,
    )
    prompts = _turns(random.Random(cap), 8)
    for i, toks in enumerate(prompts):
        pts = rule.points(toks)
        res = cache.admit(f"t{i}", toks, 1, pts)
        if i:  # every later turn resumes at the previous generation prompt (or later)
            assert res.cached_tokens >= (len(prompts[i - 1]) - 3) // G * G
        cache.restore_done(f"t{i}")
        done = res.cached_tokens
        while done < len(toks):
            done = pts.next_end(done)
            save = cache.on_computed(f"t{i}", toks, done, snapshot_ok=True)
            if save is not None:
                cache.publish(save)
        cache.release(f"t{i}")
        cache.check_invariants()
    st = cache.stats
    assert st.snapshots_per_conversation_peak == cap
    assert st.snapshot_cap_evictions > 0
    # Every snapshot lies on the last prompt's path (each turn extends the one before).
    assert cache.snapshot_pool.num_published <= cap
