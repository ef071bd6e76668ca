"""The joint prefix cache: paged KV blocks and GDN snapshots behind one content-addressed
interface. Pure bookkeeping (stdlib only): it hands the engine plain ints and never touches a
tensor."""

from __future__ import annotations

from tt_serve.cache.block_pool import PAD_BLOCK, BlockPool
from tt_serve.cache.hashing import (
    BlockHash,
    block_hashes,
    chain_hash,
    extend_block_hashes,
    make_salt,
    root_hash,
)
from tt_serve.cache.prefix_cache import PrefixCache
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
from tt_serve.cache.tiers import TierPolicy, Tiers, TierStats

__all__ = [
    "PAD_BLOCK",
    "Admission",
    "AdmitResult",
    "BlockHash",
    "BlockPool",
    "CacheStats",
    "PrefixCache",
    "ResumeKind",
    "ResumePoints",
    "ResumeRule",
    "SnapshotKey",
    "SnapshotPool",
    "SnapshotSave",
    "TierPolicy",
    "TierStats",
    "Tiers",
    "UnitRead",
    "UnitWrite",
    "block_hashes",
    "chain_hash",
    "extend_block_hashes",
    "make_salt",
    "root_hash",
]
