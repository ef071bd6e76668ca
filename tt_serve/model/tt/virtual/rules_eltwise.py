"""Device rules of elementwise ops and reductions, which ``eltwise.py`` applies: ``topk`` and
``argmax`` (sampling) and binary_ng broadcasting (conventions: ``rules_base.py``)."""

from __future__ import annotations

from tt_serve.model.tt.virtual.rules_base import (
    ELEMENT_BYTES,
    TILE,
    TILE_BYTES,
    TensorInfo,
    _fail,
    _is,
)

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
