"""Chained content hashes for KV blocks and GDN snapshots.

Block i of a sequence is keyed by ``h_i = H(h_{i-1} || tokens of block i)`` with
``h_{-1} = H(domain || salt)``, so a block hash names the *whole* prefix up to the end of the
block, and two sequences share ``h_i`` exactly when they share every token of ``[0, (i+1)*bs)``
and the salt (model identity and adapter). A GDN snapshot taken after ``b`` tokens is keyed by
``(h_{b/bs - 1}, b)``.

Hashes are blake2b digests over a fixed little-endian uint32 encoding of the token ids, so they
are stable across processes and machines (Python's ``hash()`` is salted per process and is never
used for content).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Sequence

BlockHash = bytes
DIGEST_SIZE = 16  # 128 bits: a collision among any realistic number of blocks is negligible
_DOMAIN = b"tt-serve/prefix-cache/v1\0"


def make_salt(model_id: str, adapter: str | None = None) -> bytes:
    """The salt that separates caches of different models or adapters.

    Length-prefixed so that ("ab", "c") and ("a", "bc") give different salts.
    """
    parts = (model_id.encode(), (adapter or "").encode())
    return b"".join(len(p).to_bytes(4, "little") + p for p in parts)


def root_hash(salt: bytes = b"") -> BlockHash:
    """The parent hash of block 0 for a given salt."""
    data = _DOMAIN + len(salt).to_bytes(4, "little") + salt
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def encode_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32 bytes (raises OverflowError outside [0, 2**32))."""
    arr = array("I", tokens)
    if arr.itemsize != 4:  # exotic platform: fall back to an explicit encoding
        return struct.pack(f"<{len(tokens)}I", *tokens)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def chain_hash(parent: BlockHash, block_tokens: Sequence[int]) -> BlockHash:
    """The hash of one block given its parent's hash."""
    return hashlib.blake2b(parent + encode_tokens(block_tokens), digest_size=DIGEST_SIZE).digest()


def extend_block_hashes(
    hashes: list[BlockHash],
    tokens: Sequence[int],
    block_size: int,
    root: BlockHash,
    num_blocks: int,
) -> None:
    """Append to ``hashes`` (the chain of ``tokens`` so far) until it covers ``num_blocks``.

    Only full blocks are hashed: ``num_blocks`` is clamped to ``len(tokens) // block_size``.
    Encodes the new span once and hashes slices of it, which is several times faster than
    encoding block by block.
    """
    start = len(hashes)
    end = min(num_blocks, len(tokens) // block_size)
    if end <= start:
        return
    data = encode_tokens(tokens[start * block_size : end * block_size])
    step = 4 * block_size
    parent = hashes[-1] if hashes else root
    blake2b = hashlib.blake2b
    for off in range(0, len(data), step):
        parent = blake2b(parent + data[off : off + step], digest_size=DIGEST_SIZE).digest()
        hashes.append(parent)


def block_hashes(tokens: Sequence[int], block_size: int, salt: bytes = b"") -> list[BlockHash]:
    """The chained hashes of every full block of ``tokens``."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out: list[BlockHash] = []
    extend_block_hashes(out, tokens, block_size, root_hash(salt), len(tokens) // block_size)
    return out
