"""Tensor parallelism over a 1 x N mesh (numpy only): how every layer splits across the chips.

The split is the one tt-metal's multi-chip models use (models/demos/blackhole/qwen36/tt/
tp_common.py ``shard_w``, models/tt_transformers/tt/attention.py and mlp.py):

* attention: q/k/v projections column-parallel by heads (chip c holds query heads
  [c·nh/N, (c+1)·nh/N) and their KV head group; when N exceeds the KV heads each KV head is
  replicated on the N/nkv chips whose query heads use it, qwen36's ``replicate_kv_weight``), the
  gate column-parallel, o_proj row-parallel;
* GDN: key and value heads column-parallel (chip c holds value heads [c·hv/N, ...) and the key
  heads they read, so the conv channels, conv taps, gates and recurrent state split with them),
  out_proj row-parallel;
* MLP, shared expert: gate/up column-parallel, down row-parallel; routed experts placed whole,
  chip c holding experts [c·E/N, (c+1)·E/N) (the sparse path, ``moe.py``: gate_up and down split
  on the expert dim; the dense reference path splits every expert by its intermediate dim);
* LM head by vocabulary (column-parallel); embedding, norms and the router replicated.

A row-parallel projection leaves partial sums on every chip; ``ccl.TensorParallelCCL.all_reduce``
sums them. The fused projections are stored per chip in the order the per-chip programs read
them ([q_c | k_c | v_c] columns, chip after chip), so sharding the stored tensor into N equal
contiguous chunks (``shard_tensor_to_mesh_mapper``) gives each chip exactly its block.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.weights import HostWeight, is_shape_only, shape_only_array

TILE = 32
# Last-dim suffixes of device weight names that split column-parallel (dim -1) or row-parallel
# (dim 0); every other weight is replicated.
COLUMN = (
    *("gate", "z", "b", "a", "dt_bias", "neg_a"),
    *("mlp.gate", "mlp.up", "shared.gate", "shared.up", "lm_head"),
)
ROW = ("o", "out", "mlp.down", "shared.down")


@dataclass(frozen=True)
class TensorParallel:
    """``degree`` chips in a line; per-chip head and width counts of ``spec``."""

    spec: ModelSpec
    degree: int

    @staticmethod
    def for_mesh(spec: ModelSpec, mesh: tuple[int, int]) -> TensorParallel:
        """The split over ``mesh``; ValueError naming the model's counts when it does not
        divide (heads, KV heads, GDN heads, widths that must stay whole tiles per chip)."""
        rows, cols = mesh
        if rows != 1:
            raise ValueError(
                f"tensor parallel runs on a 1 x N mesh (one CCL line); got {rows} x {cols}"
            )
        tp = TensorParallel(spec, cols)
        tp.check()
        return tp

    def check(self) -> None:
        s, n = self.spec, self.degree
        problems = []

        def need(ok: bool, what: str) -> None:
            if not ok:
                problems.append(what)

        need(s.num_attention_heads % n == 0, f"attention heads {s.num_attention_heads} % {n}")
        nkv = s.num_kv_heads
        need(nkv % n == 0 or n % nkv == 0, f"KV heads {nkv} neither divide nor are divided by {n}")
        need(s.linear_num_key_heads % n == 0, f"GDN key heads {s.linear_num_key_heads} % {n}")
        need(s.linear_num_value_heads % n == 0, f"GDN value heads {s.linear_num_value_heads} % {n}")
        need(s.hidden_size % (TILE * n) == 0, f"hidden {s.hidden_size} % (32 x {n})")
        need(s.vocab_size % n == 0, f"vocab {s.vocab_size} % {n}")
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
                f"{s.model_id or 'the model'} does not split over a 1 x {n} mesh: "
                + "; ".join(problems)
                + f" (attention {s.num_attention_heads} heads / {nkv} KV heads, GDN "
                f"{s.linear_num_key_heads} key / {s.linear_num_value_heads} value heads)"
            )

    # ---- per-chip counts -------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return self.spec.num_attention_heads // self.degree

    @property
    def kv_heads(self) -> int:
        """KV heads per chip: a share, or one replicated head when chips outnumber them."""
        return max(1, self.spec.num_kv_heads // self.degree)

    def kv_range(self, chip: int) -> tuple[int, int]:
        nkv, n = self.spec.num_kv_heads, self.degree
        if n <= nkv:
            return chip * self.kv_heads, (chip + 1) * self.kv_heads
        first = chip // (n // nkv)
        return first, first + 1

    @property
    def k_heads(self) -> int:
        return self.spec.linear_num_key_heads // self.degree

    @property
    def v_heads(self) -> int:
        return self.spec.linear_num_value_heads // self.degree

    @property
    def conv_dim(self) -> int:
        s = self.spec
        return 2 * self.k_heads * s.linear_key_head_dim + self.v_heads * s.linear_value_head_dim

    @property
    def vocab(self) -> int:
        return self.spec.vocab_size // self.degree

    # ---- host layout -----------------------------------------------------------------------
    def _attention_qkv_cols(self) -> list[np.ndarray]:
        s, hd = self.spec, self.spec.head_dim
        nh, nkv = s.num_attention_heads, s.num_kv_heads
        out = []
        for c in range(self.degree):
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
            for c in range(self.degree)
        ]

    def _expert_down_cols(self, experts: int) -> list[np.ndarray]:
        inter = self.spec.moe_intermediate_size
        ic = inter // self.degree
        return [
            np.concatenate([g * inter + np.arange(c * ic, (c + 1) * ic) for g in range(experts)])
            for c in range(self.degree)
        ]

    def layout(self, laid: dict[str, HostWeight]) -> dict[str, HostWeight]:
        """Single-chip device layouts -> TP layouts: each weight with its ``shard_dim`` (None:
        replicated) and, for fused tensors, its columns in per-chip order."""
        out: dict[str, HostWeight] = {}
        attn = set(self.spec.attention_layers)
        for name, hw in laid.items():
            layer, _, field = name.partition(".")
            key = field if layer.isdigit() else name
            kind = "attn" if layer.isdigit() and int(layer) in attn else "gdn"
            if key == "qkv":
                cols = self._attention_qkv_cols() if kind == "attn" else self._gdn_qkv_cols()
                out[name] = _take(hw, np.concatenate(cols), -1, -1)
            elif key.startswith("tap"):
                out[name] = _take(hw, np.concatenate(self._gdn_qkv_cols()), -1, -1)
            elif key in ("experts.gate_up", "experts.down"):
                out[name] = dataclasses.replace(hw, shard_dim=1)  # [1, E, in, out]: by expert
            elif key.startswith("experts.") and key.endswith((".gate", ".up")):
                out[name] = dataclasses.replace(hw, shard_dim=2)  # [1, G, I, H]: by I
            elif key.startswith("experts.") and key.endswith(".down"):
                experts = hw.array.shape[-1] // self.spec.moe_intermediate_size
                down = np.concatenate(self._expert_down_cols(experts))
                out[name] = _take(hw, down, -1, -1)
            elif key in COLUMN:
                out[name] = dataclasses.replace(hw, shard_dim=-1)
            elif key in ROW:
                out[name] = dataclasses.replace(hw, shard_dim=0)
            else:
                out[name] = hw
        return out


def _take(hw: HostWeight, idx: np.ndarray, axis: int, shard_dim: int) -> HostWeight:
    """``hw`` with the columns ``idx`` (in that order) along ``axis``."""
    if is_shape_only(hw.array):
        shape = list(hw.array.shape)
        shape[axis] = len(idx)
        return HostWeight(shape_only_array(tuple(shape)), hw.dtype, hw.layout, shard_dim)
    taken = np.ascontiguousarray(np.take(hw.array, idx, axis=axis))
    return HostWeight(taken, hw.dtype, hw.layout, shard_dim)
