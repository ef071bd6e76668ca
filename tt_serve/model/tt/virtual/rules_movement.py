"""Device rules of data movement, which ``movement.py`` applies: ``permute`` and the per-user
``fill_cache`` (conventions: ``rules_base.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from tt_serve.model.tt.virtual.rules_base import TILE, TensorInfo, _fail, _is


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
