"""Host values of the static-shape inputs (buckets and padding) of the CUDA-graph path; no torch.

A captured graph has fixed shapes, so every step is fitted into a bucket and padded:

* decode: single-token rows run together in a batch bucket of B rows (powers of two up to the
  number of state slots, which is the server's max batch: a batch of 64 rows replays a graph
  like a batch of 8). Padding rows use the backend's scratch slot (``Pools.scratch_slot``,
  which no engine row uses) and an all-``PAD_BLOCK`` table at position 0; they compute garbage
  in that slot and block, which no real row reads.
* prefill: one multi-token row per replay in a length bucket of T tokens (``GDN_CHUNK``·2^k up
  to the largest chunk: ``buckets.prefill_buckets``). The T - n padding tokens sit at position
  0, write their K/V into ``PAD_BLOCK`` and are masked out of the GDN scan (zero k, v, beta and
  log-decay leave the recurrent state exactly unchanged); the conv state is taken at the last
  *valid* token.

Every block table is cut to the blocks a row needs and padded with ``PAD_BLOCK`` to one fixed
width W, the most blocks one sequence may hold (``buckets.fit_table``). Values are plain int
lists, ready to be packed into one host tensor and copied to the device in a single transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tt_serve.model.buckets import NoBucket, doubling, fit_table
from tt_serve.model.interface import PAD_BLOCK, StepRow


def decode_buckets(max_rows: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``max_rows`` (which is always the last bucket)."""
    if max_rows < 1:
        raise ValueError(f"need at least one decode row (got {max_rows})")
    return doubling(1, max_rows)


@dataclass(frozen=True)
class DecodeValues:
    """Per bucket row: input id, whether the id is taken from the device (fed), position, slot,
    attention length, K/V write block and offset, block table."""

    ids: list[int]
    fed: list[int]
    positions: list[int]
    slots: list[int]
    lens: list[int]
    kv_blocks: list[int]
    kv_offsets: list[int]
    tables: list[list[int]]


def decode_values(
    rows: Sequence[StepRow],
    *,
    bucket: int,
    block_size: int,
    width: int,
    scratch_slot: int,
) -> DecodeValues:
    """Single-token rows in bucket order, then ``bucket - len(rows)`` padding rows."""
    if len(rows) > bucket:
        raise NoBucket(f"{len(rows)} decode rows exceed the bucket of {bucket}")
    v = DecodeValues([], [], [], [], [], [], [], [])
    for row in rows:
        if row.num_tokens != 1:
            raise ValueError(f"decode row for seq {row.seq_id} has {row.num_tokens} tokens")
        table = fit_table(row, width, block_size=block_size, held_by="graphs")
        pos = row.start_pos
        v.ids.append(0 if row.fed else row.token_ids[0])  # a fed row's id is on the device
        v.fed.append(int(row.fed))
        v.positions.append(pos)
        v.slots.append(row.state_slot)
        v.lens.append(pos + 1)
        v.kv_blocks.append(table[pos // block_size])
        v.kv_offsets.append(pos % block_size)
        v.tables.append(table)
    for _ in range(bucket - len(rows)):
        v.ids.append(0)
        v.fed.append(0)
        v.positions.append(0)
        v.slots.append(scratch_slot)
        v.lens.append(1)
        v.kv_blocks.append(PAD_BLOCK)
        v.kv_offsets.append(0)
        v.tables.append([PAD_BLOCK] * width)
    return v


@dataclass(frozen=True)
class PrefillValues:
    """One row in a bucket of T tokens: ids, positions, validity, K/V write block and offset per
    token; the row's block table, state slot, the conv-state columns to keep and the index of
    the last valid token."""

    ids: list[int]
    positions: list[int]
    valid: list[int]
    kv_blocks: list[int]
    kv_offsets: list[int]
    table: list[int]
    slot: list[int]
    conv_idx: list[int]
    last: list[int]


def prefill_values(
    row: StepRow | None,
    *,
    bucket: int,
    block_size: int,
    width: int,
    conv_state_len: int,
    scratch_slot: int,
) -> PrefillValues:
    """``row`` None gives the idle input (all padding), used to warm up and capture."""
    n = 0 if row is None else row.num_tokens
    if n > bucket:
        raise NoBucket(f"a prefill row of {n} tokens exceeds the bucket of {bucket}")
    pad = bucket - n
    if row is None:
        table, slot, start, ids = [PAD_BLOCK] * width, scratch_slot, 0, []
    else:
        table = fit_table(row, width, block_size=block_size, held_by="graphs")
        slot, start = row.state_slot, row.start_pos
        ids = list(row.token_ids)
    positions = list(range(start, start + n))
    return PrefillValues(
        ids=ids + [0] * pad,
        positions=positions + [0] * pad,
        valid=[1] * n + [0] * pad,
        kv_blocks=[table[p // block_size] for p in positions] + [PAD_BLOCK] * pad,
        kv_offsets=[p % block_size for p in positions] + [0] * pad,
        table=table,
        slot=[slot],
        # [history (K-1) | x (T)]: the K-1 inputs ending at the last valid token.
        conv_idx=[n + i for i in range(conv_state_len)],
        last=[max(n - 1, 0)],
    )
