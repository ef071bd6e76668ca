"""MoE block on the device (mirrors ``ref/moe.py``): routing, the routed experts, the shared
expert. Two expert paths, chosen by ``MoeDispatch`` (a backend option, default ``sparse``):

**sparse** (the default): only the routed experts are read and computed, with
``ttnn.sparse_matmul`` in its scan mode, as tt-metal's MoE models call it
(tt-metal:models/demos/gpt_oss/tt/experts_throughput/decode.py, the per-tile prefill path of
tt-metal:models/demos/blackhole/qwen36/tt/moe/prefill.py): the
tokens go in blocks of at most BLOCK_ROWS = 256 rows (a decode batch and a prefill chunk of up to
256 tokens are one block), and a block computes expert e when some row of the block routes to
it. Per layer:

* routing replicated on every chip: softmax, ``topk``, the routed weight [1, N, E] (0 off each
  token's top-k and on masked rows: idle decode rows and bucket padding route nowhere);
* on a mesh the chip's own experts' columns, by a one-hot [E, E/N] matmul (exact: one non-zero
  term); per block the union of its rows' experts as the sparsity tensor [1, G, 1, E_c] (the
  sum of the block's routed weights, bf16 ROW_MAJOR);
* gate and up fused: ``x [1, G, rows, H] x W [1, E_c, H, 2I]`` (A dense, B sparse) ->
  [1, G, 1, E_c, rows, 2I]; ``h = silu(gate) * up * r`` with r the (expert, row) weight;
* down: ``h [G, E_c, rows, I] x D [1, E_c, I, H]`` (A sparse, B dense) -> [G, E_c, rows, H],
  summed over the experts.

Skipped (block, expert) entries are zero-filled by the op (0.81.1: "skipped positions are
zero-filled", tt-metal PR #36714) and their weight is 0, so the sum is exact. ``nnz`` stays None
(the op counts the non-zero entries on the device): a static count must equal
``count_nonzero(sparsity)`` or the device hangs (#45943), and the union varies step to step, so
nothing here is data-dependent on the host and the programs replay as traces. The compact and
indexed (``indices``) outputs of 0.81.1 need a static active count and are not used. The cost
is the expanded outputs: a 256-token chunk of Qwen3.6-35B-A3B allocates [1, 1, 1, 256, 256, 1024]
(128 MiB bf16) and [1, 256, 256, 2048] (256 MiB) on one chip, a quarter of that on 1 x 4 (the
planner's shape-only run charges them).

Expert placement on a mesh of N chips (1 x N, or R x C with N = R·C in row-major chip order):
chip c holds the whole experts [c·E/N, (c+1)·E/N) (gate_up
and down sharded on the expert dim, ``layout/parallel.py``), the router is replicated, and each chip
computes its local experts for the tokens routed to them. Its output is a partial sum over the
experts, added to the shared expert's partial sum (column/row parallel) and reduced by the
layer's one ``ccl.TensorParallelCCL.all_reduce``, as every other row-parallel projection. Not
``all_to_all_dispatch`` / ``all_to_all_combine``: the residual stream is already replicated
(every chip holds every token, so there is nothing to dispatch), tt-metal #23687 reports
``all_to_all_dispatch`` hanging under trace on T3K, and their outputs carry garbage rows that a
replicated reduction does not need; the all-reduce is the trace-safe pair of experimental CCLs
this stack already uses.

**dense** (the reference, kept for tests): every expert on every token, weighted by its column
of the routing weights, in a transposed orientation (tokens in the last dim) so the stacked
weights need no broadcast copy of x:

* ``xT = x^T`` [1, 1, H, N] and ``rT`` = the routing weights as [1, E, 1, N];
* per group of G experts (:func:`expert_groups`), gate and up ``W [1, G, I, H] @ xT`` ->
  [1, G, I, N]: ttnn's batch-broadcast matmul (B's batch is 1, "BCMK*11KN=BCMN",
  ``virtual/rules_matmul.py`` ``matmul``); ``h = silu(gate) * up * rT`` (row broadcast over I);
* down ``D [1, 1, H, G·I] @ h [1, 1, G·I, N]`` -> [1, 1, H, N], where D holds the experts'
  down projections side by side: the sum over the experts happens in the matmul's K
  accumulation (unrouted experts add exact zeros);
* the groups' outputs are added, transposed back to [1, N, H].

Groups bound the activations: one group's [G·I, N] tensor is EXPERT_GROUP_ROWS rows. On a mesh
the dense path splits every expert by its intermediate dim instead of placing experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.runtime.layers import swiglu

# Rows of one sparse block. A block reads each of its experts' weights once, so one block per
# call reads no more than the dense path does (a 256-token chunk routes to nearly every expert:
# 256 x (1 - (1 - 8/256)^256) ~ 256 of Qwen3.6's 256), where 32-row blocks would read each expert
# once per block (~1300 expert reads for 256 tokens); it is capped so a block's A rows stay one
# modest L1 block per core (8 M tiles; a longer chunk splits into 256-row blocks).
BLOCK_ROWS = 256
# K tiles of one core's in0 block (at most; a divisor of Kt): the qwen3_6_a3b port measured fewer K-block handshakes as faster, and 8 divides both K of
# Qwen3.6 (64 and 16 tiles).
IN0_BLOCK_TILES = 8


@dataclass(frozen=True)
class ExpertGroup:
    """Dense path: stacked weights of experts [first, first + count)."""

    gate: Tensor  # [1, G, I, H] (the checkpoint's [out, in] orientation: the matmul's A)
    up: Tensor  # [1, G, I, H]
    down: Tensor  # [1, 1, H, G·I]: column block g is expert g's down projection [H, I]
    first: int

    @property
    def count(self) -> int:
        return int(self.gate.shape[1])


@dataclass(frozen=True)
class SparseExperts:
    """Sparse path: this chip's experts in sparse_matmul's B layout [1, E_c, in, out]."""

    gate_up: Tensor  # [1, E_c, H, 2I]: columns [0, I) gate, [I, 2I) up
    down: Tensor  # [1, E_c, I, H]
    select: Tensor | None = None  # [E, E_c] one-hot of this chip's experts (None: all experts)


@dataclass(frozen=True)
class MoeWeights:
    router: Tensor  # [H, E]
    experts: tuple[ExpertGroup, ...] | SparseExperts
    shared: tuple[Tensor, Tensor, Tensor]
    shared_gate: Tensor  # [H, 1]
    top_k: int
    norm_topk_prob: bool
    compute: Any = None  # expert matmuls (fidelity of the experts' dtype)
    shared_compute: Any = None  # shared expert (the MLP dtype)
    exact: Any = None  # router, shared gate and the one-hot expert selection (bf16 weights)


def sparse_program_config(ops: Ops, m: int, k: int, n: int) -> Any:
    """The 1D multicast config (in0 multicast) of a sparse matmul of [m, k] x [k, n] blocks: all
    M tiles on each core, the N tiles spread over a rectangle of the grid's cores, in0 blocks of
    the largest divisor of Kt up to IN0_BLOCK_TILES. in0 is multicast to the whole rectangle and
    tt-metal wants every core of it to have work (``sparse_matmul_multicore_reuse_mcast_1d_
    optimized.cpp:312``), so the rectangle holds exactly ceil(Nt / per_core_N) cores: the
    fewest tiles per core for which that count factors into the grid."""
    gx, gy = ops.worker_grid()
    mt, kt, nt = -(-m // 32), -(-k // 32), -(-n // 32)
    in0 = max(d for d in range(1, min(kt, IN0_BLOCK_TILES) + 1) if kt % d == 0)
    for per_core_n in range(-(-nt // (gx * gy)), nt + 1):
        cores = -(-nt // per_core_n)
        x = next((x for x in range(min(gx, cores), 0, -1) if cores % x == 0), 1)
        if cores // x <= gy:
            return ops.matmul_1d_config(
                cores=(x, cores // x), in0_block_w=in0, per_core_m=mt, per_core_n=per_core_n
            )
    raise AssertionError("unreachable: per_core_N = Nt uses one core")


def _routing(ops: Ops, x: Tensor, w: MoeWeights, rows: Tensor | None) -> Tensor:
    """x [1, N, H] -> the routing weights [1, N, E] (0 off each token's top-k, and on the rows
    where ``rows`` [1, N, 1] is 0), bf16."""
    n = x.shape[1]
    probs = ops.softmax(ops.typecast(ops.linear(x, w.router, w.exact), "float32"))  # [1, N, E]
    top_v, _ = ops.topk(probs, w.top_k)
    kth = ops.slice(top_v, [0, 0, w.top_k - 1], [1, n, w.top_k])
    routed = ops.mul(probs, ops.ge(probs, kth))
    if w.norm_topk_prob:
        routed = ops.mul(routed, ops.reciprocal(ops.sum(top_v, -1)))
    if rows is not None:
        routed = ops.mul(routed, rows)
    return ops.typecast(routed, "bfloat16")


def moe_forward(ops: Ops, x: Tensor, w: MoeWeights, rows: Tensor | None = None) -> Tensor:
    """x [1, N, H] -> [1, N, H]. ``rows`` [1, N, 1] float32: 1 on the rows whose output is used
    (the others get the shared expert only; the sparse path then computes no expert for them)."""
    routed = _routing(ops, x, w, rows)
    if isinstance(w.experts, SparseExperts):
        routed_out = _sparse_experts(ops, x, routed, w.experts, w)
    else:
        routed_out = _dense_experts(ops, x, routed, w.experts, w.compute)
    shared = swiglu(ops, x, *w.shared, w.shared_compute)
    shared = ops.mul(shared, ops.sigmoid(ops.linear(x, w.shared_gate, w.exact)))
    return ops.add(routed_out, shared)


def _block_rows(n: int) -> int:
    """Rows per sparse block: the largest divisor of ``n`` up to BLOCK_ROWS (a decode batch or a
    chunk of up to 256 tokens is one block, a 2048-token chunk 8 blocks of 256)."""
    return max(d for d in range(1, min(n, BLOCK_ROWS) + 1) if n % d == 0)


def _sparse_experts(ops: Ops, x: Tensor, routed: Tensor, e: SparseExperts, w: MoeWeights) -> Tensor:
    """The routed experts of this chip, only where routed: x [1, N, H], routed [1, N, E] ->
    [1, N, H] (a partial sum over the chip's experts on a mesh)."""
    n, hidden = x.shape[1], x.shape[2]
    if e.select is not None:
        routed = ops.matmul(routed, e.select, w.exact, dtype="bfloat16")  # [1, N, E_c]
    local, inter = routed.shape[2], e.down.shape[2]
    rows = _block_rows(n)
    gate_up_config = sparse_program_config(ops, rows, hidden, 2 * inter)
    down_config = sparse_program_config(ops, rows, inter, hidden)
    blocks = n // rows
    r = ops.reshape(routed, [1, blocks, rows, local])
    # a block computes expert e when some row routes to it: the sum of non-negative weights
    sparsity = ops.to_row_major(ops.typecast(ops.sum(r, 2), "bfloat16"))  # [1, G, 1, E_c]
    xb = ops.reshape(x, [1, blocks, rows, hidden])
    gu = ops.sparse_matmul(
        xb,
        e.gate_up,
        sparsity,
        program_config=gate_up_config,
        a_sparse=False,
        b_sparse=True,
        compute_config=w.compute,
        dtype="bfloat16",
    )  # [1, G, 1, E_c, rows, 2I]
    gu = ops.reshape(gu, [blocks, local, rows, 2 * inter])
    gate = ops.slice(gu, [0, 0, 0, 0], [blocks, local, rows, inter])
    up = ops.slice(gu, [0, 0, 0, inter], [blocks, local, rows, 2 * inter])
    weight = ops.permute(r, [1, 3, 2, 0])  # [G, E_c, rows, 1]
    h = ops.mul(ops.mul(ops.silu(gate), up), weight)
    y = ops.sparse_matmul(
        h,
        e.down,
        ops.reshape(sparsity, [1, 1, blocks, local]),
        program_config=down_config,
        a_sparse=True,
        b_sparse=False,
        compute_config=w.compute,
        dtype="bfloat16",
    )  # [G, E_c, rows, H]
    return ops.reshape(ops.sum(y, 1), [1, n, hidden])


def _dense_experts(
    ops: Ops, x: Tensor, routed: Tensor, groups: tuple[ExpertGroup, ...], compute: Any
) -> Tensor:
    """Every expert on every token, weighted: x [1, N, H], routed [1, N, E] -> [1, N, H]."""
    n, hidden = x.shape[1], x.shape[2]
    num_experts = routed.shape[2]
    r_t = ops.permute(ops.reshape(routed, [1, 1, n, num_experts]), [0, 3, 1, 2])  # [1, E, 1, N]
    x_t = ops.permute(ops.reshape(x, [1, 1, n, hidden]), [0, 1, 3, 2])  # [1, 1, H, N]
    out = None
    for g in groups:
        r = r_t
        if len(groups) > 1:
            r = ops.slice(r_t, [0, g.first, 0, 0], [1, g.first + g.count, 1, n])
        gate = ops.matmul(g.gate, x_t, compute, dtype="bfloat16")  # [1, G, I, N]
        up = ops.matmul(g.up, x_t, compute, dtype="bfloat16")
        h = ops.mul(ops.mul(ops.silu(gate), up), r)
        h = ops.reshape(h, [1, 1, g.count * h.shape[2], n])  # a view: I is tile-aligned
        y = ops.matmul(g.down, h, compute, dtype="bfloat16")  # [1, 1, H, N]
        out = y if out is None else ops.add(out, y)
    assert out is not None
    return ops.reshape(ops.permute(out, [0, 1, 3, 2]), [1, n, hidden])
