"""Snapshot memory: eviction by value (not plain LRU) and the per-conversation cap."""

from __future__ import annotations

import random

import pytest

from tests.unit.cache.drive import serve
from tt_serve.cache import PrefixCache, ResumeRule, SnapshotPool
from tt_serve.cache.resume import ResumeKind

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
        cached = serve(cache, f"t{i}", toks, rule.points(toks))
        if i:  # every later turn resumes at the previous generation prompt (or later)
            assert cached >= (len(prompts[i - 1]) - 3) // G * G
    st = cache.stats
    assert st.snapshots_per_conversation_peak == cap
    assert st.snapshot_cap_evictions > 0
    # Every snapshot lies on the last prompt's path (each turn extends the one before).
    assert cache.snapshot_pool.num_published <= cap


def _agents(rng: random.Random, agents: int, turns: int) -> list[list[list[int]]]:
    """Every agent's prompts: a shared system prompt, its own task, then turns as ``_turns``."""
    head = [IM, *(rng.randrange(10, 900) for _ in range(90))]
    out = []
    for _ in range(agents):
        history = head + [IM] + [rng.randrange(10, 900) for _ in range(30)]
        prompts = []
        for _ in range(turns):
            history += [IM, 2, 3]
            prompts.append(list(history))
            history += [rng.randrange(10, 900) for _ in range(20)] + [IM]
            history += [rng.randrange(10, 900) for _ in range(70)]
        out.append(prompts)
    return out


@pytest.mark.parametrize("slots", [24, 32])
def test_agents_served_one_after_another_keep_every_resume_point(slots: int) -> None:
    """Eight agents on a shared head, each turn served whole before the next agent's (what
    one prefill row per step does), in a pool of three or four snapshots per agent: every
    later turn resumes at the previous turn's generation prompt. Before the snapshot tree an
    agent's shallow state, restored turn after turn while its deeper ones were evicted, gained
    value from those restores and pushed out the state the next turn needed (17 of 40 turns
    within the resume bound on the demo model)."""
    rule = ResumeRule(chunk=C, grid=G, boundary_ids=frozenset({IM}))
    cache = PrefixCache(
        num_blocks=4096,
        block_size=G,
        num_snapshot_slots=slots,
        stride=C,
        snapshots_per_conversation=8,
    )
    convs = _agents(random.Random(slots), 8, 6)
    short = []
    for t in range(6):
        for a, prompts in enumerate(convs):
            cached = serve(cache, f"a{a}t{t}", prompts[t], rule.points(prompts[t]))
            want = (len(prompts[t - 1]) - 3) // G * G if t else 0
            if cached < want:
                short.append((a, t, cached, want))
    assert not short
    assert cache.snapshot_pool.evictions > 0  # the pool was under pressure


def test_a_redundant_state_goes_first_a_branch_point_keeps_its_value() -> None:
    """A state with one published child (every path through it went on deeper) is evicted
    before any other, however often it was restored; a head two paths share keeps its value;
    a dropped entry's children hang from its parent."""
    pool = SnapshotPool(5)
    head, a1, a2, b1 = key(512, 0), key(640, 1), key(768, 1), key(640, 2)
    publish(pool, head)
    for _ in range(6):
        resume(pool, head)
    for k, parent in ((a1, head), (a2, a1)):
        slot = pool.reserve(k)
        assert slot is not None
        pool.publish(slot, parent=parent)
    assert pool.is_redundant(pool.lookup(head))  # one child so far: a1
    for _ in range(6):
        resume(pool, a1)  # restored often, then its path went on to a2
    slot = pool.reserve(b1)
    assert slot is not None
    pool.publish(slot, parent=head)  # a second path: head is a branch point now
    assert not pool.is_redundant(pool.lookup(head))
    publish(pool, key(64, 9))  # the pool is full now
    publish(pool, key(64, 10))  # room: the redundant a1 goes, not the shallow leaf
    assert not pool.contains(a1) and pool.contains(key(64, 9))
    assert pool.contains(head) and pool.contains(a2)
    pool.check_invariants()  # a2 hangs from head now
    assert not pool.is_redundant(pool.lookup(head))


def test_a_prompt_end_save_leaves_its_parent_a_leaf() -> None:
    """The prompt-end cut serves only a prompt cut there too, not the conversation's next
    turn: the generation prompt's state below it is no interior node for it."""
    rule = ResumeRule(chunk=C, grid=G, boundary_ids=frozenset({IM}))
    cache = PrefixCache(num_blocks=256, block_size=G, num_snapshot_slots=16, stride=C)
    toks = [IM, *range(10, 100), IM, 2, 3, *range(100, 130)]  # message start at 91
    pts = rule.points(toks)
    assert pts.kind(80) is ResumeKind.MESSAGE and pts.kind(112) is ResumeKind.PROMPT_END
    serve(cache, "r", toks, pts)
    pool = cache.snapshot_pool
    keys = sorted(pool.published_keys().items(), key=lambda kv: kv[0][1])
    assert [k[1] for k, _ in keys] == [64, 80, 112]
    assert pool.is_redundant(keys[0][1])  # 64 -> 80
    assert not pool.is_redundant(keys[1][1])  # 80 is the leaf the next turn resumes from
