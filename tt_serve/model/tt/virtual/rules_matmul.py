"""Device rules of ``ttnn.matmul`` (and ``linear``), which ``matmul.py`` applies (conventions:
``rules_base.py``)."""

from __future__ import annotations

import math

from tt_serve.model.tt.virtual.rules_base import TensorInfo, _fail, _is

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
