"""Device rules of the MoE experts' ``sparse_matmul`` and its 1-D multicast program config,
which ``moe.py`` applies (conventions: ``rules_base.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual.rules_base import TILE, TILE_BYTES, TensorInfo, _fail, _is

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
