"""The device rules tt-metal enforces on the ops the backend calls (pure Python: no ttnn, no numpy).

Each function mirrors the host-side validation of one device operation (``TT_FATAL`` in its
``validate_on_program_cache_miss`` or program factory) and raises :class:`DeviceLimitError`
with a dotted rule name (``<op>.<check>``) and a message that names the limit, the numbers and
what to change. The source is cited next to each check: paths are in ``tenstorrent/tt-metal``
(a bare file name is a file under the op's folder), read at recent commits. For ttnn 0.81.1
(the pinned wheel) a check was confirmed when its message string is present in the wheel's
``_ttnncpp.so`` / ``libtt_metal.so`` (noted "0.81.1: present"); where the wheel differs from
the sources, it says so. Limits that are modelled rather than read (DRAM banks, the size of a
captured trace) say how.

Tensors are described by :class:`TensorInfo` (logical shape, dtype, layout, placement); the
virtual device (``tt_serve/model/tt/virtual/``) builds one per operand and calls these rules on
every op, allocation and trace capture.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tt_serve.model.tt.boards import ChipSpec

TILE = 32
# bytes of one 32x32 tile (tt::tile_size): block floats share one exponent per 16 values.
TILE_BYTES = {
    "float32": 4096,
    "bfloat16": 2048,
    "bfloat8_b": 1088,  # 1024 mantissa bytes + 64 shared exponents
    "bfloat4_b": 576,  # 512 + 64
    "uint32": 4096,
    "int32": 4096,
    "uint16": 2048,
}
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "uint32": 4, "int32": 4, "uint16": 2}
ATTENTION_DTYPES = ("bfloat16", "bfloat8_b", "bfloat4_b")
# sdpa_flash_decode.cpp / writer_decode_all.cpp: #define MAX_TREE_REDUCTION_ROUNDS 6 (64 cores/head)
MAX_TREE_REDUCTION_ROUNDS = 6


class DeviceLimitError(ValueError):
    """A call tt-metal would reject (TT_FATAL) on the modelled chip."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


@dataclass(frozen=True)
class Shard:
    """A sharded memory config: ``num_cores`` shards of ``shape`` (height, width) elements."""

    num_cores: int
    shape: tuple[int, int]
    strategy: str = "height"  # "height" | "width" | "block"
    orientation: str = "row_major"


@dataclass(frozen=True)
class TensorInfo:
    """What a rule needs of an operand: logical shape, dtype name, layout ("tile" or
    "row_major"), buffer ("dram" or "l1") and the shard spec when sharded."""

    shape: tuple[int, ...]
    dtype: str
    layout: str
    buffer: str = "dram"
    shard: Shard | None = None

    @property
    def tile(self) -> bool:
        return self.layout == "tile"

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """TILE pads the last two dims to 32 (ttnn padded_shape); ROW_MAJOR is unpadded."""
        s = list(self.shape)
        if self.tile:
            for i in (-1, -2):
                if len(s) >= -i:
                    s[i] = round_up(s[i], TILE)
        return tuple(s)

    @property
    def pages(self) -> int:
        """Interleaved pages: one tile each (TILE; rank < 2 pads to one tile row) or one row
        each (ROW_MAJOR)."""
        p = self.padded_shape
        if self.tile:
            width = p[-1] if p else TILE
            height = p[-2] if len(p) >= 2 else TILE
            return math.prod(p[:-2]) * (height // TILE) * (width // TILE)
        return math.prod(p[:-1]) if len(p) > 1 else 1

    @property
    def page_bytes(self) -> int:
        if self.tile:
            return TILE_BYTES[self.dtype]
        if self.dtype not in ELEMENT_BYTES:
            raise DeviceLimitError("layout.block_float", f"{self.dtype} exists only in TILE layout")
        return (self.shape[-1] if self.shape else 1) * ELEMENT_BYTES[self.dtype]


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _fail(rule: str, ok: bool, message: str) -> None:
    if not ok:
        raise DeviceLimitError(rule, message)


def _is(t: TensorInfo, dtypes: Sequence[str]) -> bool:
    return t.dtype in dtypes


# ---- core grid -------------------------------------------------------------------------------
def num_cores_to_corerangeset(chip: ChipSpec, n: int) -> None:
    """tt_metal work_split (num_cores_to_corerangeset): "Target number of cores {} is greater than
    total number of available cores {}" (0.81.1: present)."""
    _fail(
        "cores.corerangeset",
        0 < n <= chip.num_cores,
        f"{n} cores requested from a {chip.grid_x}x{chip.grid_y} = {chip.num_cores}-core grid "
        "(one decode user per core for the height-sharded KV update): lower max_batch to "
        f"<= {chip.num_cores} or split the batch",
    )


def op_cores(chip: ChipSpec, output_tiles: int) -> int:
    """Cores a generic op runs on: split_work_to_cores over its output tiles, capped by the grid
    (the trace-size estimate's per-core term)."""
    return max(1, min(chip.num_cores, output_tiles))


# ---- matmul and data movement -----------------------------------------------------------------
MATMUL_DTYPES = ("bfloat16", "bfloat8_b", "bfloat4_b", "float32")


def matmul(a: TensorInfo, b: TensorInfo) -> tuple[int, ...]:
    """ttnn/cpp/ttnn/operations/matmul/device/matmul_device_operation.cpp
    validate_on_program_cache_miss (every message
    present in 0.81.1), with ``program_config`` None (the backend never passes one): both
    operands TILE ("Inputs to matmul must be tilized") and float (the 0.81.1 docstring: BFLOAT8_B,
    BFLOAT4_B, BFLOAT16, FLOAT32); B rank >= 2; "The width of the first tensor must be equal to
    the height of the second tensor". Batch dims (all but the last two):

    * B's batch is 1 (get_broadcast_batch: ``bcast_batch = batch_size(b) == 1`` without a program
      config): B is reused for every batch of A, "BCMK*11KN=BCMN"; the output takes A's batch
      dims. The fake refuses rank(A) < rank(B) here rather than guess the output's rank.
    * otherwise "Batched (non-bcast) matmul requires inputs of the same rank" and "bmm (non-bcast
      matmul) expects input tensors of shapes BCMK*BCKN=BCMN or batch dimension {} mismatch": every
      batch dim equal. The one exception (A's batch 1 reused across B's batches) holds only for
      the 1D-multicast program config with mcast_in0=false, which ttnn picks by itself when no
      config is given; the virtual device does not model that choice and refuses it.

    Returns the output shape."""
    rule = "matmul"
    _fail(rule + ".layout", a.tile and b.tile, "Inputs to matmul must be tilized (TILE)")
    _fail(
        rule + ".dtype",
        _is(a, MATMUL_DTYPES) and _is(b, MATMUL_DTYPES),
        f"operands {a.dtype}/{b.dtype}: matmul takes bf16, bfp8, bfp4 or fp32",
    )
    _fail(rule + ".shape", len(b.shape) >= 2, f"Matmul expects input B rank >= 2, got {b.shape}")
    _fail(
        rule + ".shape",
        len(a.shape) >= 1 and a.shape[-1] == b.shape[-2],
        f"The width of the first tensor must be equal to the height of the second tensor: "
        f"{a.shape} @ {b.shape}",
    )
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    if math.prod(batch_b) == 1:
        _fail(
            rule + ".batch",
            len(a.shape) >= len(b.shape),
            f"batch-broadcast matmul {a.shape} @ {b.shape}: the output takes A's batch dims, so "
            "give A at least B's rank",
        )
        return (*a.shape[:-1], b.shape[-1])
    _fail(
        rule + ".batch",
        len(a.shape) == len(b.shape),
        f"Batched (non-bcast) matmul requires inputs of the same rank: {a.shape} @ {b.shape}",
    )
    _fail(
        rule + ".batch",
        batch_a == batch_b,
        f"bmm (non-bcast matmul) expects input tensors of shapes BCMK*BCKN=BCMN: batch dims "
        f"{batch_a} vs {batch_b}; broadcast A's batch only with a pinned 1D-multicast program "
        "config (not modelled), or give B batch 1",
    )
    return (*a.shape[:-1], b.shape[-1])


def permute(x: TensorInfo, dims: Sequence[int]) -> tuple[int, ...]:
    """ttnn/cpp/ttnn/operations/data_movement/permute/device/permute_device_operation.cpp:
    "Permute dimensions must match
    input tensor rank" (0.81.1: present); ``dims`` a permutation of 0..rank-1 (negative dims
    normalised). TILE inputs take the tiled program factories (MultiCoreTileInvariant,
    MultiCoreTileRowInvariant, MultiCoreTiledGeneric, all in 0.81.1), so any permutation of a
    TILE tensor is legal. Returns the output shape."""
    rank = len(x.shape)
    _fail(
        "permute.rank",
        len(dims) == rank,
        f"Permute dimensions must match input tensor rank: {list(dims)} for {x.shape}",
    )
    norm = [d % rank for d in dims] if rank else []
    _fail("permute.dims", sorted(norm) == list(range(rank)), f"{list(dims)} is no permutation")
    return tuple(x.shape[d] for d in norm)


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


# ---- Gated DeltaNet ----------------------------------------------------------------------------
def fused_recurrent_gated_delta_rule(
    chip: ChipSpec, q: TensorInfo, v: TensorInfo, initial_state: TensorInfo | None
) -> None:
    """transformer/fused_recurrent_gated_delta_rule/device/
    fused_recurrent_gated_delta_rule_program_factory.cpp: one Tensix core per (batch, value head),
    ``TT_FATAL(BH <= grid.x * grid_y, "num_heads {} exceeds compute cores {}")`` (0.81.1: present;
    the 0.81.1 docstring: "one Tensix core per head"). The device op wants key/value dims that are
    non-zero multiples of 32 and a state [B, HV, K, V]."""
    b, hv, k, vd = q.shape[0], v.shape[2], q.shape[3], v.shape[3]
    bh = b * hv
    _fail(
        "fused_recurrent_gated_delta_rule.cores",
        bh <= chip.num_cores,
        f"B*HV = {b}*{hv} = {bh} heads need one core each; the {chip.arch} grid has "
        f"{chip.grid_x}x{chip.grid_y} = {chip.num_cores} (TT_FATAL 'num_heads {bh} exceeds compute "
        f"cores {chip.num_cores}'): run the decode batch in groups of <= {chip.num_cores // hv} rows",
    )
    _fail(
        "fused_recurrent_gated_delta_rule.shape",
        k % TILE == 0 and vd % TILE == 0 and k > 0 and vd > 0,
        f"key_dim {k} and val_dim {vd} must be non-zero multiples of {TILE}",
    )
    if initial_state is not None:
        _fail(
            "fused_recurrent_gated_delta_rule.shape",
            initial_state.shape == (b, hv, k, vd),
            f"initial_state {initial_state.shape} must be [B, HV, K, V] = {(b, hv, k, vd)}",
        )


def chunk_gated_delta_rule(
    chip: ChipSpec,
    qkv: Sequence[TensorInfo],
    g: TensorInfo,
    beta: TensorInfo,
    initial_state: TensorInfo | None,
    chunk_size: int,
    consts: Sequence[TensorInfo],
) -> None:
    """transformer/chunk_gated_delta_rule (0.81.1 docstring and device ops): every input TILE ("a
    ROW_MAJOR input fails the device op's validation"); chunk_size 32 or 64 ("chunk_gdn:
    chunk_size must be 32 or 64"); the rank-3 flat path needs K == V, chunk 32 and T a multiple of
    32; g/beta [B, T, HV] ("chunk_gdn: {} must be [B, T, HV]"); constant tiles fp32 TILE. Cores: the
    fused path needs BH*(NV+NP) cores and otherwise falls back to the phased path, whose scan runs
    one core per head: chunk_gdn_phased_program_factory.cpp distribute_scan
    ``TT_FATAL(BH <= ncores, "num_heads {} exceeds compute cores {}")`` (0.81.1: present)."""
    q, v = qkv[0], qkv[2]
    for t in (*qkv, g, beta, *([initial_state] if initial_state else []), *consts):
        _fail("chunk_gated_delta_rule.layout", t.tile, f"operand {t.shape} must be TILE")
    for t in consts:
        _fail("chunk_gated_delta_rule.dtype", t.dtype == "float32", "eye/tril/ones/masks fp32")
    _fail("chunk_gated_delta_rule.chunk", chunk_size in (32, 64), f"chunk_size {chunk_size}")
    b, t_len, hv = g.shape[0], g.shape[1], g.shape[-1]
    _fail(
        "chunk_gated_delta_rule.shape",
        len(g.shape) == 3 and beta.shape == g.shape and q.shape[:2] == (b, t_len),
        f"g {g.shape} and beta {beta.shape} must be [B, T, HV] with q's B, T {q.shape[:2]}",
    )
    if len(q.shape) == 3:
        dv = initial_state.shape[3] if initial_state else v.shape[2] // hv
        dk = initial_state.shape[2] if initial_state else dv
        _fail(
            "chunk_gated_delta_rule.flat",
            chunk_size == 32 and t_len % 32 == 0 and dk == dv,
            f"the rank-3 flat path needs chunk_size 32 (got {chunk_size}), T % 32 == 0 (T = "
            f"{t_len}) and K == V (K = {dk}, V = {dv})",
        )
    if initial_state is not None:
        _fail(
            "chunk_gated_delta_rule.shape",
            initial_state.shape[:2] == (b, hv),
            f"initial_state {initial_state.shape} must be [B, HV, K, V] with B={b}, HV={hv}",
        )
    _fail(
        "chunk_gated_delta_rule.cores",
        b * hv <= chip.num_cores,
        f"B*HV = {b}*{hv} = {b * hv} scan heads need one core each; the grid has "
        f"{chip.num_cores}: prefill fewer rows per call",
    )


# ---- caches ----------------------------------------------------------------------------------
def fill_cache(cache: TensorInfo, x: TensorInfo, batch_idx: int, update_idx: int = 0) -> None:
    """ttnn/cpp/ttnn/operations/kv_cache/device/update_cache_device_operation.cpp, FILL branch (all present
    in 0.81.1):
    TILE operands, dtypes fp32/bf16/bfp8 and equal, equal padded width and dim 1, input dim 0 = 1,
    interleaved cache, batch_idx < cache rows, update_idx % 32 == 0 and input height <= cache
    height - update_idx.

    No limit on work blocks: older tt-metal (UpdateCache::validate) required
    ``padded[1] * padded[-2] / 32 <= grid``, but that message is not in the 0.81.1 wheel, whose
    fill writer (writer_fill_cache_interleaved_start_id.cpp) walks several blocks per core, and
    0.81.1 on a mock P150 ran fill_cache / update_cache with 128 and 256 work blocks."""
    rule = "fill_cache"
    _fail(rule + ".layout", x.tile and cache.tile, "Inputs to update_cache must be tilized")
    fill = ("float32", "bfloat16", "bfloat8_b")
    _fail(rule + ".dtype", _is(x, fill) and _is(cache, fill), f"{x.dtype}/{cache.dtype}")
    _fail(
        rule + ".dtype",
        x.dtype == cache.dtype,
        f"input {x.dtype} != cache {cache.dtype} (fill does not convert): cast first",
    )
    xp, cp = x.padded_shape, cache.padded_shape
    _fail(rule + ".shape", xp[-1] == cp[-1], f"input width {xp[-1]} != cache width {cp[-1]}")
    _fail(rule + ".shape", xp[0] == 1, f"input batch {xp[0]} must be 1")
    _fail(rule + ".shape", xp[1] == cp[1], f"input dim 1 {xp[1]} != cache dim 1 {cp[1]}")
    _fail(rule + ".memory", cache.shard is None, "the cache must be interleaved")
    _fail(rule + ".row", 0 <= batch_idx < cp[0], f"batch_idx {batch_idx} outside 0..{cp[0] - 1}")
    _fail(
        rule + ".row",
        update_idx % TILE == 0 and xp[-2] <= cp[-2] - update_idx,
        f"update_idx {update_idx} (multiple of 32) + input height {xp[-2]} must fit the "
        f"cache height {cp[-2]}",
    )


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


# ---- attention -------------------------------------------------------------------------------
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


# ---- sampling --------------------------------------------------------------------------------
# topk's single-core path (topk_utils.cpp verify_single_core_cost): CB tiles per value/index pair.
TOPK_INPUT_CB_TILES = 4
TOPK_TRANSPOSED_CB_TILES = 4
# Widths of 32-bit index outputs (0.81.1 docstring): padded width above 65535, or a float32 input.
TOPK_UINT16_MAX = 65535
INDEX_DTYPES = ("uint16", "uint32", "int32")


def topk(
    x: TensorInfo,
    k: int,
    dim: int,
    *,
    indices: TensorInfo | None = None,
    stable: bool = False,
    l1_bytes: int | None = None,
) -> str:
    """ttnn/cpp/ttnn/operations/reduction/topk/device/topk_device_operation.cpp (0.81.1 messages present):
    TILE input,
    k != 0, reduction on the last dim, and "Input height (combined input_shape[0-3]) {} must be a
    multiple of 32" on the PADDED 4-D shape (the docstring: "All shape validations are performed
    on padded shapes"), so a TILE input always passes it: a [1, 16, E] decode routing passes.
    dtypes per the 0.81.1 docstring: BFLOAT8, BFLOAT16, FLOAT32.
    ttnn/cpp/ttnn/operations/reduction/topk/topk.cpp: "K
    cannot be larger than the dimension size" (logical); narrower inputs than
    ``min_dim_per_core`` (64) are padded with -inf by the wrapper, so they pass.

    The index output (compute_output_specs): UINT16 while the padded width fits 16 bits
    (``input_shape[dim] < 65536``), else UINT32; the 0.81.1 docstring adds that a float32 input
    needs 32-bit indices. ``indices`` (the 0.81.1 ``indices_tensor``: labels returned instead of
    positions) must have the input's logical shape, TILE, UINT16/UINT32/INT32, 32 bits when
    32-bit indices are required, and cannot be combined with ``stable``; a 32-bit one makes the
    output its dtype. ``l1_bytes``: the single-core program's circular buffers
    (topk_utils.cpp verify_single_core_cost: 4 input, 4 transposed, 2·Kt result-prep and Kt
    output tiles, each a value + index pair) must fit one core's L1, "Not enough cores or cache
    size available to run topk operation" (the multi-core path needs k <= 64, where the single
    core always fits, so this is the bound for any k). Returns the index output's dtype."""
    rule = "topk"
    _fail(rule + ".layout", x.tile, "The input must be in tiled format")
    _fail(rule + ".dtype", _is(x, ("bfloat16", "bfloat8_b", "float32")), f"{x.dtype}")
    _fail(rule + ".k", k > 0, "K must be non-zero")
    _fail(rule + ".dim", dim in (-1, len(x.shape) - 1), f"dim {dim}: last dim only")
    _fail(
        rule + ".k",
        k <= x.shape[-1],
        f"K cannot be larger than the dimension size! K={k}, dimension size={x.shape[-1]}",
    )
    # "N*C*H must be a multiple of 32" (padded) is not checked: a TILE tensor's padded height
    # is whole tiles (rank 1 pads to [32, W]: TensorLayout::compute_padded_shape), so it holds.
    wide = x.padded_shape[-1] > TOPK_UINT16_MAX or x.dtype == "float32"
    out = "uint32" if wide else "uint16"
    if indices is not None:
        _fail(
            rule + ".indices",
            indices.shape == x.shape and indices.tile and indices.dtype in INDEX_DTYPES,
            f"indices_tensor {indices.shape}/{indices.dtype}/{indices.layout} must be TILE "
            f"UINT16, UINT32 or INT32 of the input's shape {x.shape}",
        )
        _fail(
            rule + ".indices",
            not (wide and indices.dtype == "uint16"),
            f"a UINT16 indices_tensor for a {x.dtype} input of width {x.shape[-1]}: 32-bit "
            "indices are required",
        )
        _fail(rule + ".stable", not stable, "stable=True cannot be combined with indices_tensor")
        out = indices.dtype if indices.dtype != "uint16" else out
    if l1_bytes is not None:
        k_tiles = -(-k // TILE)
        index_bytes, value_bytes = TILE_BYTES[out], TILE_BYTES[x.dtype]
        compute_bytes = TILE_BYTES["bfloat16"] if x.dtype == "bfloat8_b" else value_bytes
        cost = (
            TOPK_INPUT_CB_TILES * (value_bytes + index_bytes)
            + (TOPK_TRANSPOSED_CB_TILES + 2 * k_tiles) * (compute_bytes + index_bytes)
            + k_tiles * (value_bytes + index_bytes)
        )
        _fail(
            rule + ".l1",
            cost < l1_bytes,
            f"k={k}: the single-core topk needs {cost} B of L1 circular buffers, a core has "
            f"{l1_bytes}: Not enough cores or cache size available to run topk operation",
        )
    return out


# binary_ng broadcasts up to rank 5 (binary_ng_device_operation.cpp).
BINARY_BROADCAST_RANK = 5


def binary(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """ttnn/cpp/ttnn/operations/eltwise/binary_ng/device/binary_ng_device_operation.cpp (0.81.1: present):
    dims aligned
    from the right must be equal or 1, "Broadcasting rule violation for rank {}, dim a: {}, dim
    b: {}"; beyond rank 5 they must be equal. A 1 in either of the last two dims is a subtile
    broadcast (row, column, scalar, or row of one and column of the other: ROW_A_COL_B /
    ROW_B_COL_A, get_subtile_broadcast_type). Returns the output shape."""
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(pa, pb, strict=True)):
        rank = i - n
        ok = x == y or ((x == 1 or y == 1) and rank > -BINARY_BROADCAST_RANK - 1)
        _fail(
            "binary.broadcast",
            ok,
            f"Broadcasting rule violation for rank {rank}, dim a: {x}, dim b: {y} ({a} vs {b})",
        )
        out.append(max(x, y))
    return tuple(out)


def argmax(x: TensorInfo, dim: int | None) -> str:
    """The 0.81.1 ``ttnn.argmax`` docstring: interleaved input only; dim=None needs ROW_MAJOR;
    last dim: ROW_MAJOR is multi-core (bf16/fp32/int32/uint32/uint16), TILE single-core
    (bf16/fp32); other dims bf16/fp32. Returns "multi_core" or "single_core"."""
    rule = "argmax"
    _fail(rule + ".memory", x.shard is None, "sharded input is not supported")
    last = dim is not None and dim in (-1, len(x.shape) - 1)
    if dim is None:
        _fail(rule + ".layout", not x.tile, "dim=None needs ROW_MAJOR input")
        return "single_core"
    if last and not x.tile:
        _fail(rule + ".dtype", x.dtype in ELEMENT_BYTES, f"{x.dtype}")
        return "multi_core"
    _fail(rule + ".dtype", _is(x, ("bfloat16", "float32")), f"{x.dtype} on this path")
    return "single_core"


# ---- collectives (CCL) on a 1 x N mesh ----------------------------------------------------------
# Buffer alignment of a DRAM page per arch (LOG_BASE_2_OF_DRAM_ALIGNMENT, memory.DRAM_BANKS).
CCL_DRAM_ALIGNMENT = {"wormhole_b0": 32, "blackhole": 64}
# Semaphores each experimental CCL program takes (besides the barrier semaphore).
ALL_GATHER_SEMAPHORES = 2
REDUCE_SCATTER_SEMAPHORES = 3


def _ccl_common(
    rule: str, chip: ChipSpec, x: TensorInfo, ring: int, num_links: int, max_links: int
) -> None:
    """What every experimental CCL checks before its program is built (the device-operation
    files cited by the callers): more than one device on the line, 0 < num_links (and the links
    a program uses are parallelised over worker rows: ``num_links <= grid.y``), aligned pages.
    ``max_links``: the Ethernet links the system has between neighbours
    (models/tt_transformers/tt/ccl.py get_num_links: N300/T3K 1, P150x4 2, Galaxy 4/3)."""
    _fail(rule + ".devices", ring > 1, f"needs more than one device on the line, got {ring}")
    _fail(rule + ".num_links", num_links > 0, f"num_links should be more than 0, got {num_links}")
    _fail(
        rule + ".num_links",
        num_links <= chip.grid_y and (max_links == 0 or num_links <= max_links),
        f"num_links {num_links} exceeds the {max_links} link(s) between neighbours or the "
        f"{chip.grid_y} worker rows",
    )
    align = CCL_DRAM_ALIGNMENT.get(chip.arch, 32)
    _fail(
        rule + ".page_alignment",
        x.tile or x.page_bytes % align == 0,
        f"a {x.page_bytes} B row-major page is not {align}-B aligned ('currently requires aligned "
        "pages')",
    )


def all_gather_async(
    chip: ChipSpec,
    x: TensorInfo,
    dim: int,
    ring: int,
    num_semaphores: int,
    num_links: int,
    max_links: int,
    *,
    capturing: bool,
) -> tuple[int, ...]:
    """ttnn/cpp/ttnn/operations/experimental/ccl/all_gather_async/device/all_gather_async_device_operation.cpp:
    "Default
    implementation requires 2 semaphores", "AllGatherAsync requires tensor of rank 2 or
    greater", "all_gather_async op will only work for num_devices > 1", "All Gather currently
    requires aligned pages", num_links > 0 and <= grid.y. Under trace capture the gather dim
    must not be a tile-padded one (or the input ROW_MAJOR): those take the composite path
    through all_broadcast, whose internal semaphores a replay can overwrite (tt-metal #40382 /
    PR #40276; notes/ttnn-mesh.md 3.8). Returns the output shape (``dim`` times ``ring``)."""
    rule = "all_gather_async"
    _fail(
        rule + ".semaphores",
        num_semaphores == ALL_GATHER_SEMAPHORES,
        f"Default implementation requires {ALL_GATHER_SEMAPHORES} semaphores, got {num_semaphores}",
    )
    rank = len(x.shape)
    _fail(rule + ".rank", rank >= 2, f"requires tensor of rank 2 or greater, got {x.shape}")
    _fail(rule + ".dim", -rank <= dim < rank, f"dim {dim} for rank {rank}")
    _ccl_common(rule, chip, x, ring, num_links, max_links)
    d = dim % rank
    padded = x.tile and d >= rank - 2 and x.shape[d] % TILE != 0
    _fail(
        rule + ".composite",
        not capturing or (x.tile and not padded),
        f"gathering {x.shape} {x.layout} on dim {dim} takes the composite (all_broadcast) path, "
        "unsafe under trace (tt-metal #40382): gather a tile-aligned dim of a TILE tensor",
    )
    out = list(x.shape)
    out[d] *= ring
    return tuple(out)


def reduce_scatter_minimal_async(
    chip: ChipSpec,
    x: TensorInfo,
    dim: int,
    ring: int,
    num_semaphores: int,
    num_links: int,
    max_links: int,
    topology: str,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ttnn/cpp/ttnn/operations/experimental/ccl/reduce_scatter_minimal_async/device/reduce_scatter_minimal_async_op_device_operation.cpp:
    "reduce_scatter currently supports rank 2 tensors at minimum", the scatter dim (normalised to 4-D) divisible by
    ring_size, in tiles when it is one of the last two ("Number of tiles at dimension {} must
    be divisible by ring_size"), "Expected 3 semaphores"; dtypes BF16/BFP8/F32 (the 0.81.1
    ``ttnn.reduce_scatter`` docstring). Returns (intermediate, output) shapes: the intermediate
    buffer is the padded input with dim 0 doubled on Linear (compute_output_specs), the output
    has ``dim`` divided by ``ring``. Its "Topology must be either Ring or Linear" is not
    modelled: the virtual mesh's ``Topology`` has only those two ("ring", "linear")."""
    rule = "reduce_scatter_minimal_async"
    _fail(
        rule + ".semaphores",
        num_semaphores == REDUCE_SCATTER_SEMAPHORES,
        f"Expected {REDUCE_SCATTER_SEMAPHORES} semaphores but got {num_semaphores}",
    )
    rank = len(x.shape)
    _fail(rule + ".rank", rank > 1, f"supports rank 2 tensors at minimum, got {x.shape}")
    _fail(rule + ".dim", -rank <= dim < rank, f"Invalid scatter dim {dim} for rank {rank}")
    _fail(
        rule + ".dtype",
        _is(x, ("bfloat16", "bfloat8_b", "float32")),
        f"{x.dtype} (BF16, BFP8, F32 only)",
    )
    _ccl_common(rule, chip, x, ring, num_links, max_links)
    d = dim % rank
    padded = x.padded_shape
    if x.tile and d >= rank - 2:
        ok = (padded[d] // TILE) % ring == 0
        msg = (
            f"Number of tiles at dimension {dim} ({padded[d] // TILE}) must be divisible by {ring}"
        )
    else:
        ok = padded[d] % ring == 0
        msg = f"Dimension {dim} ({padded[d]}) must be divisible by ring_size {ring}"
    _fail(rule + ".divisible", ok, msg)
    inter = list(padded)
    if topology == "linear":
        inter[0] *= 2
    out = list(x.shape)
    out[d] //= ring
    return tuple(inter), tuple(out)


# ---- sparse matmul (MoE experts) ---------------------------------------------------------------
SPARSE_MATMUL_DTYPES = ("bfloat16", "bfloat8_b", "bfloat4_b", "float32")


@dataclass(frozen=True)
class Matmul1DConfig:
    """The fields of ttnn.MatmulMultiCoreReuseMultiCast1DProgramConfig the rules read."""

    grid: tuple[int, int]
    in0_block_w: int
    out_subblock_h: int
    out_subblock_w: int
    out_block_h: int
    out_block_w: int
    per_core_M: int  # ttnn's field names
    per_core_N: int
    fuse_batch: bool
    mcast_in0: bool


@dataclass(frozen=True)
class SparseMatmulPlan:
    """What one sparse_matmul call computes: its output shape, the sparsity entries it scans
    (``batches``) and, per computed (non-zero) entry, the bytes it reads of A and of B (one
    [M, K] block of A, one [K, N] block of B: tile-padded, in the operands' dtypes)."""

    shape: tuple[int, ...]
    batches: int
    a_batch_bytes: int
    b_batch_bytes: int


def sparse_matmul(
    chip: ChipSpec,
    a: TensorInfo,
    b: TensorInfo,
    sparsity: TensorInfo,
    config: Matmul1DConfig | None,
    *,
    nnz: int | None,
    is_input_a_sparse: bool,
    is_input_b_sparse: bool,
) -> SparseMatmulPlan:
    """ttnn/cpp/ttnn/operations/matmul/device/sparse/sparse_matmul_device_operation.cpp
    validate_on_program_cache_miss
    and compute_sparse_matmul_output_shape (every message below present in the 0.81.1 wheel),
    the 0.81.1 ``ttnn.sparse_matmul`` docstring and
    ttnn/cpp/ttnn/operations/matmul/device/sparse/factory/sparse_matmul_multicore_reuse_mcast_1d_optimized.cpp:

    * the program config is a MatmulMultiCoreReuseMultiCast1DProgramConfig with mcast_in0=True
      ("Only this config type is supported", "Only mcast_in0 is supported for sparse matmul"),
      its grid inside the device grid; out_block_w % out_subblock_w, out_block_h %
      out_subblock_h, per_core_M % out_block_h, per_core_N % out_block_w (otherwise "the
      mcast_in0 kernel deadlocks"), and enough cores for the output blocks;
    * A and B TILE, floating point (BFLOAT4_B, BFLOAT8_B, BFLOAT16, FLOAT32), rank 4 ("The two
      input tensors must be be tiled and each have a rank of 4"); "Dimension K (A.shape[-1] {})
      and B.shape[-2] ({}) must match"; the sparsity tensor BFLOAT16, ROW_MAJOR, rank 4;
      "sparse_matmul requires at least one of is_input_a_sparse or is_input_b_sparse";
    * the docstring's mode table: B is [1, E, K, N]; both sparse: A [1, E, M, K], sparsity
      [1, 1, 1, E], output [1, E, M, N]; A dense: A [A, B, M, K], sparsity [A, B, 1, E], output
      [A, B, 1, E, M, N]; A sparse, B dense: A [A, E, M, K], sparsity [1, 1, A, E], output
      [A, E, M, N]. "sparsity logical_volume ({}) must equal batch_length ({})";
    * "nnz ({}) must be greater than 0" and "<= the length of all batch dimensions". That nnz
      equals count_nonzero(sparsity) cannot be checked here (the values live on the device; a
      mismatch deadlocks it, #45943): the virtual device checks it when the op computes.

    Returns the plan (output shape, entries scanned, bytes read per computed entry)."""
    rule = "sparse_matmul"
    _fail(
        rule + ".program_config",
        config is not None and config.mcast_in0,
        "sparse_matmul takes a MatmulMultiCoreReuseMultiCast1DProgramConfig with mcast_in0=True "
        "(Only mcast_in0 is supported for sparse matmul)",
    )
    assert config is not None
    gx, gy = config.grid
    _fail(
        rule + ".program_config",
        0 < gx <= chip.grid_x and 0 < gy <= chip.grid_y,
        f"program config grid {config.grid} outside the {chip.grid_x}x{chip.grid_y} device grid",
    )
    c = config
    for ok, what in (
        (min(c.out_subblock_w, c.out_subblock_h, c.out_block_w, c.out_block_h) > 0, "non-zero"),
        (c.out_block_w % c.out_subblock_w == 0, "out_block_w % out_subblock_w"),
        (c.out_block_h % c.out_subblock_h == 0, "out_block_h % out_subblock_h"),
        (c.per_core_M % c.out_block_h == 0, "per_core_M % out_block_h"),
        (c.per_core_N % c.out_block_w == 0, "per_core_N % out_block_w"),
        (c.in0_block_w > 0, "in0_block_w > 0"),
    ):
        _fail(rule + ".program_config", ok, f"blocks {c}: {what} (the mcast_in0 kernel hangs)")
    for name, t in (("A", a), ("B", b)):
        _fail(rule + ".layout", t.tile, f"Input tensor {name} must be TILE layout")
        _fail(
            rule + ".dtype",
            _is(t, SPARSE_MATMUL_DTYPES),
            f"Input tensor {name} must be a floating point type, got {t.dtype}",
        )
        _fail(rule + ".rank", len(t.shape) == 4, f"{name} {t.shape} must have rank 4")
    _fail(
        rule + ".sparsity",
        not sparsity.tile and sparsity.dtype == "bfloat16" and len(sparsity.shape) == 4,
        f"Sparsity tensor {sparsity.shape} {sparsity.dtype} {sparsity.layout} must be a rank-4 "
        "BFLOAT16 ROW_MAJOR tensor",
    )
    _fail(
        rule + ".mode",
        is_input_a_sparse or is_input_b_sparse,
        "sparse_matmul requires at least one of is_input_a_sparse or is_input_b_sparse",
    )
    ap, bp = a.padded_shape, b.padded_shape
    _fail(
        rule + ".shape",
        ap[-1] == bp[-2],
        f"Dimension K (A.shape[-1] {ap[-1]}) and B.shape[-2] ({bp[-2]}) must match",
    )
    experts = b.shape[1]
    _fail(rule + ".shape", b.shape[0] == 1, f"B {b.shape} must be [1, E, K, N]")
    m, n = a.shape[-2], b.shape[-1]
    want_a: tuple[int, ...]
    want_s: tuple[int, ...]
    if is_input_a_sparse and is_input_b_sparse:
        want_a, want_s = (1, experts), (1, 1, 1, experts)
        out: tuple[int, ...] = (1, experts, m, n)
    elif is_input_b_sparse:
        want_a, want_s = a.shape[:2], (*a.shape[:2], 1, experts)
        out = (*a.shape[:2], 1, experts, m, n)
    else:
        want_a, want_s = (a.shape[0], experts), (1, 1, a.shape[0], experts)
        out = (a.shape[0], experts, m, n)
    _fail(
        rule + ".shape",
        a.shape[:2] == want_a,
        f"A {a.shape} for B {b.shape} (a_sparse={is_input_a_sparse}, b_sparse="
        f"{is_input_b_sparse}): the mode table wants A's batch {want_a}",
    )
    batches = math.prod(want_s)
    _fail(
        rule + ".sparsity",
        math.prod(sparsity.shape) == batches and sparsity.shape == want_s,
        f"sparsity logical_volume ({math.prod(sparsity.shape)}) must equal batch_length "
        f"({batches}) [sparsity_shape={sparsity.shape}, the mode table: {want_s}]",
    )
    if nnz is not None:
        _fail(rule + ".nnz", nnz > 0, f"nnz ({nnz}) must be greater than 0")
        _fail(
            rule + ".nnz",
            nnz <= batches,
            f"nnz ({nnz}) must be less than or equal to the length of all batch dimensions "
            f"({batches})",
        )
    mt, nt, kt = ap[-2] // TILE, bp[-1] // TILE, ap[-1] // TILE
    _fail(
        rule + ".program_config",
        kt % c.in0_block_w == 0,
        f"Kt ({kt}) must be divisible by in0_block_w ({c.in0_block_w})",
    )
    blocks = -(-mt // c.per_core_M) * -(-nt // c.per_core_N)
    _fail(
        rule + ".cores",
        blocks <= gx * gy,
        f"{blocks} output blocks (Mt {mt} / per_core_M {c.per_core_M} x Nt {nt} / per_core_N "
        f"{c.per_core_N}) need one core each; the config grid has {gx * gy}",
    )
    # sparse_matmul_multicore_reuse_mcast_1d_optimized.cpp:312 (0.81.1): in0 is multicast to
    # every core of the config's grid, so every one must get work: "num_cores_with_work (32)
    # must be equal to in0_mcast_receiver_num_cores (33), please adjust the core grid to make it
    # rectangular" (found by tt-metal on a mock P300: 32 blocks on an 11x3 grid)
    _fail(
        rule + ".cores",
        blocks == gx * gy,
        f"num_cores_with_work ({blocks}) must be equal to in0_mcast_receiver_num_cores "
        f"({gx * gy}), please adjust the core grid to make it rectangular",
    )
    a_bytes = mt * kt * TILE_BYTES[a.dtype]
    b_bytes = kt * nt * TILE_BYTES[b.dtype]
    return SparseMatmulPlan(out, batches, a_bytes, b_bytes)
