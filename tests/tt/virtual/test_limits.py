"""The device rules of ``tt_serve/model/tt/virtual/rules_*.py`` at Qwen3.5-9B dims, on a Wormhole
N150 chip (8x8 = 64 workers, 12 GiB) and a Blackhole P150 (11x10 = 110 workers, 8 x 4 GiB - 16
MiB banks).

Every rule trips with the shapes ``design/reviews/ttnn-backend.md`` names and passes just inside
its limit. Op rules run through the backend's own ``Ops`` wrappers on the contract fake where the
backend calls the op (so the test exercises the call the backend makes), and on plain
``TensorInfo`` descriptions where the fake would have to materialise gigabytes (DRAM).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.tt import harness as h
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.layout import ROW_MAJOR
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.virtual import (
    dram,
    rules_attention,
    rules_eltwise,
    rules_gdn,
    rules_movement,
)
from tt_serve.model.tt.virtual.device import P150, WORMHOLE, VirtualTTNN
from tt_serve.model.tt.virtual.rules_base import DeviceLimitError, Shard, TensorInfo
from tt_serve.model.tt.virtual.tensors import ContractViolation
from tt_serve.model.weights import load_weights

# Qwen3.5-9B (tt-metal models/demos/blackhole/qwen36/README-N300-9B.md; HF text_config)
HIDDEN, VOCAB, INTER, LAYERS = 4096, 248320, 12288, 32
N_GDN, N_ATTN = 24, 8
Q_HEADS, KV_HEADS, HEAD_DIM = 16, 4, 256
K_HEADS, V_HEADS, GDN_DIM, CONV_K = 16, 32, 128, 4
BLOCK = 64
CHIPS = pytest.mark.parametrize("chip", [WORMHOLE, P150], ids=["n150", "p150"])


def _trips(rule: str, fn: Callable[[], object]) -> str:
    with pytest.raises((ContractViolation, DeviceLimitError)) as info:
        fn()
    assert getattr(info.value, "rule", None) == rule, info.value
    return str(info.value)


def _ops(chip: ChipSpec, trace_region: int = 1 << 20, **kw: bool) -> Ops:
    ops = Ops(VirtualTTNN(chip=chip, **kw))
    ops.open_device(0, trace_region_size=trace_region, l1_small_size=0)
    return ops


def T(shape: tuple[int, ...], dtype: str = "bfloat16", layout: str = "tile") -> TensorInfo:
    return TensorInfo(shape, dtype, layout)


def test_fake_models_the_chip_it_is_given() -> None:
    grid = _ops(P150).device.compute_with_storage_grid_size()
    assert (grid.x, grid.y) == (11, 10) and P150.num_cores == 110
    grid = _ops(WORMHOLE).device.compute_with_storage_grid_size()
    assert (grid.x, grid.y) == (8, 8) and WORMHOLE.num_cores == 64


# ---- GDN ---------------------------------------------------------------------------------------
def _recurrent(ops: Ops, batch: int) -> object:
    q = ops.zeros([batch, 1, K_HEADS, GDN_DIM], "float32")
    v = ops.zeros([batch, 1, V_HEADS, GDN_DIM], "float32")
    gate = ops.zeros([batch, 1, V_HEADS], "float32")
    state = ops.zeros([batch, V_HEADS, GDN_DIM, GDN_DIM], "float32")
    return ops.fused_recurrent_gated_delta_rule(q, q, v, gate, gate, state=state, scale=1.0)


@CHIPS
@pytest.mark.parametrize("batch", [16, 32])
def test_decode_gdn_recurrence_over_the_pool_exceeds_the_grid(chip: ChipSpec, batch: int) -> None:
    """Finding 1: the decode step runs the whole state pool, B*HV = 16*32 = 512 (32*32 = 1024)
    heads against 64 / 110 cores."""
    msg = _trips("fused_recurrent_gated_delta_rule.cores", lambda: _recurrent(_ops(chip), batch))
    assert f"{batch * V_HEADS} heads" in msg and f"= {chip.num_cores}" in msg


@CHIPS
def test_decode_gdn_recurrence_fits_at_cores_over_value_heads(chip: ChipSpec) -> None:
    fits = chip.num_cores // V_HEADS  # 2 on Wormhole, 3 on P150
    _recurrent(_ops(chip), fits)
    _trips("fused_recurrent_gated_delta_rule.cores", lambda: _recurrent(_ops(chip), fits + 1))


def _chunk_gdn(chip: ChipSpec, b: int, t: int, chunk: int = 32, dk: int = GDN_DIM) -> None:
    kd = K_HEADS * dk
    rules_gdn.chunk_gated_delta_rule(
        chip,
        [T((b, t, kd)), T((b, t, kd)), T((b, t, V_HEADS * GDN_DIM))],
        T((b, t, V_HEADS), "float32"),
        T((b, t, V_HEADS), "float32"),
        T((b, V_HEADS, dk, GDN_DIM), "float32"),
        chunk,
        [T((1, 1, 32, 32), "float32")] * 3 + [T((1, 1, 32, 96), "float32")],
    )


@CHIPS
def test_chunk_gdn_prefill_rules(chip: ChipSpec) -> None:
    _chunk_gdn(chip, 1, 2048)  # the backend's prefill: one row, 32 heads on 64 / 110 cores
    fits = chip.num_cores // V_HEADS
    _chunk_gdn(chip, fits, 256)
    _trips("chunk_gated_delta_rule.cores", lambda: _chunk_gdn(chip, fits + 1, 256))
    _trips("chunk_gated_delta_rule.flat", lambda: _chunk_gdn(chip, 1, 100))  # T % 32
    _trips("chunk_gated_delta_rule.flat", lambda: _chunk_gdn(chip, 1, 256, chunk=64))
    _trips("chunk_gated_delta_rule.flat", lambda: _chunk_gdn(chip, 1, 256, dk=64))  # K != V
    _trips("chunk_gated_delta_rule.chunk", lambda: _chunk_gdn(chip, 1, 256, chunk=16))


# ---- fill_cache (state rows) ---------------------------------------------------------------------
def _fill_row(chip: ChipSpec, heads: int) -> None:
    ops = _ops(chip)
    pool = ops.zeros([3, heads, GDN_DIM, GDN_DIM], "float32")
    ops.fill_row(pool, ops.zeros([1, heads, GDN_DIM, GDN_DIM], "float32"), 2)


@CHIPS
@pytest.mark.parametrize("heads", [V_HEADS, 2 * V_HEADS])
def test_fill_cache_of_a_state_row_has_no_work_block_limit(chip: ChipSpec, heads: int) -> None:
    """Finding 2 does not hold for the pinned wheel: its update_cache device op has no work-block
    check (the message is absent from 0.81.1's _ttnncpp.so; its fill writer walks several blocks
    per core), and 0.81.1 on a mock P150 ran fill_cache with 128 and 256 work blocks: a
    [1, 32, 128, 128] fp32 row is 32*128/32 = 128 blocks, [1, 64, 128, 128] 256, both more than
    the 64 / 110 cores."""
    assert heads * GDN_DIM // 32 > chip.num_cores
    _fill_row(chip, heads)


def test_fill_cache_device_op_rules() -> None:
    pool, row = T((3, V_HEADS, 128, 128), "float32"), T((1, V_HEADS, 128, 128), "float32")
    rules_movement.fill_cache(pool, row, 2)
    _trips("fill_cache.dtype", lambda: rules_movement.fill_cache(pool, T(row.shape), 2))
    _trips("fill_cache.row", lambda: rules_movement.fill_cache(pool, row, 3))
    _trips("fill_cache.row", lambda: rules_movement.fill_cache(pool, row, 0, update_idx=16))
    two = T((2, V_HEADS, 128, 128), "float32")
    _trips("fill_cache.shape", lambda: rules_movement.fill_cache(pool, two, 0))
    rm = TensorInfo(row.shape, "float32", "row_major")
    _trips("fill_cache.layout", lambda: rules_movement.fill_cache(pool, rm, 0))


# ---- paged KV ------------------------------------------------------------------------------------
def _decode_kv(ops: Ops, users: int, blocks: int = 8) -> None:
    """The backend's decode K write: [1, B, kv, hd] height-sharded one user per core."""
    cache = ops.zeros([blocks, KV_HEADS, BLOCK, HEAD_DIM], "bfloat16")
    k = ops.zeros([1, users, KV_HEADS, HEAD_DIM], "bfloat16")
    pos = ops.upload(np.zeros(users, np.int32), "int32", ROW_MAJOR)
    table = ops.upload(np.zeros((users, 4), np.int32), "int32", ROW_MAJOR)
    ops.paged_update_cache(cache, ops.height_sharded(k, users), pos, table)


@CHIPS
@pytest.mark.parametrize("users", [16, 32])
def test_paged_update_cache_one_user_per_core(chip: ChipSpec, users: int) -> None:
    _decode_kv(_ops(chip), users)


@CHIPS
def test_paged_update_cache_batch_beyond_the_grid(chip: ChipSpec) -> None:
    _decode_kv(_ops(chip), chip.num_cores)
    _trips("cores.corerangeset", lambda: _decode_kv(_ops(chip), chip.num_cores + 1))


def test_paged_update_cache_device_op_rules() -> None:
    b = 16
    cache = T((8, KV_HEADS, BLOCK, HEAD_DIM))
    shard = Shard(b, (32, HEAD_DIM))
    x = TensorInfo((1, b, KV_HEADS, HEAD_DIM), "bfloat16", "tile", "l1", shard)
    pos = T((b,), "int32", "row_major")
    table = T((b, 4), "int32", "row_major")

    def call(**kw: TensorInfo) -> None:
        args = {"cache": cache, "x": x, "update_idxs": pos, "page_table": table, **kw}
        rules_attention.paged_update_cache(P150, **args)

    def sharded(s: Shard | None, dtype: str = "bfloat16") -> TensorInfo:
        return TensorInfo(x.shape, dtype, "tile", "l1" if s else "dram", s)

    call()
    _trips("paged_update_cache.shard", lambda: call(x=sharded(None)))
    _trips("paged_update_cache.shard", lambda: call(x=sharded(Shard(b, (32, 128)))))
    _trips(
        "paged_update_cache.shard",
        lambda: call(x=sharded(Shard(b, (32, 256), "height", "col_major"))),
    )
    _trips("paged_update_cache.shard", lambda: call(x=sharded(Shard(b // 2, (64, 256)))))
    _trips("paged_update_cache.dtype", lambda: call(x=sharded(shard, "bfloat8_b")))
    _trips(
        "paged_update_cache.update_idxs",
        lambda: call(update_idxs=T((b + 1,), "int32", "row_major")),
    )
    _trips(
        "paged_update_cache.update_idxs", lambda: call(update_idxs=T((b,), "uint32", "row_major"))
    )
    _trips(
        "paged_update_cache.page_table", lambda: call(page_table=T((b, 4), "uint32", "row_major"))
    )
    _trips(
        "paged_update_cache.page_table",
        lambda: call(page_table=T((b - 1, 4), "int32", "row_major")),
    )
    _trips(
        "paged_update_cache.page_table", lambda: call(page_table=T((b, 9), "int32", "row_major"))
    )
    big = 111
    wide = TensorInfo((1, big, KV_HEADS, HEAD_DIM), "bfloat16", "tile", "l1", Shard(big, (32, 256)))
    _trips(
        "paged_update_cache.cores",
        lambda: call(
            x=wide,
            update_idxs=T((big,), "int32", "row_major"),
            page_table=T((big, 4), "int32", "row_major"),
        ),
    )


def test_paged_fill_cache_device_op_rules() -> None:
    """Prefill K [1, kv, T, hd] through a per-chunk fill table [1, T / block]."""
    t = 2048
    cache, x = T((64, KV_HEADS, BLOCK, HEAD_DIM)), T((1, KV_HEADS, t, HEAD_DIM))
    table = T((1, t // BLOCK), "int32", "row_major")
    rules_attention.paged_fill_cache(cache, x, table, 0)
    narrow = T((1, t // BLOCK - 1), "int32", "row_major")
    _trips(
        "paged_fill_cache.seq_len", lambda: rules_attention.paged_fill_cache(cache, x, narrow, 0)
    )
    f32 = T(x.shape, "float32")
    _trips("paged_fill_cache.dtype", lambda: rules_attention.paged_fill_cache(cache, f32, table, 0))
    u32 = T(table.shape, "uint32", "row_major")
    _trips(
        "paged_fill_cache.page_table", lambda: rules_attention.paged_fill_cache(cache, x, u32, 0)
    )
    _trips(
        "paged_fill_cache.page_table", lambda: rules_attention.paged_fill_cache(cache, x, table, 1)
    )
    l1 = TensorInfo(x.shape, "bfloat16", "tile", "l1", Shard(32, (256, 256)))
    _trips("paged_fill_cache.memory", lambda: rules_attention.paged_fill_cache(cache, l1, table, 0))


def test_paged_fill_cache_through_the_backend_wrapper() -> None:
    ops = _ops(P150)
    cache = ops.zeros([8, KV_HEADS, BLOCK, HEAD_DIM], "bfloat16")
    x = ops.zeros([1, KV_HEADS, 128, HEAD_DIM], "bfloat16")
    ops.paged_fill_cache(cache, x, ops.upload(np.array([[1, 2]], np.int32), "int32", ROW_MAJOR))
    one = ops.upload(np.array([[1]], np.int32), "int32", ROW_MAJOR)
    _trips("paged_fill_cache.seq_len", lambda: ops.paged_fill_cache(cache, x, one))


# ---- SDPA ----------------------------------------------------------------------------------------
def _sdpa_decode(ops: Ops, users: int, *, kv: int = KV_HEADS, config: object = None) -> object:
    cache = ops.zeros([4, kv, BLOCK, HEAD_DIM], "bfloat16")
    q = ops.zeros([1, users, Q_HEADS, HEAD_DIM], "bfloat16")
    table = ops.upload(np.ones((users, 2), np.int32), "int32", ROW_MAJOR)
    pos = ops.upload(np.full(users, -1, np.int32), "int32", ROW_MAJOR)
    fake = ops.ttnn
    return fake.transformer.paged_scaled_dot_product_attention_decode(
        q, cache, cache, table, cur_pos_tensor=pos, scale=1.0, program_config=config
    )


@CHIPS
def test_sdpa_decode_batch_beyond_the_grid(chip: ChipSpec) -> None:
    _sdpa_decode(_ops(chip), chip.num_cores)
    msg = _trips("paged_sdpa_decode.cores", lambda: _sdpa_decode(_ops(chip), chip.num_cores + 1))
    assert f"Cores available ({chip.num_cores}) must be >= batch size ({chip.num_cores + 1})" in msg


@CHIPS
def test_sdpa_decode_without_program_config_is_recorded_and_can_be_required(chip: ChipSpec) -> None:
    """Finding 5: the backend's call (ops.paged_sdpa_decode) passes no program config: the whole
    grid, exp_approx_mode on; at max_batch 16 each (user, kv head) gets one core, at 8 on
    Wormhole two (the tree reduction of tt-metal PR #49703)."""
    ops = _ops(chip)
    fake = ops.ttnn
    for users in (16, 8):
        cache = ops.zeros([4, KV_HEADS, BLOCK, HEAD_DIM], "bfloat16")
        q = ops.zeros([1, users, Q_HEADS, HEAD_DIM], "bfloat16")
        table = ops.upload(np.ones((users, 2), np.int32), "int32", ROW_MAJOR)
        pos = ops.upload(np.full(users, 3, np.int32), "int32", ROW_MAJOR)
        ops.paged_sdpa_decode(q, cache, cache, table, pos, scale=1.0)
    p16, p8 = fake.sdpa_decode_plans
    assert not p16.program_config and p16.exp_approx_mode and p16.cores_available == chip.num_cores
    assert p16.cores_per_head == 1
    assert p8.cores_per_head == chip.num_cores // 8 // KV_HEADS  # 2 on Wormhole, 3 on P150
    strict = _ops(chip, require_sdpa_program_config=True)
    msg = _trips("paged_sdpa_decode.program_config", lambda: _sdpa_decode(strict, 16))
    assert "exp_approx_mode=True" in msg
    config = strict.ttnn.SDPAProgramConfig(
        compute_with_storage_grid_size=strict.device.compute_with_storage_grid_size(),
        q_chunk_size=0,
        k_chunk_size=128,
        exp_approx_mode=False,
        max_cores_per_head_batch=1,
    )
    _sdpa_decode(strict, 8, config=config)
    plan = strict.ttnn.sdpa_decode_plans[-1]
    assert plan.program_config and not plan.exp_approx_mode and plan.cores_per_head == 1


def test_sdpa_decode_tree_reduction_overflows_a_p150_for_one_user_and_one_kv_head() -> None:
    """qwen36 caps its decode grid at 8x8 because "auto-grid grabs all 110 P150 cores for a single
    user (B=1) and overflows": 110 cores for one head need 7 tree rounds, the kernels hold 6."""
    _sdpa_decode(_ops(WORMHOLE), 1, kv=1)  # 64 cores per head: 6 rounds
    _trips("paged_sdpa_decode.tree_reduction", lambda: _sdpa_decode(_ops(P150), 1, kv=1))


def test_sdpa_decode_operand_rules() -> None:
    b = 16
    q, kv = T((1, b, Q_HEADS, HEAD_DIM)), T((8, KV_HEADS, BLOCK, HEAD_DIM))
    table, pos = T((b, 4), "int32", "row_major"), T((b,), "int32", "row_major")

    def call(**kw: TensorInfo) -> rules_attention.SdpaDecodePlan:
        args = {"q": q, "k": kv, "v": kv, "page_table": table, "cur_pos": pos, **kw}
        return rules_attention.paged_sdpa_decode(WORMHOLE, config=None, **args)

    call()
    _trips("paged_sdpa_decode.dtype", lambda: call(q=T(q.shape, "float32")))
    _trips("paged_sdpa_decode.dtype", lambda: call(q=T(q.shape, "bfloat8_b")))  # GQA wants bf16
    _trips("paged_sdpa_decode.cur_pos", lambda: call(cur_pos=T((b - 1,), "int32", "row_major")))
    _trips("paged_sdpa_decode.cur_pos", lambda: call(cur_pos=T((b,), "uint32", "row_major")))
    _trips(
        "paged_sdpa_decode.page_table", lambda: call(page_table=T((b, 4), "uint32", "row_major"))
    )
    _trips("paged_sdpa_decode.layout", lambda: call(k=T(kv.shape, "bfloat16", "row_major")))


def _chunked(ops: Ops, start: int, chunk: int, *, dtype: str = "bfloat16") -> object:
    cache = ops.zeros([16, KV_HEADS, BLOCK, HEAD_DIM], "bfloat16")
    q = ops.zeros([1, Q_HEADS, 128, HEAD_DIM], dtype)
    table = ops.upload(np.arange(16, dtype=np.int32)[None], "int32", ROW_MAJOR)
    start_t = ops.upload(np.array([start], np.int32), "int32", ROW_MAJOR)
    config = ops.sdpa_program_config(chunk, chunk)
    return ops.chunked_sdpa(q, cache, cache, table, start_t, scale=1.0, program_config=config)


def test_nlp_create_qkv_heads_splits_the_fused_projection_head_major() -> None:
    """The prefill attention split (9B: 16 q + 2 x 4 kv heads of 256): [q | k | v] columns of
    [1, 1, T, 6144] -> q [1, 16, T, 256], k, v [1, 4, T, 256], values moved, not recomputed;
    the op's shape, layout and width rules trip as its C++ checks do."""
    ops = _ops(P150)
    t, width = 64, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    data = np.arange(t * width, dtype=np.float32).reshape(1, 1, t, width) % 251
    q, k, v = ops.create_qkv_heads(ops.upload(data, "float32"), Q_HEADS, KV_HEADS)
    assert q.shape == (1, Q_HEADS, t, HEAD_DIM) and k.shape == v.shape == (1, KV_HEADS, t, HEAD_DIM)
    heads = data.reshape(t, Q_HEADS + 2 * KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
    np.testing.assert_array_equal(ops.read(q)[0], heads[:Q_HEADS])
    np.testing.assert_array_equal(ops.read(k)[0], heads[Q_HEADS : Q_HEADS + KV_HEADS])
    np.testing.assert_array_equal(ops.read(v)[0], heads[Q_HEADS + KV_HEADS :])
    split = ops.create_qkv_heads
    _trips(
        "nlp_create_qkv_heads.shape", lambda: split(ops.zeros([1, t, 1, width], "bfloat16"), 16, 4)
    )
    _trips(
        "nlp_create_qkv_heads.shape",
        lambda: split(ops.zeros([1, 1, t, width + 32], "bfloat16"), 16, 4),
    )
    # the height check reads the padded shape: a 48-row input is 64 tile rows and passes
    assert split(ops.zeros([1, 1, 48, width], "bfloat16"), 16, 4)[0].shape == (1, 16, 48, 256)
    rm = ops.zeros([1, 1, t, width], "bfloat16", ROW_MAJOR)
    _trips("nlp_create_qkv_heads.layout", lambda: split(rm, 16, 4))
    _trips(
        "nlp_create_qkv_heads.dtype", lambda: split(ops.zeros([1, 1, t, width], "bfloat4_b"), 16, 4)
    )


@CHIPS
def test_chunked_sdpa_rules(chip: ChipSpec) -> None:
    _chunked(_ops(chip), 128, 64)
    _chunked(_ops(chip), 64, 32)  # the backend's chunk 32 with a block-aligned start
    _trips("chunked_scaled_dot_product_attention.chunk_start", lambda: _chunked(_ops(chip), 96, 64))
    _trips(
        "chunked_scaled_dot_product_attention.dtype",
        lambda: _chunked(_ops(chip), 0, 64, dtype="float32"),
    )
    q, kv = T((1, Q_HEADS, 2048, HEAD_DIM)), T((64, KV_HEADS, BLOCK, HEAD_DIM))
    table, start = T((1, 32), "int32", "row_major"), T((1,), "int32", "row_major")
    cfg = rules_attention.SdpaConfig((chip.grid_x, chip.grid_y), 64, 64)
    rules_attention.chunked_sdpa(q, kv, kv, table, start, cfg)
    short = T((1, 24), "int32", "row_major")  # 24 * 64 = 1536 < 2048 tokens
    _trips(
        "chunked_scaled_dot_product_attention.kv_length",
        lambda: rules_attention.chunked_sdpa(q, kv, kv, short, start, cfg),
    )
    # sdpa_program_factory.cpp:165: a page-table row is whole 32-byte sticks (found by tt-metal
    # on a mock box, tests/tt/mock/test_engine.py: a 12-block pool gave 12-entry rows)
    odd_row = T((1, 36), "int32", "row_major")  # 36 * 4 = 144 B
    msg = _trips(
        "chunked_scaled_dot_product_attention.page_table",
        lambda: rules_attention.chunked_sdpa(q, kv, kv, odd_row, start, cfg),
    )
    assert "page table stick size must be a multiple of 32" in msg
    u32 = T((1,), "uint32", "row_major")
    _trips(
        "chunked_scaled_dot_product_attention.chunk_start",
        lambda: rules_attention.chunked_sdpa(q, kv, kv, table, u32, cfg),
    )
    odd = rules_attention.SdpaConfig((8, 8), 48, 64)
    _trips(
        "chunked_scaled_dot_product_attention.chunk",
        lambda: rules_attention.chunked_sdpa(q, kv, kv, table, start, odd),
    )
    sharded = TensorInfo(q.shape, "bfloat16", "tile", "l1", Shard(16, (2048, 256)))
    _trips(
        "chunked_scaled_dot_product_attention.layout",
        lambda: rules_attention.chunked_sdpa(sharded, kv, kv, table, start, cfg),
    )


# ---- sampling ------------------------------------------------------------------------------------
def test_topk_height_rule_reads_the_padded_shape() -> None:
    """topk's "N*C*H must be a multiple of 32" is checked on the padded 4-D shape, so the MoE
    decode routing [1, 16, E] (16 rows, tile-padded to 32) passes; the op's other rules trip."""
    routing = T((1, 16, 256), "float32")
    rules_eltwise.topk(routing, 8, -1)
    assert routing.padded_shape[-2] == 32
    _trips(
        "topk.layout", lambda: rules_eltwise.topk(T(routing.shape, "float32", "row_major"), 8, -1)
    )
    _trips("topk.dtype", lambda: rules_eltwise.topk(T(routing.shape, "uint32"), 8, -1))
    _trips("topk.k", lambda: rules_eltwise.topk(routing, 0, -1))
    _trips("topk.dim", lambda: rules_eltwise.topk(routing, 8, 1))


def test_topk_index_dtype_labels_and_limits() -> None:
    """Index outputs: UINT16 below a 65536-wide padded row of a bf16 input, UINT32 for a wider
    row or a float32 input (the sampler's LM-head chunks); labels (``indices_tensor``) must
    match the input, be 32-bit where 32-bit indices are required and exclude ``stable``; k is
    bounded by the row width and, on one core, by L1."""
    chunk = T((1, 32, 31040), "bfloat16")
    assert rules_eltwise.topk(chunk, 32, -1) == "uint16"
    assert rules_eltwise.topk(T((1, 32, 248320), "bfloat16"), 32, -1) == "uint32"
    f32 = T((1, 32, 256), "float32")
    assert rules_eltwise.topk(f32, 32, -1) == "uint32"
    labels = T((1, 32, 256), "uint32")
    assert rules_eltwise.topk(f32, 32, -1, indices=labels) == "uint32"
    _trips(
        "topk.indices", lambda: rules_eltwise.topk(f32, 32, -1, indices=T((1, 32, 256), "uint16"))
    )
    _trips(
        "topk.indices", lambda: rules_eltwise.topk(f32, 32, -1, indices=T((1, 32, 128), "uint32"))
    )
    _trips("topk.stable", lambda: rules_eltwise.topk(f32, 32, -1, indices=labels, stable=True))
    _trips("topk.k", lambda: rules_eltwise.topk(T((1, 32, 16), "float32"), 32, -1))
    rules_eltwise.topk(f32, 32, -1, l1_bytes=WORMHOLE.l1_bytes)
    wide = T((1, 32, 1 << 16), "float32")
    _trips("topk.l1", lambda: rules_eltwise.topk(wide, 8192, -1, l1_bytes=WORMHOLE.l1_bytes))


def test_binary_broadcast_rule() -> None:
    """binary_ng: right-aligned dims equal or 1 (the sampler's column x row compare matrices
    [R, 32, 1] vs [R, 1, 32] broadcast both ways); anything else is refused."""
    assert rules_eltwise.binary((32, 32, 1), (32, 1, 32)) == (32, 32, 32)
    assert rules_eltwise.binary((1, 32, 32), (1, 32, 1)) == (1, 32, 32)
    _trips("binary.broadcast", lambda: rules_eltwise.binary((1, 32, 32), (1, 16, 32)))
    ops = Ops(VirtualTTNN())
    ops.open_device(0, trace_region_size=0, l1_small_size=0)
    a, b = ops.zeros([1, 32, 32], "float32"), ops.zeros([1, 16, 32], "float32")
    _trips("binary.broadcast", lambda: ops.le(a, b))


def test_argmax_paths() -> None:
    """Greedy ids over the 9B vocab: multi-core on ROW_MAJOR input, single-core on TILE."""
    logits = (1, 16, VOCAB)
    assert rules_eltwise.argmax(T(logits, "float32", "row_major"), -1) == "multi_core"
    assert rules_eltwise.argmax(T(logits, "float32"), -1) == "single_core"
    sharded = TensorInfo(logits, "float32", "row_major", "l1", Shard(16, (1, VOCAB)))
    _trips("argmax.memory", lambda: rules_eltwise.argmax(sharded, -1))
    _trips("argmax.layout", lambda: rules_eltwise.argmax(T(logits, "float32"), None))
    _trips("argmax.dtype", lambda: rules_eltwise.argmax(T(logits, "int32"), -1))
    ops = _ops(P150)
    ids = ops.argmax(ops.zeros([1, 16, 1024], "float32"))
    assert ops.ttnn.argmax_paths == ["multi_core"]
    assert ids.dtype is ops.dtype("uint32") and ids.layout is ops.layout(ROW_MAJOR)


# ---- DRAM ----------------------------------------------------------------------------------------
def qwen35_9b_weights(linear: str = "bfloat16") -> Iterator[tuple[str, TensorInfo]]:
    """The device weights the backend uploads for Qwen3.5-9B (tt/runtime/weights.py layouts)."""
    rm = "row_major"
    yield "embed", T((VOCAB, HIDDEN), "bfloat16", rm)
    yield "lm_head", T((HIDDEN, VOCAB), linear)
    kd, vd = K_HEADS * GDN_DIM, V_HEADS * GDN_DIM
    for i in range(LAYERS):
        yield "norms", T((1, 1, HIDDEN // 32, 32), "bfloat16", rm)
        yield "norms", T((1, 1, HIDDEN // 32, 32), "bfloat16", rm)
        for n, shape in (
            ("gate", (HIDDEN, INTER)),
            ("up", (HIDDEN, INTER)),
            ("down", (INTER, HIDDEN)),
        ):
            yield f"mlp.{n}", T(shape, linear)
        if (i + 1) % 4 == 0:
            for n, shape in (
                ("qkv", (HIDDEN, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM)),
                ("gate", (HIDDEN, Q_HEADS * HEAD_DIM)),
                ("o", (Q_HEADS * HEAD_DIM, HIDDEN)),
            ):
                yield f"attn.{n}", T(shape, linear)
            yield "norms", T((1, 1, HEAD_DIM // 32, 32), "bfloat16", rm)
            yield "norms", T((1, 1, HEAD_DIM // 32, 32), "bfloat16", rm)
        else:
            for n, shape in (
                ("qkv", (HIDDEN, 2 * kd + vd)),
                ("z", (HIDDEN, vd)),
                ("b", (HIDDEN, V_HEADS)),
                ("a", (HIDDEN, V_HEADS)),
                ("out", (vd, HIDDEN)),
            ):
                yield f"gdn.{n}", T(shape, linear)
            yield "norms", T((1, 1, GDN_DIM // 32, 32), "bfloat16", rm)
            for _ in range(CONV_K):
                yield "gdn.taps", T((1, 1, 1, 2 * kd + vd))
            yield "gdn.gates", T((1, 1, V_HEADS), "float32")
            yield "gdn.gates", T((1, 1, V_HEADS), "float32")


def _load(budget: dram.DramBudget, weights: Iterator[tuple[str, TensorInfo]]) -> int:
    n = 0
    for n, (name, t) in enumerate(weights):
        budget.allocate(n, t, name)
    return n + 1


def test_9b_bf16_weights_do_not_fit_a_wormhole_chip_but_fit_a_p150() -> None:
    """~18 GB of bf16 weights: 12 banks x 1 GiB on Wormhole, 8 x (4 GiB - 16 MiB) on P150, each
    less the trace region (256 MiB, the backend's default) that tt-metal reserves in EVERY bank."""
    names = [n for n, _ in qwen35_9b_weights()]
    assert names.count("attn.qkv") == N_ATTN and names.count("gdn.qkv") == N_GDN
    params = sum(int(np.prod(t.shape)) for _, t in qwen35_9b_weights())
    assert 8.9e9 < params < 9.1e9
    trace = 256 << 20
    msg = _trips(
        "dram.capacity", lambda: _load(dram.DramBudget(WORMHOLE, trace), qwen35_9b_weights())
    )
    assert "12 banks" in msg and "Largest holders" in msg and "mlp." in msg
    p150 = dram.DramBudget(P150, trace)
    _load(p150, qwen35_9b_weights())
    used = p150.used_per_bank * p150.banks
    assert 17.5e9 < used < 18.5e9
    assert p150.bank_bytes * p150.banks - used > 13e9  # left for KV, state pools and snapshots


@CHIPS
def test_trace_region_is_split_over_the_banks(chip: ChipSpec) -> None:
    """Each bank gives up ceil(region / banks) rounded up to 8 KiB (tt-metal 0.81.1 on mock
    boxes, tests/tt/mock/test_boards.py), not the whole region."""
    free, banks = dram.DramBudget(chip).bank_bytes, chip.dram_banks
    share = -(-(256 << 20) // banks)
    assert dram.DramBudget(chip, 256 << 20).bank_bytes == free - -(-share // 8192) * 8192
    assert dram.DramBudget(chip, 8192 * banks + 1).bank_bytes == free - 2 * 8192


def test_dram_pages_and_block_floats() -> None:
    """TILE pads to 32x32 tiles: bf16 2048 B, bfloat8_b 1088 B, bfloat4_b 576 B per tile; pages
    are spread lock-step over the banks (ceil(pages / banks) in each)."""
    budget = dram.DramBudget(WORMHOLE)
    assert budget.per_bank(T((1, 1, 1, 33))) == 2048  # 2 tiles over 12 banks: 1 each
    assert budget.per_bank(T((24 * 32, 32), "bfloat8_b")) == 2 * 1088  # 24 tiles: 2 per bank
    assert budget.per_bank(T((12 * 32, 32), "bfloat4_b")) == 576
    # 13 rows of 400 B (aligned to 416) over 12 banks: lock-step, 2 rows in every bank
    assert budget.per_bank(T((13, 100), "int32", "row_major")) == 2 * 416


def test_fake_charges_device_allocations_to_dram() -> None:
    """Every device tensor of the fake is charged; freeing gives it back; the trace region is
    carved out of the banks (its share of each)."""
    tiny = ChipSpec(arch="wormhole_b0", grid_x=8, grid_y=8, dram_bytes=12 << 20, l1_bytes=1 << 20)
    ops = _ops(tiny, trace_region=0)  # 1 MiB per bank
    a = ops.zeros([1024, 1024], "float32")  # 1024 tiles: 86 per bank x 4 KiB = 344 KiB
    b = ops.zeros([1024, 1024], "float32")
    msg = _trips("dram.capacity", lambda: ops.zeros([1024, 1024], "float32"))
    assert "2 x [1024, 1024] float32 tile" in msg
    ops.deallocate(a)
    c = ops.zeros([1024, 1024], "float32")
    del b, c
    small_banks = _ops(tiny, trace_region=12 * (512 << 10))  # 512 KiB of each of 12 banks
    keep = small_banks.zeros([1024, 1024], "float32")
    _trips("dram.capacity", lambda: small_banks.zeros([1024, 1024], "float32"))
    del keep


# ---- trace region --------------------------------------------------------------------------------
def test_capture_past_the_trace_region_fails_at_end_trace_capture() -> None:
    """P150: a one-program trace is one 4 KiB page in each of 8 banks (32 KiB); a 64 KiB region
    holds two live traces, the third capture fails, and release_trace gives the space back."""
    ops = _ops(P150, trace_region=64 << 10)
    x = ops.zeros([32, 32], "float32")
    outs = [ops.zeros([32, 32], "float32") for _ in range(3)]

    programs = [
        lambda: ops.copy(ops.mul(x, 2.0), outs[0]),
        lambda: ops.copy(ops.add(x, 1.0), outs[1]),
        lambda: ops.copy(ops.sigmoid(x), outs[2]),
    ]

    def capture(i: int) -> object:
        program = programs[i]
        program()
        tid = ops.begin_trace()
        program()
        ops.end_trace(tid)
        return tid

    first, _ = capture(0), capture(1)
    msg = _trips("trace.region", lambda: capture(2))
    assert "but only 65536B is allocated for trace region" in msg
    ops.release_trace(first)
    capture(2)


def test_trace_without_a_region_lives_in_dram() -> None:
    """trace_region_size=0: tt-metal allocates the trace buffer as an ordinary DRAM buffer."""
    ops = _ops(P150, trace_region=0)
    x, out = ops.zeros([32, 32], "float32"), ops.zeros([32, 32], "float32")
    ops.copy(ops.sigmoid(x), out)
    fake = ops.ttnn
    before = fake.dram.used_per_bank
    tid = ops.begin_trace()
    ops.copy(ops.sigmoid(x), out)
    ops.end_trace(tid)
    assert fake.dram.used_per_bank - before == dram.TRACE_PAGE_BYTES
    ops.release_trace(tid)
    assert fake.dram.used_per_bank == before


def test_trace_size_estimate() -> None:
    """The documented estimate: 4 KiB per program plus 256 B per core it runs on, rounded up
    to whole 4 KiB pages in every bank."""
    assert dram.trace_bytes(P150, [110]) == 8 * 4096
    raw, page = 1000 * (4096 + 64 * 256), 12 * 4096
    assert dram.trace_bytes(WORMHOLE, [64] * 1000) == -(-raw // page) * page
    region = dram.TraceRegion(P150, 256 << 20)
    region.end_capture(1, [110] * 2000)  # a ~2000-program 9B decode step: ~64 MB
    assert 60e6 < region.live[1] < 70e6


# ---- the backend on the modelled chips -------------------------------------------------------------
def test_tiny_backend_runs_within_wormhole_limits(dense_dir: Path) -> None:
    """The tiny contract model (8 value heads, max_batch 4) fits an 8x8 Wormhole: every op call,
    allocation and capture of a real engine run passes the rules; its decode SDPA runs with a
    program config, one core per (user, kv head) (recorded, finding 5)."""
    fake = VirtualTTNN(chip=WORMHOLE)
    be = h.tt_backend(dense_dir, fake)
    spec = ModelSpec.from_hf_dir(dense_dir)
    out = h.generate(h.engine(be, spec), [h.prompt(70, 1)], 3)
    assert len(out[0][0]) == 3
    plans = fake.sdpa_decode_plans
    assert plans and all(p.program_config and p.cores_per_head == 1 for p in plans)
    assert fake.trace_region.live and sum(fake.trace_region.live.values()) <= h.TRACE_REGION


def test_backend_capture_past_the_trace_region_fails(dense_dir: Path) -> None:
    """allocate() captures one trace per bucket plus decode; a region too small for them fails
    at end_trace_capture, as tt-metal's TT_FATAL does."""
    ops = Ops(VirtualTTNN())
    ops.open_device(0, trace_region_size=256 << 10, l1_small_size=0)
    spec = ModelSpec.from_hf_dir(dense_dir)
    be = h.build(spec, load_weights(dense_dir, spec), ops=ops, prefill_chunk=h.CHUNK)
    msg = _trips(
        "trace.region",
        lambda: be.allocate(
            num_kv_blocks=8, block_size=h.BLOCK, num_state_slots=2, num_snapshot_slots=1
        ),
    )
    assert "but only 262144B is allocated for trace region" in msg
