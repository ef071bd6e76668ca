"""Host-side values for the persistent trace inputs (numpy only: no torch, no ttnn).

A traced program has fixed shapes, so every per-step value reaches the device as a tensor of a
fixed shape refreshed in place: token ids, positions (the program gathers its RoPE rows from
tables resident on the device), the chunk start, page tables padded with the padding block
(``buckets.fit_table``), validity masks and one-hot selectors. Everything that decides *values*
lives here, where it is unit-testable without a device (the tt-metal Qwen3.5 port does the same in its
``masked_bucket_trace.py``).

Prefill runs one row per replay through a bucket of T tokens (T >= the row's n tokens); the
padding tokens compute garbage that nothing reads: their GDN gates are zeroed (beta = g = 0 leaves
the recurrent state untouched), the conv state is taken at the last *valid* token by a one-hot
selector, their K/V land in the padding block, and the sampled logits come from the last valid
token, again by a one-hot selector. A sampling row's draw rules reach the device as ``sampling.sampling_planes`` (argmax
rows and idle rows get neutral values and no draw flag). Decode runs every GDN state slot as one
batch row (engine
slot s in row s, so the batch is exactly the engine's max_batch rows); slots without work this
step are idle: masks that keep their GDN state, ``cur_pos = -1`` (paged SDPA decode skips the
row), ``write_pos = -1`` (paged_update_cache skips the row) and an all-padding page table. A fed
row's ``fed`` flag makes the program take its id from the previous replay's output instead of
``ids``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tt_serve.model.buckets import fit_table
from tt_serve.model.interface import PAD_BLOCK, RowSampling, StepRow
from tt_serve.model.tt.runtime.sampling import sampling_planes


def rope_tables(
    positions: np.ndarray, head_dim: int, rotary_dim: int, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [N, head_dim] (rotate-half layout); channels past rotary_dim get cos 1, sin 0
    so that one full-width formula ``x·cos + (x @ R)·sin`` implements partial RoPE."""
    # fp32 like the torch reference: the angle is rounded to fp32 before cos/sin.
    exponents = np.arange(0, rotary_dim, 2).astype(np.float32) / np.float32(rotary_dim)
    inv_freq = (1.0 / np.power(theta, exponents.astype(np.float64))).astype(np.float32)
    freqs = positions.astype(np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1).astype(np.float64)
    cos = np.ones((len(positions), head_dim), dtype=np.float32)
    sin = np.zeros((len(positions), head_dim), dtype=np.float32)
    cos[:, :rotary_dim] = np.cos(emb)
    sin[:, :rotary_dim] = np.sin(emb)
    return cos, sin


def rotation_matrix(head_dim: int, rotary_dim: int) -> np.ndarray:
    """R [hd, hd] with ``(x @ R)[:rd] = rotate_half(x[:rd])`` and zero past rotary_dim."""
    r = np.zeros((head_dim, head_dim), dtype=np.float32)
    half = rotary_dim // 2
    for j in range(half):
        r[j + half, j] = -1.0
        r[j, j + half] = 1.0
    return r


def gdn_const_tiles(chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The constant tiles chunk_gated_delta_rule needs under trace: eye, tril, ones [1,1,C,C]
    and three 16x16-quadrant masks packed as [1,1,32,96] (top-left, bottom-right, bottom-left)."""
    eye = np.eye(chunk, dtype=np.float32)
    tril = np.tril(np.ones((chunk, chunk), dtype=np.float32))
    ones = np.ones((chunk, chunk), dtype=np.float32)
    low_i = (np.arange(32) < 16)[:, None]
    low_j = (np.arange(32) < 16)[None, :]
    quads = [low_i & low_j, ~low_i & ~low_j, ~low_i & low_j]
    masks = np.concatenate([q.astype(np.float32) for q in quads], axis=1)
    return tuple(a[None, None] for a in (eye, tril, ones, masks))  # type: ignore[return-value]


@dataclass(frozen=True)
class PrefillValues:
    """One prefill row in a bucket of ``bucket`` tokens; every array has a fixed shape."""

    ids: np.ndarray  # [1, T] uint32
    positions: np.ndarray  # [1, T] uint32: RoPE table rows (padding tokens clamped)
    start: np.ndarray  # [1] int32 (chunked SDPA chunk_start_idx_tensor)
    start_u32: np.ndarray  # [1] uint32 (causal conv actual_start)
    page_table: np.ndarray  # [1, W] int32: the whole row (attention reads [0, start + T))
    fill_table: np.ndarray  # [1, T / block] int32: the pages this chunk writes
    gate_mask: np.ndarray  # [1, T, Hv] 1 on valid tokens
    conv_select: np.ndarray  # [1, K-1, K-1+T] one-hot rows of [history; x] kept as conv state
    last_select: np.ndarray  # [1, 1, T] one-hot of the last valid token
    sampling: np.ndarray  # [SAMPLING_PLANES, 1, CANDIDATES] the row's draw rules


def prefill_values(
    row: StepRow,
    *,
    bucket: int,
    block_size: int,
    width: int,
    num_v_heads: int,
    conv_state_len: int,
) -> PrefillValues:
    n, start = row.num_tokens, row.start_pos
    if start % block_size:
        raise ValueError(f"prefill chunk starts at {start}, not a multiple of {block_size}")
    ids = np.zeros((1, bucket), dtype=np.uint32)
    ids[0, :n] = row.token_ids
    table = np.array(fit_table(row, width, held_by="traces"), dtype=np.int32)
    first, pages = start // block_size, bucket // block_size
    valid_pages = -(-n // block_size)
    fill = np.full((1, pages), PAD_BLOCK, dtype=np.int32)
    fill[0, :valid_pages] = table[first : first + valid_pages]
    # The tables hold width x block_size rows; padding tokens past them read the last row.
    positions = np.minimum(np.arange(start, start + bucket), width * block_size - 1)
    mask = np.zeros((1, bucket, num_v_heads), dtype=np.float32)
    mask[0, :n] = 1.0
    k1 = conv_state_len
    select = np.zeros((1, k1, k1 + bucket), dtype=np.float32)
    # [history (k1 rows); x] -> rows n .. n+k1-1 are the k1 inputs before token n.
    select[0, np.arange(k1), n + np.arange(k1)] = 1.0
    last = np.zeros((1, 1, bucket), dtype=np.float32)
    last[0, 0, n - 1] = 1.0
    return PrefillValues(
        ids=ids,
        positions=positions.astype(np.uint32)[None],
        start=np.array([start], dtype=np.int32),
        start_u32=np.array([start], dtype=np.uint32),
        page_table=table[None],
        fill_table=fill,
        gate_mask=mask,
        conv_select=select,
        last_select=last,
        sampling=sampling_planes([row.sampling]),
    )


@dataclass(frozen=True)
class DecodeValues:
    """Every state slot as one decode batch (slot s in row s)."""

    ids: np.ndarray  # [1, S] uint32
    positions: np.ndarray  # [1, S] uint32: RoPE table rows (0 for idle rows)
    cur_pos: np.ndarray  # [S] int32, -1 = idle (paged SDPA decode skips the row)
    write_pos: np.ndarray  # [S] int32, -1 = idle (paged_update_cache writes nothing)
    page_table: np.ndarray  # [S, W] int32
    gate_mask: np.ndarray  # [1, S, Hv]
    conv_mask: np.ndarray  # [S, 1, 1, 1]
    sampling: np.ndarray  # [SAMPLING_PLANES, S, CANDIDATES] each row's draw rules
    fed: np.ndarray  # [1, S] float32: 1 = the id comes from the previous replay's out_ids
    active: tuple[int, ...]  # slots that run


def decode_values(
    rows: list[StepRow],
    *,
    num_rows: int,
    width: int,
    num_v_heads: int,
) -> DecodeValues:
    """Values for a decode batch of ``num_rows`` rows (state slots 0..num_rows-1). A fed row's
    id is 0 here and its ``fed`` flag set: the program reads the id from the device instead."""
    n = num_rows
    ids = np.zeros((1, n), dtype=np.uint32)
    cur = np.full(n, -1, dtype=np.int32)
    write = np.full(n, -1, dtype=np.int32)
    table = np.full((n, width), PAD_BLOCK, dtype=np.int32)
    positions = np.zeros((1, n), dtype=np.uint32)
    mask = np.zeros((1, n, num_v_heads), dtype=np.float32)
    conv = np.zeros((n, 1, 1, 1), dtype=np.float32)
    fed = np.zeros((1, n), dtype=np.float32)
    specs: list[RowSampling | None] = [None] * n
    for row in rows:
        r = row.state_slot
        if not 0 <= r < n:
            raise ValueError(f"state slot {r} outside 0..{n - 1}")
        if cur[r] != -1:
            raise ValueError(f"two decode rows share state slot {r}")
        ids[0, r] = 0 if row.fed else row.token_ids[0]
        cur[r] = write[r] = row.start_pos
        positions[0, r] = row.start_pos
        table[r] = fit_table(row, width, held_by="traces")
        mask[0, r] = 1.0
        conv[r] = 1.0
        fed[0, r] = float(row.fed)
        specs[r] = row.sampling
    return DecodeValues(
        ids=ids,
        positions=positions,
        cur_pos=cur,
        write_pos=write,
        page_table=table,
        gate_mask=mask,
        conv_mask=conv,
        sampling=sampling_planes(specs),
        fed=fed,
        active=tuple(r.state_slot for r in rows),
    )
