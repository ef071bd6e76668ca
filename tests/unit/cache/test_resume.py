"""Resume points (cache/resume.py): where prompts are cut, and why a hit there is exact."""

from __future__ import annotations

import random

import pytest

from tests.unit.cache.drive import serve
from tt_serve.cache import PrefixCache, ResumeKind, ResumeRule

IM = 5  # the message-start id in these tests
G, C = 16, 64
RULE = ResumeRule(chunk=C, grid=G, boundary_ids=frozenset({IM}))


def chat(rng: random.Random, n: int, p_im: float = 0.05) -> list[int]:
    return [IM if rng.random() < p_im else rng.randrange(10, 1000) for _ in range(n)]


def test_cuts_of_a_chat_prompt() -> None:
    toks = [1] * 200
    for p in (0, 40, 47, 130):  # the message at 0 is the start: no cut there
        toks[p] = IM
    pts = RULE.points(toks)
    assert pts.cuts == (32, 64, 128, 192)
    assert [k.value for k in pts.kinds] == ["message", "chunk", "message", "chunk"]
    assert pts.register_limit == 200  # the last cut (192) is a chunk multiple: stable
    assert pts.saves == frozenset({32, 64, 128, 192})
    assert [pts.next_end(s) for s in (0, 32, 64, 128, 192)] == [32, 64, 128, 192, 200]


def test_prompt_end_cut_is_the_last_grid_point_and_stops_registration() -> None:
    pts = RULE.points([1] * 150)
    assert pts.cuts == (64, 128, 144)
    assert pts.kind(144) is ResumeKind.PROMPT_END
    assert pts.register_limit == 144, "the last chunk starts at a cut a longer prompt lacks"
    # A prompt of exactly 4C: its end is a save point only if the last chunk started stably.
    assert RULE.points([1] * 256).saves == frozenset({64, 128, 192, 240})
    assert 256 in ResumeRule(chunk=C, grid=G, messages=False).points([1] * 256).saves
    assert RULE.points([1] * 256).register_limit == 240


def test_short_prompts_have_no_cuts() -> None:
    for n in (1, 2, G, G + 1):
        pts = RULE.points([IM] * n)
        assert all(0 < c < n for c in pts.cuts)
    assert RULE.points([1] * (G + 1)).cuts == (G,)
    assert RULE.points([1] * G).cuts == ()


def test_chunk_only_rule_is_todays() -> None:
    rule = ResumeRule(chunk=C, grid=G, boundary_ids=frozenset({IM}), messages=False)
    toks = chat(random.Random(0), 500, p_im=0.2)
    pts = rule.points(toks)
    assert pts.cuts == tuple(range(C, 500, C))
    assert pts.register_limit == 500


@pytest.mark.parametrize("seed", range(40))
def test_cuts_are_prefix_stable(seed: int) -> None:
    """The exactness argument, point 1: two prompts sharing [0, b) with b a cut of both cut
    [0, b) at the same places, whatever follows b and wherever they end."""
    rng = random.Random(seed)
    x = chat(rng, rng.randrange(20, 600))
    for _ in range(20):
        keep = rng.randrange(1, len(x) + 1)
        y = x[:keep] + chat(rng, rng.randrange(0, 300))
        if not y:
            continue
        px, py = RULE.points(x), RULE.points(y)
        for b in set(px.cuts) & set(py.saves):
            if b > keep:
                continue
            assert [c for c in px.cuts if c < b] == [c for c in py.cuts if c < b], (b, keep)


@pytest.mark.parametrize("seed", range(20))
def test_registered_blocks_are_cut_alike_in_every_prompt_sharing_them(seed: int) -> None:
    """Point 2: a block below a prompt's registration limit was computed in chunks whose
    starts every other prompt with the same tokens up to the block's end shares."""
    rng = random.Random(seed)
    y = chat(rng, rng.randrange(20, 600))
    py = RULE.points(y)
    for _ in range(20):
        x = y[: rng.randrange(1, len(y) + 1)] + chat(rng, rng.randrange(0, 300))
        px = RULE.points(x)
        shared = next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), None)
        common = min(len(x), len(y)) if shared is None else shared
        for end in range(G, min(common, py.register_limit) + 1, G):  # a block [end - G, end)
            assert [c for c in px.cuts if c < end] == [c for c in py.cuts if c < end], end


def test_points_must_fit_the_prompt() -> None:
    cache = PrefixCache(num_blocks=64, block_size=G, num_snapshot_slots=4, stride=C)
    with pytest.raises(ValueError, match="resume points"):
        cache.match([1] * 10, RULE.points([1] * 11))
    with pytest.raises(ValueError, match="multiple of the grid"):
        ResumeRule(chunk=40, grid=16)


def test_next_turn_resumes_at_the_previous_answers_message_start() -> None:
    cache = PrefixCache(num_blocks=256, block_size=G, num_snapshot_slots=16, stride=C)
    rng = random.Random(1)
    system = [IM, *chat(rng, 150, 0)]
    turn1 = [*system, IM, *chat(rng, 70, 0), IM, 2, 3]  # ... + the generation prompt
    answer = chat(rng, 30, 0)
    turn2 = [*turn1, *answer, 4, IM, *chat(rng, 90, 0), IM, 2, 3]
    assert serve(cache, "t1", turn1, RULE.points(turn1)) == 0
    start = len(turn1) - 3  # the answer's <|im_start|>
    assert serve(cache, "t2", turn2, RULE.points(turn2)) == start // G * G
    st = cache.stats
    assert (st.resumes_message, st.resumes_prompt_end, st.resumes_chunk) == (1, 0, 0)
    # Another agent with the same system prompt resumes where the system prompt ends.
    other = [*system, IM, *chat(rng, 40, 0), IM, 2, 3]
    assert serve(cache, "o1", other, RULE.points(other)) == len(system) // G * G
    # The same prompt again resumes at its last grid point.
    assert serve(cache, "o2", other, RULE.points(other)) == (len(other) - 1) // G * G


def test_decoded_answer_blocks_are_not_shared() -> None:
    """Point 4: a turn that re-sends the answer verbatim finds no block the decode wrote."""
    cache = PrefixCache(num_blocks=256, block_size=G, num_snapshot_slots=16, stride=C)
    prompt = [1] * 100
    pts = RULE.points(prompt)
    cache.admit("a", prompt, 64, pts)
    done = 0
    while done < len(prompt):
        done = pts.next_end(done)
        save = cache.on_computed("a", prompt, done, snapshot_ok=True)
        if save is not None:
            cache.publish(save)
    seq = prompt + [2] * 60  # decode writes 60 more positions, two whole blocks
    cache.on_computed("a", seq, len(seq), snapshot_ok=False)
    assert len(cache.block_pool.registered()) == pts.register_limit // G == 96 // G
    cache.release("a")
    cache.check_invariants()
