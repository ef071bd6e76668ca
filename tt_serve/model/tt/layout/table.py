"""Every device weight, declared once: name, checkpoint keys, transform, precision group, layout,
mesh placement and the planner's report group.

``checkpoint.layout_weights`` builds the host weights from this table, ``parallel.TensorParallel``
places each on a mesh by its entry's :class:`Placement`, the planner sums DRAM by its entry's
group, and the runtime model reads the device names declared here. A weight is added, renamed
or re-placed here and nowhere else.

Names: model-level weights by their own name ("embed"), per-layer ones as ``"{layer}." + name``
("3.qkv"); a name with ``{j}`` is one weight per index (conv taps, the dense path's expert
groups). Checkpoint keys of per-layer weights are relative to ``"layers.{layer}."``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from tt_serve.model.precision import Precision
from tt_serve.model.spec import FULL_ATTENTION, ModelSpec
from tt_serve.model.tt.layout import ROW_MAJOR, TILE
from tt_serve.model.tt.layout import transforms as tf
from tt_serve.model.tt.layout.experts import DISPATCHES, MoeDispatch, expert_groups
from tt_serve.model.tt.layout.host import concat_rows

# (checkpoint arrays in ``keys`` order, the model, the index j of a ``{j}`` name) -> host array
Transform = Callable[[Sequence[np.ndarray], ModelSpec, int], np.ndarray]
# Which layers carry a weight: "model" (one for the model), "layer" (every layer), the mixer
# kind ("attention", "gdn") or the MLP kind ("mlp": dense, "moe").
Layers = Literal["model", "layer", "attention", "gdn", "mlp", "moe"]
Group = Literal["attention", "gdn", "mlp", "experts", "embed", "lm_head", "norms"]
# The ``Precision`` fields a weight may take its dtype from; any other value is a fixed dtype.
PRECISION_GROUPS = ("attention", "gdn", "mlp", "experts", "lm_head")


class Placement(Enum):
    """How a weight splits over a ROWS x COLS mesh (``parallel.py``'s module docstring has the
    why of each; ``TensorParallel.place`` does it)."""

    REPLICATED = "replicated"
    # heads over the columns (1-D: every chip), replicated over the rows (GDN b, a, gates)
    COLUMN = "column"
    # column-parallel mixer projection: on 2-D each column's block also cut over the rows and
    # all-gathered on axis 0 after the matmul (attention gate, GDN z)
    COLUMN_GATHERED = "column-gathered"
    # fused q/k/v: column-gathered, columns reordered to [q_c | k_c | v_c] chip after chip
    ATTENTION_QKV = "attention-qkv"
    GDN_QKV = "gdn-qkv"
    # conv taps: column in the GDN qkv channel order, replicated over the rows
    CONV_TAPS = "conv-taps"
    # mixer output: input over the columns (heads); on 2-D the output (hidden) over the rows
    MIXER_ROW = "mixer-row"
    # column- / row-parallel over all R·C chips in row-major order (MLP, LM head)
    ALL_CHIPS_COLUMN = "all-chips-column"
    ALL_CHIPS_ROW = "all-chips-row"
    # routed experts [1, E, in, out] by expert (the sparse path: whole experts per chip)
    EXPERTS = "experts"
    # the dense path's stacked gate/up [1, G, I, H] by each expert's intermediate dim
    EXPERT_INTER = "expert-inter"
    # the dense path's stacked down [1, 1, H, G·I] by each expert's intermediate dim
    EXPERT_DOWN = "expert-down"


@dataclass(frozen=True)
class DeviceWeight:
    """One kind of device weight (see the module docstring for names and keys)."""

    name: str
    keys: tuple[str, ...]
    transform: Transform
    precision: str  # a PRECISION_GROUPS field of ``Precision``, or a fixed dtype
    layout: str
    placement: Placement
    group: Group
    layers: Layers = "model"
    each: Literal["tap", "expert_group"] | None = None  # what ``{j}`` runs over
    dispatch: MoeDispatch | None = None  # routed experts: only in this dispatch's layout

    def dtype(self, precision: Precision) -> str:
        """Its ttnn dtype under the profile ``precision``."""
        if self.precision in PRECISION_GROUPS:
            return str(getattr(precision, self.precision))
        return self.precision

    def carried_by(self, spec: ModelSpec, layer: int) -> bool:
        """Whether layer ``layer`` of ``spec`` has this (per-layer) weight."""
        attention = spec.layer_types[layer] == FULL_ATTENTION
        return {
            "layer": True,
            "attention": attention,
            "gdn": not attention,
            "mlp": not spec.is_moe_layer(layer),
            "moe": spec.is_moe_layer(layer),
        }[self.layers]

    def count(self, spec: ModelSpec) -> int:
        """Instances of a ``{j}`` name (1 for a plain one)."""
        if self.each == "tap":
            return spec.conv_kernel
        if self.each == "expert_group":
            return len(expert_groups(spec.num_experts, spec.moe_intermediate_size))
        return 1


@dataclass(frozen=True)
class Slot:
    """One device weight of one model: its name, table entry, layer and ``{j}`` index."""

    name: str
    weight: DeviceWeight
    layer: int | None
    index: int = 0

    def checkpoint_keys(self) -> tuple[str, ...]:
        """The checkpoint keys it is built from."""
        prefix = "" if self.layer is None else f"layers.{self.layer}."
        return tuple(prefix + k for k in self.weight.keys)


# ---- transforms of several arrays or of the model --------------------------------------------
def _lin(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.linear_t(a[0])


def _norm(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.norm_weight(a[0], plus_one=True)  # Qwen RMSNorm scales by 1 + w


def _plain_norm(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.norm_weight(a[0], plus_one=False)  # the GDN output norm scales by w itself


def _same(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return a[0]


def _qkv(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    # q, k, v fused as [q | k | v] columns: one matmul, and the layout nlp_create_qkv_heads
    # splits into head-major heads
    q, _ = tf.split_q_gate(a[0], s.num_attention_heads, s.head_dim)
    return tf.linear_t(concat_rows([q, a[1], a[2]]))


def _gate(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.linear_t(tf.split_q_gate(a[0], s.num_attention_heads, s.head_dim)[1])


def _tap(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.conv_tap(a[0], j)


def _vector(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.head_vector(a[0])


def _neg_exp(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.head_vector(-np.exp(a[0].astype(np.float32)))  # the decay rate -exp(A_log)


def _stacked(part: str) -> Transform:
    def build(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
        first, end = expert_groups(s.num_experts, s.moe_intermediate_size)[j]
        return tf.stacked_expert_part(a[0], a[1], first, end, s.moe_intermediate_size, part)

    return build


def _sparse_gate_up(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.sparse_gate_up(a[0])


def _sparse_down(a: Sequence[np.ndarray], s: ModelSpec, j: int) -> np.ndarray:
    return tf.sparse_down(a[0])


# ---- the table ---------------------------------------------------------------------------------
P = Placement
_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _w(
    name: str,
    keys: str | tuple[str, ...],
    transform: Transform,
    precision: str,
    placement: Placement,
    group: Group,
    layers: Layers = "model",
    *,
    layout: str = TILE,
    each: Literal["tap", "expert_group"] | None = None,
    dispatch: MoeDispatch | None = None,
) -> DeviceWeight:
    keys = (keys,) if isinstance(keys, str) else keys
    return DeviceWeight(
        name, keys, transform, precision, layout, placement, group, layers, each, dispatch
    )


def _norm_w(name: str, key: str, layers: Layers, transform: Transform = _norm) -> DeviceWeight:
    return _w(name, key, transform, "bfloat16", P.REPLICATED, "norms", layers, layout=ROW_MAJOR)


def _attn(name: str, projs: tuple[str, ...], transform: Transform, p: Placement) -> DeviceWeight:
    keys = tuple(f"self_attn.{k}.weight" for k in projs)
    return _w(name, keys, transform, "attention", p, "attention", "attention")


def _gdn(
    name: str,
    key: str,
    p: Placement,
    transform: Transform = _lin,
    precision: str = "gdn",
    **kw: Any,
) -> DeviceWeight:
    return _w(name, f"linear_attn.{key}", transform, precision, p, "gdn", "gdn", **kw)


def _mlp(name: str, key: str, layers: Layers) -> DeviceWeight:
    p = P.ALL_CHIPS_ROW if name.endswith("down") else P.ALL_CHIPS_COLUMN
    return _w(name, key, _lin, "mlp", p, "mlp", layers)


def _stacked_w(part: str) -> DeviceWeight:
    p = P.EXPERT_DOWN if part == "down" else P.EXPERT_INTER
    return _w(
        f"experts.{{j}}.{part}",
        _EXPERTS,
        _stacked(part),
        "experts",
        p,
        "experts",
        "moe",
        each="expert_group",
        dispatch="dense",
    )


TABLE: tuple[DeviceWeight, ...] = (
    _w("embed", "embed_tokens.weight", _same, "bfloat16", P.REPLICATED, "embed", layout=ROW_MAJOR),
    _norm_w("norm", "norm.weight", "model"),
    _w("lm_head", "lm_head.weight", _lin, "lm_head", P.ALL_CHIPS_COLUMN, "lm_head"),
    _norm_w("input_norm", "input_layernorm.weight", "layer"),
    _norm_w("post_norm", "post_attention_layernorm.weight", "layer"),
    # gated full attention
    _attn("qkv", ("q_proj", "k_proj", "v_proj"), _qkv, P.ATTENTION_QKV),
    _attn("gate", ("q_proj",), _gate, P.COLUMN_GATHERED),
    _attn("o", ("o_proj",), _lin, P.MIXER_ROW),
    _norm_w("q_norm", "self_attn.q_norm.weight", "attention"),
    _norm_w("k_norm", "self_attn.k_norm.weight", "attention"),
    # Gated DeltaNet
    _gdn("qkv", "in_proj_qkv.weight", P.GDN_QKV),
    _gdn("z", "in_proj_z.weight", P.COLUMN_GATHERED),
    _gdn("b", "in_proj_b.weight", P.COLUMN),
    _gdn("a", "in_proj_a.weight", P.COLUMN),
    _gdn("out", "out_proj.weight", P.MIXER_ROW),
    _norm_w("gdn_norm", "linear_attn.norm.weight", "gdn", _plain_norm),
    _gdn("tap{j}", "conv1d.weight", P.CONV_TAPS, _tap, "bfloat16", each="tap"),
    # the gate constants stay fp32 (the state blows up in low precision: precision.py)
    _gdn("dt_bias", "dt_bias", P.COLUMN, _vector, "float32"),
    _gdn("neg_a", "A_log", P.COLUMN, _neg_exp, "float32"),
    # MoE: router, routed experts (one layout per dispatch path), gated shared expert
    _w("router", "mlp.gate.weight", _lin, "bfloat16", P.REPLICATED, "mlp", "moe"),
    *(
        _w(f"experts.{n}", k, t, "experts", P.EXPERTS, "experts", "moe", dispatch="sparse")
        for n, k, t in (
            ("gate_up", _EXPERTS[0], _sparse_gate_up),
            ("down", _EXPERTS[1], _sparse_down),
        )
    ),
    *(_stacked_w(part) for part in ("gate", "up", "down")),
    *(
        _mlp(f"shared.{n}", f"mlp.shared_expert.{n}_proj.weight", "moe")
        for n in ("gate", "up", "down")
    ),
    _w(
        "shared_gate", "mlp.shared_expert_gate.weight", _lin, "bfloat16", P.REPLICATED, "mlp", "moe"
    ),
    # dense MLP
    *(_mlp(f"mlp.{n}", f"mlp.{n}_proj.weight", "mlp") for n in ("gate", "up", "down")),
)


def slots(spec: ModelSpec, moe_dispatch: MoeDispatch = "sparse") -> Iterator[Slot]:
    """Every device weight of ``spec`` as ``moe_dispatch``'s path reads it, model-level first,
    then layer by layer in table order; a run of ``{j}`` entries goes index by index (a dense
    expert group's gate, up and down together)."""
    for w in TABLE:
        if w.layers == "model":
            yield Slot(w.name, w, None)
    for i in range(spec.num_layers):
        kinds = [
            w
            for w in TABLE
            if w.layers != "model" and w.carried_by(spec, i) and w.dispatch in (None, moe_dispatch)
        ]
        for _, same_index in itertools.groupby(kinds, key=lambda w: w.each):
            run = list(same_index)
            for j in range(run[0].count(spec)):
                for w in run:
                    yield Slot(f"{i}." + w.name.format(j=j), w, i, j)


@lru_cache(maxsize=16)
def slot_map(spec: ModelSpec) -> dict[str, Slot]:
    """Device name -> its slot, over both dispatch paths (their expert names differ); a name
    declared twice is an error."""
    out: dict[str, Slot] = {}
    for d in DISPATCHES:
        for s in slots(spec, d):
            if out.setdefault(s.name, s) is not s and out[s.name].weight is not s.weight:
                raise ValueError(f"two table entries name the device weight {s.name!r}")
    return out


def slot(spec: ModelSpec, name: str) -> Slot:
    """The slot of device weight ``name`` of ``spec`` (KeyError naming it when none is)."""
    try:
        return slot_map(spec)[name]
    except KeyError:
        raise KeyError(
            f"{name!r} is not a device weight of {spec.model_id or 'the model'}"
        ) from None


def checkpoint_dtypes(
    spec: ModelSpec, precision: Precision, moe_dispatch: MoeDispatch = "sparse"
) -> dict[str, str]:
    """Checkpoint key -> the dtype the card stores it in under ``precision``: the table read
    from the other side, for a backend that holds the checkpoint's own tensors (the torch
    backend's ``--precision``). Two device weights built from one key (q_proj: attention's
    q and gate) must agree; a key no device weight reads is absent."""
    out: dict[str, str] = {}
    for s in slots(spec, moe_dispatch):
        dtype = s.weight.dtype(precision)
        for key in s.checkpoint_keys():
            if out.setdefault(key, dtype) != dtype:
                raise ValueError(f"{key} is stored as both {out[key]} and {dtype}")
    return out
