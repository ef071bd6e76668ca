"""Chained block hashes: stable across processes, chained, salted, full blocks only."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tt_serve.cache import block_hashes, chain_hash, extend_block_hashes, make_salt, root_hash

TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 9]
SALT = make_salt("Qwen/Qwen3.5-0.8B")
# Pinned digests: a change here silently invalidates every persisted or cross-process key.
PINNED_SALTED = "15fbf71af83f5cadbd91bdc820ff57ac"
PINNED_UNSALTED = "295a4928e6980a6875270593b154abb5"


def test_pinned_digests() -> None:
    assert block_hashes(TOKENS, 4, SALT)[1].hex() == PINNED_SALTED
    assert block_hashes(TOKENS, 4)[1].hex() == PINNED_UNSALTED


def test_stable_across_processes() -> None:
    # A fresh interpreter with a different PYTHONHASHSEED must agree: no use of hash().
    code = (
        "from tt_serve.cache import block_hashes, make_salt;"
        f"print(block_hashes({TOKENS!r}, 4, make_salt('Qwen/Qwen3.5-0.8B'))[1].hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert out.stdout.strip() == PINNED_SALTED


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(TOKENS, 4)) == 2
    assert block_hashes([1, 2, 3], 4) == []


def test_chain_matches_incremental_and_helpers() -> None:
    full = block_hashes(TOKENS * 3, 4, SALT)
    h = root_hash(SALT)
    for i, expect in enumerate(full):
        h = chain_hash(h, (TOKENS * 3)[4 * i : 4 * i + 4])
        assert h == expect
    part: list[bytes] = []
    for n in (1, 1, 3, 6, 100):
        extend_block_hashes(part, TOKENS * 3, 4, root_hash(SALT), n)
        assert part == full[: min(n, len(full))]


def test_hash_names_the_whole_prefix() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    # Same second block, different first block: the chain makes the second hashes differ.
    assert a[1] != b[1]
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 0, 0], 4)[:2] == a


def test_salt_separates_models_and_adapters() -> None:
    plain = block_hashes(TOKENS, 4, make_salt("m"))
    assert plain != block_hashes(TOKENS, 4, make_salt("m", "lora-a"))
    assert plain != block_hashes(TOKENS, 4, make_salt("other"))
    assert make_salt("ab", "c") != make_salt("a", "bc")


def test_token_ids_out_of_range_raise() -> None:
    with pytest.raises(OverflowError):
        block_hashes([-1, 0], 2)
    with pytest.raises(ValueError, match="block_size"):
        block_hashes([1], 0)
