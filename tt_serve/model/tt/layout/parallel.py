"""Tensor parallelism over a ROWS x COLS mesh (numpy only): how every layer splits across the
chips.

On a 1 x N mesh the split is the one tt-metal's multi-chip models use (models/demos/blackhole/
qwen36/tt/tp_common.py ``shard_w``, models/tt_transformers/tt/attention.py and mlp.py):

* attention: q/k/v projections column-parallel by heads (column c holds query heads
  [c·nh/C, (c+1)·nh/C) and their KV head group; when C exceeds the KV heads each KV head is
  replicated on the C/nkv columns whose query heads use it, qwen36's ``replicate_kv_weight``),
  the gate column-parallel, o_proj row-parallel;
* GDN: key and value heads column-parallel (column c holds value heads [c·hv/C, ...) and the
  key heads they read, so the conv channels, conv taps, gates and recurrent state split with
  them), out_proj row-parallel;
* MLP, shared expert: gate/up column-parallel, down row-parallel; routed experts placed whole,
  chip c holding experts [c·E/N, (c+1)·E/N) (the sparse path, ``moe.py``: gate_up and down split
  on the expert dim; the dense reference path splits every expert by its intermediate dim);
* LM head by vocabulary (column-parallel); embedding, norms and the router replicated.

On a 2-D mesh (R rows > 1; T3K 2x4, Galaxy 8x4) the heads still split over the columns
(``cluster_axis=1``), exactly as above with C columns, and every large weight is additionally
split over the rows (``cluster_axis=0``), so each chip holds 1/(R·C) of each projection:

* column-parallel mixer projections (attention qkv and gate, GDN qkv and z): column c's block is
  cut into R contiguous pieces, chip (r, c) holds piece r; after the matmul an all-gather on
  axis 0 (the last dim) rebuilds column c's whole projection on every chip of the column, and
  the per-chip program from there on is the 1 x C one;
* row-parallel mixer projections (o_proj, GDN out_proj) [in_c, H]: the input dim splits over
  the columns (heads) and the output (hidden) over the rows, ``ShardTensor2dMesh(dims=(-1,
  0))``; the partial sums [.., H/R] are all-reduced over axis 1 (reduce-scatter + all-gather)
  and all-gathered over axis 0;
* the MLP splits its intermediate dim over all R·C chips (gate/up by columns, down by rows, in
  row-major chip order: ``shard_tensor_to_mesh_mapper``), so the down projection leaves partial
  sums on every chip, reduced over both axes: reduce-scatter on axis 1, reduce-scatter on
  axis 0, all-gather on axis 0, all-gather on axis 1 (tt_transformers' ``tt_all_reduce`` with
  ``use_composite``, once per axis, models/tt_transformers/tt/ccl.py);
* the small per-head vectors (GDN b/a gates, dt_bias, -exp(A_log), conv taps) split over the
  columns and are replicated over the rows, ``ShardTensor2dMesh(dims=(None, -1))``; norms and
  the embedding are replicated;
* the LM head splits its vocabulary over all R·C chips (row-major), with the two-stage top-32
  pick gathered over both axes (models/common/sampling/tt_sampling.py);
* KV cache, GDN conv/recurrent state and snapshots follow the heads: each column's share,
  replicated over the rows, so a state copy runs on all R·C chips (all or nothing:
  ``backend.StateCopyError``).

tt-metal's own 8x4 Galaxy model (tt-metal:models/demos/llama3_70b_galaxy/tt/llama_mlp.py)
shards w1/w3 with ``ShardTensor2dMesh(dims=(-1, -2))`` (intermediate over the 8 rows, hidden
over the 4 columns) and w2 with ``dims=(-2, -1)``, keeps the residual fractured over the
columns, reduce-scatters FF1/FF3 on ``cluster_axis=1`` and all-reduces FF2 on
``cluster_axis=0``; this stack keeps its replicated residual and the 1 x C head split (every
hybrid layer's per-chip program is the tested 1 x N one), and adds the row split on top. MoE layers run on 1 x N meshes
only (``check``: experts are not split over rows yet).

A row-parallel projection leaves partial sums on every chip; ``ccl.TensorParallelCCL`` sums
them. The fused projections are stored per chip in the order the per-chip programs read them
([q_c | k_c | v_c] columns, chip after chip in row-major mesh order), so sharding the stored
tensor into R·C equal contiguous chunks (``shard_tensor_to_mesh_mapper``) gives each chip
exactly its block.

Which weight takes which of these splits is declared once, in the device-weight table
(``table.py``, its :class:`~tt_serve.model.tt.layout.table.Placement` per entry);
:meth:`TensorParallel.place` carries each placement out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.host import HostWeight, is_shape_only, shape_only_array
from tt_serve.model.tt.layout.table import Placement, slot

TILE = 32


@dataclass(frozen=True)
class TensorParallel:
    """A ``rows`` x ``cols`` mesh; per-chip head and width counts of ``spec`` (heads split over
    the ``cols``, widths additionally over the ``rows``)."""

    spec: ModelSpec
    cols: int
    rows: int = 1

    @property
    def degree(self) -> int:
        """Chips of the mesh (1: no tensor parallelism)."""
        return self.rows * self.cols

    @property
    def mesh(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @staticmethod
    def for_mesh(spec: ModelSpec, mesh: tuple[int, int]) -> TensorParallel:
        """The split over ``mesh``; ValueError naming the model's counts when it does not
        divide (heads, KV heads, GDN heads, widths that must stay whole tiles per chip)."""
        rows, cols = mesh
        tp = TensorParallel(spec, cols, rows)
        tp.check()
        return tp

    def check(self) -> None:
        s, n, r, c = self.spec, self.degree, self.rows, self.cols
        name = s.model_id or "the model"
        problems = []

        def need(ok: bool, what: str) -> None:
            if not ok:
                problems.append(what)

        need(s.num_attention_heads % c == 0, f"attention heads {s.num_attention_heads} % {c}")
        nkv = s.num_kv_heads
        need(nkv % c == 0 or c % nkv == 0, f"KV heads {nkv} neither divide nor are divided by {c}")
        need(s.linear_num_key_heads % c == 0, f"GDN key heads {s.linear_num_key_heads} % {c}")
        need(s.linear_num_value_heads % c == 0, f"GDN value heads {s.linear_num_value_heads} % {c}")
        need(s.hidden_size % (TILE * n) == 0, f"hidden {s.hidden_size} % (32 x {n})")
        need(s.vocab_size % n == 0, f"vocab {s.vocab_size} % {n}")
        if r > 1 and not problems:
            # Column blocks cut into R whole-tile pieces (the axis-0 gather stays tile-aligned).
            for what, width in self._row_gathered_widths().items():
                need(width % (TILE * r) == 0, f"{what} {width} per column % (32 x {r} rows)")
        if s.num_experts:
            need(s.num_experts % n == 0, f"experts {s.num_experts} % {n} (whole experts per chip)")
            inter = s.moe_intermediate_size  # the dense reference path splits each expert by it
            need(inter % (TILE * n) == 0, f"expert intermediate {inter} % (32 x {n})")
            shared = s.shared_expert_intermediate_size
            need(shared % (TILE * n) == 0, f"shared expert intermediate {shared} % (32 x {n})")
        if any(not s.is_moe_layer(i) for i in range(s.num_layers)):
            need(s.intermediate_size % (TILE * n) == 0, f"MLP {s.intermediate_size} % (32 x {n})")
        if problems:
            raise ValueError(
                f"{name} does not split over a {r} x {c} mesh: "
                + "; ".join(problems)
                + f" (attention {s.num_attention_heads} heads / {nkv} KV heads, GDN "
                f"{s.linear_num_key_heads} key / {s.linear_num_value_heads} value heads)"
            )

    def _row_gathered_widths(self) -> dict[str, int]:
        s, hd = self.spec, self.spec.head_dim
        out = {}
        if s.num_attention_layers:
            out["attention qkv"] = (self.heads + 2 * self.kv_heads) * hd
            out["attention gate"] = self.heads * hd
        if s.num_gdn_layers:
            out["GDN qkv"] = self.conv_dim
            out["GDN z"] = self.v_heads * s.linear_value_head_dim
        return out

    # ---- per-chip counts -------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return self.spec.num_attention_heads // self.cols

    @property
    def kv_heads(self) -> int:
        """KV heads per chip: a share, or one replicated head when columns outnumber them."""
        return max(1, self.spec.num_kv_heads // self.cols)

    def kv_range(self, col: int) -> tuple[int, int]:
        nkv, n = self.spec.num_kv_heads, self.cols
        if n <= nkv:
            return col * self.kv_heads, (col + 1) * self.kv_heads
        first = col // (n // nkv)
        return first, first + 1

    @property
    def k_heads(self) -> int:
        return self.spec.linear_num_key_heads // self.cols

    @property
    def v_heads(self) -> int:
        return self.spec.linear_num_value_heads // self.cols

    @property
    def conv_dim(self) -> int:
        s = self.spec
        return 2 * self.k_heads * s.linear_key_head_dim + self.v_heads * s.linear_value_head_dim

    @property
    def vocab(self) -> int:
        return self.spec.vocab_size // self.degree

    def chip_shape(self, hw: HostWeight) -> tuple[int, ...]:
        """The per-chip shape of a laid-out weight (``layout``'s placements)."""
        s = list(hw.array.shape)
        if hw.mesh_dims is not None:
            for dim, ways in zip(hw.mesh_dims, self.mesh, strict=True):
                if dim is not None:
                    s[dim] //= ways
        elif hw.shard_dim is not None:
            s[hw.shard_dim] //= self.degree
        return tuple(s)

    # ---- host layout -----------------------------------------------------------------------
    def _attention_qkv_cols(self) -> list[np.ndarray]:
        s, hd = self.spec, self.spec.head_dim
        nh, nkv = s.num_attention_heads, s.num_kv_heads
        out = []
        for c in range(self.cols):
            a, b = self.kv_range(c)
            q = np.arange(c * self.heads * hd, (c + 1) * self.heads * hd)
            k = nh * hd + np.arange(a * hd, b * hd)
            v = (nh + nkv) * hd + np.arange(a * hd, b * hd)
            out.append(np.concatenate([q, k, v]))
        return out

    def _gdn_qkv_cols(self) -> list[np.ndarray]:
        s = self.spec
        kd = s.linear_num_key_heads * s.linear_key_head_dim
        kc = self.k_heads * s.linear_key_head_dim
        vc = self.v_heads * s.linear_value_head_dim
        return [
            np.concatenate(
                [
                    np.arange(c * kc, (c + 1) * kc),
                    kd + np.arange(c * kc, (c + 1) * kc),
                    2 * kd + np.arange(c * vc, (c + 1) * vc),
                ]
            )
            for c in range(self.cols)
        ]

    def _by_chip(self, cols: list[np.ndarray]) -> np.ndarray:
        """Per-column index blocks -> one index per stored column in row-major chip order:
        chip (r, c) takes the r-th of R equal pieces of column c's block."""
        pieces = [np.split(block, self.rows) for block in cols]
        return np.concatenate([pieces[c][r] for r in range(self.rows) for c in range(self.cols)])

    def _expert_down_cols(self, experts: int) -> list[np.ndarray]:
        inter = self.spec.moe_intermediate_size
        ic = inter // self.degree
        return [
            np.concatenate([g * inter + np.arange(c * ic, (c + 1) * ic) for g in range(experts)])
            for c in range(self.degree)
        ]

    def layout(self, laid: dict[str, HostWeight]) -> dict[str, HostWeight]:
        """Single-chip device layouts -> TP layouts: each weight placed as its entry of the
        device-weight table says (:meth:`place`)."""
        return {n: self.place(hw, slot(self.spec, n).weight.placement) for n, hw in laid.items()}

    def place(self, hw: HostWeight, placement: Placement) -> HostWeight:
        """``hw`` with its placement on this mesh (``shard_dim`` over all chips in row-major
        order, or ``mesh_dims`` per mesh axis; neither: replicated) and, for fused tensors, its
        columns in per-chip order."""
        P, two_d = Placement, self.rows > 1
        match placement:
            case P.REPLICATED:
                return hw
            case P.ATTENTION_QKV:
                return _take(hw, self._by_chip(self._attention_qkv_cols()), -1, -1)
            case P.GDN_QKV:
                return _take(hw, self._by_chip(self._gdn_qkv_cols()), -1, -1)
            case P.CONV_TAPS:
                taps = np.concatenate(self._gdn_qkv_cols())
                if two_d:
                    return _take(hw, taps, -1, None, (None, -1))
                return _take(hw, taps, -1, -1)
            case P.COLUMN_GATHERED if two_d:
                width = hw.array.shape[-1] // self.cols
                blocks = [np.arange(c * width, (c + 1) * width) for c in range(self.cols)]
                return _take(hw, self._by_chip(blocks), -1, -1)
            case P.MIXER_ROW:
                if two_d:
                    return dataclasses.replace(hw, mesh_dims=(-1, 0))
                return dataclasses.replace(hw, shard_dim=0)
            case P.COLUMN if two_d:
                return dataclasses.replace(hw, mesh_dims=(None, -1))
            case P.COLUMN | P.COLUMN_GATHERED | P.ALL_CHIPS_COLUMN:
                return dataclasses.replace(hw, shard_dim=-1)
            case P.ALL_CHIPS_ROW:
                return dataclasses.replace(hw, shard_dim=0)
            case P.EXPERTS:
                return dataclasses.replace(hw, shard_dim=1)  # [1, E, in, out]: by expert
            case P.EXPERT_INTER:
                return dataclasses.replace(hw, shard_dim=2)  # [1, G, I, H]: by I
            case P.EXPERT_DOWN:
                experts = hw.array.shape[-1] // self.spec.moe_intermediate_size
                down = np.concatenate(self._expert_down_cols(experts))
                return _take(hw, down, -1, -1)
        raise AssertionError(f"unplaced {placement}")


def _take(
    hw: HostWeight,
    idx: np.ndarray,
    axis: int,
    shard_dim: int | None,
    mesh_dims: tuple[int | None, int | None] | None = None,
) -> HostWeight:
    """``hw`` with the columns ``idx`` (in that order) along ``axis``."""
    if is_shape_only(hw.array):
        shape = list(hw.array.shape)
        shape[axis] = len(idx)
        return HostWeight(shape_only_array(tuple(shape)), hw.dtype, hw.layout, shard_dim, mesh_dims)
    taken = np.ascontiguousarray(np.take(hw.array, idx, axis=axis))
    return HostWeight(taken, hw.dtype, hw.layout, shard_dim, mesh_dims)
