"""Weight conversion to ttnn layouts, once, with an on-disk cache of the converted tensors.

Canonical checkpoint tensors (``model/weights.py``) become host ttnn tensors laid out the way the
device ops want them: linear weights transposed to [in, out] TILE in the group's precision, the
attention q projection split into its query and gate halves, Qwen RMSNorm weights stored as
``1 + w``, GDN conv taps as four [1, 1, 1, C] vectors (oldest first), the gate constants
``dt_bias`` and ``-exp(A_log)`` in fp32, embeddings ROW_MAJOR, MoE experts in sparse_matmul's
[1, E, in, out] layout (:func:`sparse_experts`; the dense reference path stacks them per group,
:func:`stacked_experts`). The numpy layout step is separate
from the ttnn step so that ``tests/tt_host`` can check it against the real ``ttnn.Tensor``.

The cache folder holds one ``.tensorbin`` per tensor (``ttnn.dump_tensor``) and a manifest keyed
by the checkpoint id, the precision and this file's format version; a stale key is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tt_serve.model.spec import FULL_ATTENTION, ModelSpec
from tt_serve.model.tt.moe import DISPATCHES, MoeDispatch, expert_groups
from tt_serve.model.tt.ops import ROW_MAJOR, TILE, Ops, Tensor
from tt_serve.model.tt.precision import Precision

if TYPE_CHECKING:
    import torch

    from tt_serve.model.tt.parallel import TensorParallel

FORMAT_VERSION = 4  # 3: stacked expert groups (tt/moe.py); 4: the sparse expert layout
CACHE_ENV = "TT_SERVE_TTNN_WEIGHT_CACHE"


@dataclass(frozen=True)
class HostWeight:
    array: np.ndarray  # float32 (rounded by ttnn to ``dtype``)
    dtype: str
    layout: str
    shard_dim: int | None = None  # on a mesh: split on this dim, one chunk per chip (parallel.py)
    # on a 2-D mesh: the dim split over the mesh rows and the one over the columns (None:
    # replicated on that axis), ``ttnn.ShardTensor2dMesh``'s ``dims`` (parallel.py)
    mesh_dims: tuple[int | None, int | None] | None = None


def shape_only_array(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only float32 array of ``shape`` that owns no memory (every stride 0): a weight
    known by its shape only (``shape_only_weights``)."""
    return np.broadcast_to(np.zeros((), np.float32), shape)


def is_shape_only(a: np.ndarray) -> bool:
    return a.size > 1 and not any(a.strides)


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if is_shape_only(a) else np.ascontiguousarray(a)


def concat_rows(parts: list[np.ndarray]) -> np.ndarray:
    """torch-layout [out, in] matrices stacked along out (a shape-only result for shape-only
    parts, so planning a real-size model allocates nothing)."""
    if all(is_shape_only(a) for a in parts):
        return shape_only_array((sum(a.shape[0] for a in parts), *parts[0].shape[1:]))
    return np.concatenate(parts, axis=0)


def shape_only_weights(spec: ModelSpec) -> dict[str, np.ndarray]:
    """Every canonical tensor the backend loads (``model/weights.py``), as shape-only arrays:
    the planner converts them by the normal weight path (device tensors of the profile's dtypes,
    DRAM charged as for real weights) from a folder holding only ``config.json``."""
    from tt_serve.model.weights import expected_shapes

    fused = {
        f"layers.{i}.mlp.experts.gate_up_proj"
        for i in range(spec.num_layers)
        if spec.is_moe_layer(i)
    }
    shapes = expected_shapes(spec, fused)
    shapes.setdefault("lm_head.weight", shapes["embed_tokens.weight"])
    for i in spec.gdn_layers:
        conv = f"layers.{i}.linear_attn.conv1d.weight"
        channels, _, kernel = shapes[conv]
        shapes[conv] = (channels, kernel)  # canonical [C, K]
    return {n: shape_only_array(s) for n, s in shapes.items()}


def linear_t(w: np.ndarray) -> np.ndarray:
    """torch [out, in] -> ttnn [in, out]."""
    return _contiguous(w.T)


def norm_weight(w: np.ndarray, *, plus_one: bool) -> np.ndarray:
    """[dim] -> [1, 1, dim/32, 32] ROW_MAJOR, the ttnn RMSNorm weight layout."""
    v = (1.0 + w) if plus_one else w
    return v.astype(np.float32).reshape(1, 1, -1, 32)


def split_q_gate(q_proj: np.ndarray, heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows come per head as [q | gate]; return (q [heads·hd, H], gate [heads·hd, H])."""
    per = q_proj.reshape(heads, 2 * head_dim, -1)
    h = q_proj.shape[-1]
    return per[:, :head_dim].reshape(-1, h), per[:, head_dim:].reshape(-1, h)


def conv_taps(conv: np.ndarray) -> list[np.ndarray]:
    """conv [C, K] -> K taps [1, 1, 1, C]; tap 0 multiplies the oldest input."""
    return [_contiguous(conv[:, j]).reshape(1, 1, 1, -1) for j in range(conv.shape[1])]


def layout_weights(
    spec: ModelSpec,
    w: dict[str, np.ndarray],
    precision: Precision,
    moe_dispatch: MoeDispatch = "sparse",
) -> dict[str, HostWeight]:
    """Canonical float32 arrays -> device layouts (pure numpy); MoE experts as
    ``moe_dispatch``'s path reads them."""
    if moe_dispatch not in DISPATCHES:
        raise ValueError(f"moe_dispatch={moe_dispatch!r}; choose one of {DISPATCHES}")
    p = precision
    out: dict[str, HostWeight] = {
        "embed": HostWeight(w["embed_tokens.weight"], "bfloat16", ROW_MAJOR),
        "norm": HostWeight(norm_weight(w["norm.weight"], plus_one=True), "bfloat16", ROW_MAJOR),
        "lm_head": HostWeight(linear_t(w["lm_head.weight"]), p.lm_head, TILE),
    }

    def put(name: str, hw: HostWeight) -> None:
        if name in out:
            raise ValueError(f"two weights map to the device name {name!r}")
        out[name] = hw

    def lin(name: str, key: str, dtype: str) -> None:
        put(name, HostWeight(linear_t(w[key]), dtype, TILE))

    def norm(name: str, key: str, plus_one: bool = True) -> None:
        put(name, HostWeight(norm_weight(w[key], plus_one=plus_one), "bfloat16", ROW_MAJOR))

    for i, kind in enumerate(spec.layer_types):
        s, L = f"layers.{i}.", f"{i}."
        norm(L + "input_norm", s + "input_layernorm.weight")
        norm(L + "post_norm", s + "post_attention_layernorm.weight")
        if kind == FULL_ATTENTION:
            a = s + "self_attn."
            q, gate = split_q_gate(w[a + "q_proj.weight"], spec.num_attention_heads, spec.head_dim)
            # q, k, v fused as [q | k | v] columns: one matmul, and the layout
            # nlp_create_qkv_heads splits into head-major heads
            qkv = concat_rows([q, w[a + "k_proj.weight"], w[a + "v_proj.weight"]])
            put(L + "qkv", HostWeight(linear_t(qkv), p.attention, TILE))
            put(L + "gate", HostWeight(linear_t(gate), p.attention, TILE))
            lin(L + "o", a + "o_proj.weight", p.attention)
            norm(L + "q_norm", a + "q_norm.weight")
            norm(L + "k_norm", a + "k_norm.weight")
        else:
            g = s + "linear_attn."
            for n in ("qkv", "z", "b", "a"):
                lin(L + n, g + f"in_proj_{n}.weight", p.gdn)
            lin(L + "out", g + "out_proj.weight", p.gdn)
            norm(L + "gdn_norm", g + "norm.weight", plus_one=False)
            for j, tap in enumerate(conv_taps(w[g + "conv1d.weight"])):
                out[L + f"tap{j}"] = HostWeight(tap, "bfloat16", TILE)
            hv = spec.linear_num_value_heads
            dt = w[g + "dt_bias"].astype(np.float32).reshape(1, 1, hv)
            neg_a = (-np.exp(w[g + "A_log"].astype(np.float32))).reshape(1, 1, hv)
            out[L + "dt_bias"] = HostWeight(dt, "float32", TILE)
            out[L + "neg_a"] = HostWeight(neg_a, "float32", TILE)
        m = s + "mlp."
        if spec.is_moe_layer(i):
            _moe(out, w, m, L, spec, p, moe_dispatch)
        else:
            for n in ("gate", "up", "down"):
                lin(L + f"mlp.{n}", m + f"{n}_proj.weight", p.mlp)
    return out


def stacked_experts(
    gate_up: np.ndarray, down: np.ndarray, first: int, end: int, inter: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Experts [first, end) of the fused checkpoint tensors (gate_up [E, 2I, H], down [E, H, I])
    as the stacked operands of ``tt/moe.py``: gate and up [1, G, I, H] (the checkpoint's own
    [out, in] orientation: they are the matmul's A), down [1, 1, H, G·I] with expert g's [H, I]
    in column block g."""
    g, h = end - first, gate_up.shape[-1]
    if is_shape_only(gate_up):
        return (
            shape_only_array((1, g, inter, h)),
            shape_only_array((1, g, inter, h)),
            shape_only_array((1, 1, h, g * inter)),
        )
    gate = np.ascontiguousarray(gate_up[first:end, :inter])[None]
    up = np.ascontiguousarray(gate_up[first:end, inter:])[None]
    cat = np.ascontiguousarray(down[first:end].transpose(1, 0, 2)).reshape(1, 1, h, g * inter)
    return gate, up, cat


def sparse_experts(gate_up: np.ndarray, down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fused checkpoint tensors (gate_up [E, 2I, H], down [E, H, I]) as sparse_matmul's B
    operands ([in, out] per expert): gate_up [1, E, H, 2I] (columns [0, I) gate, [I, 2I) up) and
    down [1, E, I, H]; on a mesh both split on the expert dim (whole experts per chip)."""
    e, two_i, h = gate_up.shape
    if is_shape_only(gate_up):
        return shape_only_array((1, e, h, two_i)), shape_only_array((1, e, two_i // 2, h))
    return (
        np.ascontiguousarray(gate_up.transpose(0, 2, 1))[None],
        np.ascontiguousarray(down.transpose(0, 2, 1))[None],
    )


def _moe(
    out: dict[str, HostWeight],
    w: dict[str, np.ndarray],
    m: str,
    L: str,
    spec: ModelSpec,
    p: Precision,
    moe_dispatch: MoeDispatch,
) -> None:
    inter = spec.moe_intermediate_size
    out[L + "router"] = HostWeight(linear_t(w[m + "gate.weight"]), "bfloat16", TILE)
    gate_up, down = w[m + "experts.gate_up_proj"], w[m + "experts.down_proj"]
    if moe_dispatch == "sparse":
        gu, dn = sparse_experts(gate_up, down)
        out[L + "experts.gate_up"] = HostWeight(gu, p.experts, TILE)
        out[L + "experts.down"] = HostWeight(dn, p.experts, TILE)
    for j, (first, end) in enumerate(
        expert_groups(spec.num_experts, inter) if moe_dispatch == "dense" else []
    ):
        gate, up, cat = stacked_experts(gate_up, down, first, end, inter)
        out[L + f"experts.{j}.gate"] = HostWeight(gate, p.experts, TILE)
        out[L + f"experts.{j}.up"] = HostWeight(up, p.experts, TILE)
        out[L + f"experts.{j}.down"] = HostWeight(cat, p.experts, TILE)
    for n in ("gate", "up", "down"):
        key = m + f"shared_expert.{n}_proj.weight"
        out[L + f"shared.{n}"] = HostWeight(linear_t(w[key]), p.mlp, TILE)
    out[L + "shared_gate"] = HostWeight(
        linear_t(w[m + "shared_expert_gate.weight"]), "bfloat16", TILE
    )


def to_numpy(weights: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {n: t.detach().float().cpu().numpy() for n, t in weights.items()}


def cache_key(spec: ModelSpec, precision: Precision, moe_dispatch: MoeDispatch = "sparse") -> str:
    text = f"v{FORMAT_VERSION}|{spec.model_id}|{spec.num_layers}|{precision.key()}"
    if spec.num_experts:
        text += f"|moe={moe_dispatch}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def default_cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "tt-serve" / "ttnn-weights"


def load_device_weights(
    ops: Ops,
    spec: ModelSpec,
    precision: Precision,
    source: Callable[[], dict[str, np.ndarray]],
    cache_dir: Path | None,
    tp: TensorParallel | None = None,
    moe_dispatch: MoeDispatch = "sparse",
) -> dict[str, Tensor]:
    """Device weights from the cache when its key matches, else converted from ``source()``
    (and written to the cache when a folder is given). With ``tp`` (a mesh) each weight is
    replicated or sharded as ``parallel.py`` lays it out; the cache is not used there yet (its
    files hold one chip's tensors, and ``as_tensor``'s cache key ignores the mapper)."""
    if tp is not None and tp.degree > 1:
        laid = tp.layout(layout_weights(spec, source(), precision, moe_dispatch))
        return {
            n: ops.zeros(tp.chip_shape(hw), hw.dtype, hw.layout)
            if is_shape_only(hw.array)
            else ops.upload(
                hw.array, hw.dtype, hw.layout, shard_dim=hw.shard_dim, mesh_dims=hw.mesh_dims
            )
            for n, hw in laid.items()
        }
    key = cache_key(spec, precision, moe_dispatch)
    folder = cache_dir / key if cache_dir is not None else None
    manifest = folder / "manifest.json" if folder is not None else None
    if manifest is not None and manifest.exists():
        meta: dict[str, Any] = json.loads(manifest.read_text())
        if meta.get("key") == key:
            assert folder is not None
            return {
                n: ops.load_tensor(folder / f"{i}.tensorbin") for i, n in enumerate(meta["names"])
            }
    laid = layout_weights(spec, source(), precision, moe_dispatch)
    if any(is_shape_only(hw.array) for hw in laid.values()):
        # Shape-only weights (planning): allocate device tensors of the same shape, dtype and
        # layout, with no host data; the cache is not written.
        return {
            n: ops.upload(hw.array, hw.dtype, hw.layout)
            if not is_shape_only(hw.array)
            else ops.zeros(hw.array.shape, hw.dtype, hw.layout)
            for n, hw in laid.items()
        }
    host = {n: ops.host(hw.array, hw.dtype, hw.layout) for n, hw in laid.items()}
    if folder is not None and manifest is not None:
        folder.mkdir(parents=True, exist_ok=True)
        names = sorted(host)
        for i, n in enumerate(names):
            ops.dump(folder / f"{i}.tensorbin", host[n])
        manifest.write_text(json.dumps({"key": key, "names": names}))
    return {n: ops.to_device(t) for n, t in host.items()}
