"""Device rules of paged attention, which ``attention.py`` applies: the QKV head split, the
paged cache fill (prefill) and update (decode), paged SDPA decode (with the core plan it lays
out) and chunked SDPA (conventions: ``rules_base.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual.rules_base import TILE, DeviceLimitError, TensorInfo, _fail, _is

ATTENTION_DTYPES = ("bfloat16", "bfloat8_b", "bfloat4_b")
# sdpa_flash_decode.cpp / writer_decode_all.cpp: #define MAX_TREE_REDUCTION_ROUNDS 6 (64 cores/head)
MAX_TREE_REDUCTION_ROUNDS = 6


def nlp_create_qkv_heads(
    x: TensorInfo, num_heads: int, num_kv_heads: int, transpose_k_heads: bool
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A fused [B, 1, S, (nh + 2 nkv) hd] projection -> q [B, nh, S, hd], k, v [B, nkv, S, hd]
    (k [B, nkv, hd, S] when transposed).
    ttnn/cpp/ttnn/operations/experimental/transformer/nlp_create_qkv_heads/nlp_create_qkv_heads.cpp:
    "Unsupported input shape" unless the padded width divides by nh + 2 nkv (that quotient is
    head_dim);
    ttnn/cpp/ttnn/operations/experimental/transformer/nlp_create_qkv_heads/device/nlp_create_qkv_heads_device_operation.cpp
    validate_on_program_cache_miss (interleaved input): dtype FLOAT32, BFLOAT16 or BFLOAT8_B,
    TILE, "Unsupported input height {} is not tile aligned" (padded shape[2] % 32), "Unsupported
    input sequence length {} is not equal to 1" (shape[1] == 1). Q, K, V sit in that order
    along the width (tt_transformers fuses wqkv as cat([wq, wk, wv]))."""
    _fail(
        "nlp_create_qkv_heads.dtype",
        x.dtype in ("float32", "bfloat16", "bfloat8_b"),
        f"Unsupported data format {x.dtype}",
    )
    _fail("nlp_create_qkv_heads.layout", x.tile, "Input tensor layout must be TILE")
    _fail(
        "nlp_create_qkv_heads.shape",
        len(x.shape) == 4 and x.shape[1] == 1,
        f"Unsupported input sequence length {x.shape} is not equal to 1 (shape[1])",
    )
    b, _, s, width = x.shape
    _fail(  # the padded height: always whole tiles once TILE (kept as the C++ states it)
        "nlp_create_qkv_heads.shape",
        x.padded_shape[2] % TILE == 0,
        f"Unsupported input height {x.padded_shape[2]} is not tile aligned",
    )
    groups, padded_width = num_heads + 2 * num_kv_heads, x.padded_shape[-1]
    _fail(
        "nlp_create_qkv_heads.shape",
        width == padded_width and width % groups == 0,
        f"Unsupported input shape: width {width} is not a multiple of {groups} heads",
    )
    hd = width // groups
    q, v = (b, num_heads, s, hd), (b, num_kv_heads, s, hd)
    return q, ((b, num_kv_heads, hd, s) if transpose_k_heads else v), v


# ---- caches ----------------------------------------------------------------------------------
def paged_update_cache(
    chip: ChipSpec,
    cache: TensorInfo,
    x: TensorInfo,
    update_idxs: TensorInfo,
    page_table: TensorInfo,
) -> None:
    """ttnn/cpp/ttnn/operations/experimental/paged_cache/device/update_cache/paged_update_cache_device_operation.cpp
    (every
    message present in 0.81.1): input TILE, fp32/bf16, dim 0 = 1, height-sharded (not width),
    ROW_MAJOR orientation, shard width = last dim, one shard per user ("Input tensor shard grid must
    have num_cores ({}) equal to the number of users / batch ({})"); cache TILE, interleaved, same
    head dim; page table INT32 ROW_MAJOR interleaved with padded_shape[0] == batch and width <=
    cache blocks; update_idxs INT32 ROW_MAJOR DRAM-interleaved with one entry per user. The shard
    grid is a subset of the worker grid, so batch <= cores."""
    rule = "paged_update_cache"
    xp, cp = x.padded_shape, cache.padded_shape
    users = xp[1]
    _fail(rule + ".layout", x.tile and cache.tile, "input and cache must be TILE")
    _fail(
        rule + ".dtype",
        _is(x, ("float32", "bfloat16")),
        f"input {x.dtype}: the decode update takes FLOAT32 or BFLOAT16",
    )
    _fail(
        rule + ".dtype",
        _is(cache, ("float32", "bfloat16", "bfloat8_b", "bfloat4_b")),
        f"cache {cache.dtype}",
    )
    _fail(rule + ".shape", xp[0] == 1, f"dim 0 of the input {xp} must be 1")
    _fail(rule + ".memory", cache.shard is None, "only an interleaved cache is supported")
    _fail(rule + ".shape", xp[-1] == cp[-1] and xp[-1] % TILE == 0, f"head dim {xp[-1]}/{cp[-1]}")
    _fail(rule + ".shape", cp[2] % TILE == 0, f"block size {cp[2]} must be a multiple of 32")
    _fail(
        rule + ".page_table",
        page_table.dtype == "int32" and not page_table.tile and page_table.shard is None,
        f"page table {page_table.dtype}/{page_table.layout} must be INT32 ROW_MAJOR interleaved",
    )
    pp = page_table.padded_shape
    _fail(rule + ".page_table", pp[0] == users, f"page table rows {pp[0]} != batch {users}")
    _fail(rule + ".page_table", pp[1] <= cp[0], f"page table width {pp[1]} > {cp[0]} blocks")
    _fail(
        rule + ".update_idxs",
        update_idxs.dtype == "int32" and not update_idxs.tile,
        f"update_idxs {update_idxs.dtype}/{update_idxs.layout} must be INT32 ROW_MAJOR",
    )
    _fail(
        rule + ".update_idxs",
        update_idxs.shard is None and update_idxs.buffer == "dram",
        "update_idxs must be DRAM interleaved",
    )
    n_idx = update_idxs.padded_shape[0]
    _fail(rule + ".update_idxs", n_idx == users, f"{n_idx} update_idxs for a batch of {users}")
    shard = x.shard
    _fail(rule + ".shard", shard is not None, "Expect input_tensor to be sharded")
    assert shard is not None
    _fail(rule + ".shard", shard.strategy != "width", "input must not be WIDTH sharded")
    _fail(rule + ".shard", shard.shape[1] == xp[-1], f"shard width {shard.shape[1]} != {xp[-1]}")
    height = math.prod(xp) // xp[-1]
    _fail(rule + ".shard", height % shard.shape[0] == 0, f"height {height} % {shard.shape[0]}")
    _fail(rule + ".shard", shard.orientation == "row_major", "Only ROW_MAJOR sharding")
    _fail(
        rule + ".cores",
        users <= chip.num_cores,
        f"batch {users} needs one core per user; the grid has {chip.num_cores}",
    )
    _fail(
        rule + ".shard",
        shard.num_cores == users,
        f"shard grid of {shard.num_cores} cores for {users} users: one user per core",
    )


def paged_fill_cache(
    cache: TensorInfo, x: TensorInfo, page_table: TensorInfo, batch_idx: int
) -> None:
    """ttnn/cpp/ttnn/operations/experimental/paged_cache/device/fill_cache/paged_fill_cache_device_operation.cpp
    (0.81.1:
    present): cache fp32/bf16/bfp8/bfp4, input dtype == cache dtype (no conversion), input and
    page table interleaved, page table INT32, batch_idx < table rows, equal per-block geometry,
    head dim and block size multiples of 32, input seq_len <= block_size * table width."""
    rule = "paged_fill_cache"
    _fail(
        rule + ".dtype",
        _is(cache, ("float32", "bfloat16", "bfloat8_b", "bfloat4_b")),
        f"cache dtype {cache.dtype}",
    )
    _fail(
        rule + ".dtype",
        x.dtype == cache.dtype,
        f"input {x.dtype} != cache {cache.dtype}: cast prefill K/V to the cache dtype first",
    )
    _fail(rule + ".memory", x.shard is None, "input must be interleaved")
    _fail(
        rule + ".page_table",
        page_table.shard is None and page_table.dtype == "int32",
        f"page table {page_table.dtype} must be INT32 interleaved",
    )
    xp, cp, pp = x.padded_shape, cache.padded_shape, page_table.padded_shape
    _fail(rule + ".page_table", 0 <= batch_idx < pp[0], f"batch_idx {batch_idx} vs {pp[0]} rows")
    _fail(
        rule + ".shape",
        xp[1] * cp[2] * xp[3] == cp[1] * cp[2] * cp[3] and xp[3] % TILE == 0 and cp[2] % TILE == 0,
        f"input [*, {xp[1]} heads, *, {xp[3]}] does not match cache blocks {cp}",
    )
    _fail(
        rule + ".seq_len",
        xp[2] <= cp[2] * pp[1],
        f"input seq_len {xp[2]} > block_size {cp[2]} x table width {pp[1]}",
    )


# ---- SDPA ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SdpaConfig:
    """The fields of ttnn.SDPAProgramConfig the rules read (defaults as in 0.81.1)."""

    grid: tuple[int, int]
    q_chunk_size: int
    k_chunk_size: int
    exp_approx_mode: bool | None = None
    max_cores_per_head_batch: int = 16


@dataclass(frozen=True)
class SdpaDecodePlan:
    """How sdpa_decode_program_factory.cpp lays out a paged decode call."""

    batch: int
    cores_available: int
    cores_per_head: int
    heads_per_core: int
    tree_reduction_rounds: int
    exp_approx_mode: bool
    program_config: bool  # False: device grid, cores/(B*nkv) per head, exp_approx_mode True


def paged_sdpa_decode(
    chip: ChipSpec,
    q: TensorInfo,
    k: TensorInfo,
    v: TensorInfo,
    page_table: TensorInfo,
    cur_pos: TensorInfo,
    config: SdpaConfig | None,
    *,
    require_program_config: bool = False,
) -> SdpaDecodePlan:
    """ttnn/cpp/ttnn/operations/transformer/sdpa_decode/device/sdpa_decode_device_operation.cpp (validate) and
    sdpa_decode_program_factory.cpp (core allocation); every message present in 0.81.1.
    B = page_table.padded_shape[0]; ``TT_FATAL(num_cores_available >= B)`` where the cores are
    the program config's grid, else the whole device grid; without a config
    max_cores_per_head = all cores (cross-core tree reduction when > 1 core per head) and
    ``exp_approx_mode`` defaults to true. ``require_program_config`` makes a missing config an
    error (rule ``paged_sdpa_decode.program_config``), for callers that require one."""
    rule = "paged_sdpa_decode"
    for name, t in (("Q", q), ("K", k), ("V", v)):
        _fail(rule + ".dtype", _is(t, ATTENTION_DTYPES), f"{name} {t.dtype}: bf16/bfp8/bfp4 only")
    _fail(rule + ".layout", k.tile and v.tile, "K and V must be TILE")
    _fail(
        rule + ".memory",
        (q.shard is None and q.buffer == "dram")
        or (q.shard is not None and q.shard.strategy == "height"),
        "Q must be DRAM interleaved or height sharded",
    )
    _fail(rule + ".memory", k.buffer == "dram" and v.buffer == "dram", "K/V must be in DRAM")
    b = page_table.padded_shape[0]
    _fail(
        rule + ".cur_pos",
        cur_pos.dtype == "int32" and not cur_pos.tile,
        f"cur_pos {cur_pos.dtype}/{cur_pos.layout} must be INT32 ROW_MAJOR",
    )
    _fail(rule + ".cur_pos", cur_pos.padded_shape[-1] == b, f"cur_pos {cur_pos.shape} vs B={b}")
    _fail(
        rule + ".page_table",
        page_table.dtype == "int32" and not page_table.tile and page_table.shard is None,
        "page table must be INT32 ROW_MAJOR (interleaved)",
    )
    qp, kp, vp = q.padded_shape, k.padded_shape, v.padded_shape
    _fail(rule + ".shape", kp[2] == vp[2], "K and V must have the same block size")
    _fail(rule + ".shape", kp[3] == vp[3] == qp[3], f"head dims Q {qp[3]} K {kp[3]} V {vp[3]}")
    _fail(rule + ".shape", kp[1] == vp[1], "K and V must have the same number of heads")
    if config is not None:
        _fail(rule + ".chunk", config.k_chunk_size % 32 == 0, f"k_chunk {config.k_chunk_size}")
    nkv = kp[1]
    if nkv > 1:  # GQA
        _fail(rule + ".dtype", q.dtype == "bfloat16", f"GQA expects a BFLOAT16 Q, got {q.dtype}")
        _fail(rule + ".shape", q.shape[2] % nkv == 0, f"{q.shape[2]} q heads % {nkv} kv heads")
    grid = config.grid if config is not None else (chip.grid_x, chip.grid_y)
    avail = grid[0] * grid[1]
    _fail(rule + ".cores", avail <= chip.num_cores, f"config grid {grid} > device grid")
    _fail(
        rule + ".cores",
        avail >= b,
        f"Cores available ({avail}) must be >= batch size ({b}): the decode batch needs one core "
        f"per user on the {grid[0]}x{grid[1]} grid; lower max_batch to <= {avail}",
    )
    per_head_cap = config.max_cores_per_head_batch if config is not None else avail
    per_batch = min(avail, per_head_cap * b * nkv) // b
    cores_per_head = max(1, per_batch // nkv)
    heads_per_core = max(1, math.ceil(nkv / per_batch))
    while nkv % heads_per_core:
        heads_per_core += 1
    rounds = (cores_per_head - 1).bit_length() if cores_per_head > 1 else 0
    _fail(
        rule + ".tree_reduction",
        rounds <= MAX_TREE_REDUCTION_ROUNDS,
        f"{cores_per_head} cores per head need {rounds} tree-reduction rounds, at most "
        f"{MAX_TREE_REDUCTION_ROUNDS} ({1 << MAX_TREE_REDUCTION_ROUNDS} cores/head): pass a "
        "program config with a smaller grid or max_cores_per_head_batch",
    )
    exp_approx = True
    if config is not None and config.exp_approx_mode is not None:
        exp_approx = config.exp_approx_mode
    plan = SdpaDecodePlan(
        b, avail, cores_per_head, heads_per_core, rounds, exp_approx, bool(config)
    )
    if require_program_config and config is None:
        raise DeviceLimitError(
            rule + ".program_config",
            f"no program_config: the whole {grid[0]}x{grid[1]} grid, {cores_per_head} cores per "
            f"(user, kv head) with a cross-core tree reduction, exp_approx_mode=True: pass "
            "SDPAProgramConfig(exp_approx_mode=False, max_cores_per_head_batch=1, k_chunk_size=128)",
        )
    return plan


def chunked_sdpa(
    q: TensorInfo,
    k: TensorInfo,
    v: TensorInfo,
    page_table: TensorInfo,
    chunk_start: TensorInfo | None,
    config: SdpaConfig | None,
) -> None:
    """ttnn/cpp/ttnn/operations/transformer/sdpa/device/sdpa_device_operation.cpp, validate_chunked_mode
    (0.81.1: present):
    Q/K/V TILE, bf16/bfp8/bfp4, interleaved, no padding on batch/heads/head_dim; the start tensor
    INT32 of shape [1]; page table INT32 ROW_MAJOR with Q's batch; K/V same block size, heads
    and head dim; q heads a multiple of kv heads; chunk sizes multiples of 32; kv_length (table
    width x block) >= Sq. The start itself is checked by :func:`chunked_sdpa_start`."""
    rule = "chunked_scaled_dot_product_attention"
    for name, t in (("Q", q), ("K", k), ("V", v)):
        _fail(rule + ".layout", t.tile and t.shard is None, f"{name} must be interleaved TILE")
        _fail(rule + ".dtype", _is(t, ATTENTION_DTYPES), f"{name} {t.dtype}: bf16/bfp8/bfp4 only")
        _fail(rule + ".shape", t.shape[3] % TILE == 0, f"{name} head dim {t.shape[3]} is padded")
    if chunk_start is not None:
        _fail(
            rule + ".chunk_start",
            chunk_start.dtype == "int32" and chunk_start.shape == (1,),
            f"chunk_start_idx tensor {chunk_start.dtype} {chunk_start.shape} must be int32 [1]",
        )
    _fail(
        rule + ".page_table",
        page_table.dtype == "int32" and not page_table.tile,
        "Page table must be int32 row major",
    )
    _fail(rule + ".page_table", page_table.shape[0] == q.shape[0], "page table batch != Q batch")
    # sdpa_program_factory.cpp:165 (0.81.1): TT_FATAL(p.page_table_stick_size % 32 == 0, "page
    # table stick size must be a multiple of 32"): a row of int32 block ids, 8 entries at a time
    # (found by tt-metal on a mock P150 with a 12-block pool; the virtual device lacked it)
    _fail(
        rule + ".page_table",
        page_table.shape[-1] * 4 % 32 == 0,
        f"page table stick size must be a multiple of 32: a row of {page_table.shape[-1]} int32 "
        "block ids is not (pad the table to a multiple of 8 entries)",
    )
    _fail(
        rule + ".shape",
        k.shape[1:] == v.shape[1:] and q.shape[3] == k.shape[3],
        f"K {k.shape} / V {v.shape} / Q {q.shape}",
    )
    _fail(
        rule + ".shape",
        q.shape[1] >= k.shape[1] and q.shape[1] % k.shape[1] == 0,
        f"{q.shape[1]} q heads vs {k.shape[1]} kv heads",
    )
    if config is not None:
        _fail(
            rule + ".chunk",
            config.q_chunk_size % TILE == 0 and config.k_chunk_size % TILE == 0,
            f"q/k chunk {config.q_chunk_size}/{config.k_chunk_size} must be multiples of 32",
        )
    kv_len = page_table.shape[1] * k.shape[2]
    _fail(rule + ".kv_length", kv_len >= q.shape[2], f"kv length {kv_len} < Sq {q.shape[2]}")


def chunked_sdpa_start(start: int, q_chunk: int, k_chunk: int) -> None:
    """ "chunk_start_idx must be a multiple of q_chunk_size" / "... of k_chunk_size" (issue
    #35225; 0.81.1: present). tt-metal checks it on the scalar path only: with
    ``chunk_start_idx_tensor`` the value is read on the device and a misaligned start silently
    mis-indexes, so the virtual device checks the value at run time."""
    _fail(
        "chunked_scaled_dot_product_attention.chunk_start",
        start >= 0 and start % q_chunk == 0 and start % k_chunk == 0,
        f"chunk start {start} must be a multiple of q_chunk {q_chunk} and k_chunk {k_chunk}: "
        "align prefill chunks to both",
    )
