"""Host weights: float32 arrays with the dtype and layout they take on the device (numpy only).

A weight known by its shape only (planning a real-size model from a folder holding only its
``config.json``) is a zero-stride array: it owns no memory, and every layout step keeps it so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tt_serve.model.spec import ModelSpec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class HostWeight:
    array: np.ndarray  # float32 (rounded by ttnn to ``dtype``)
    dtype: str
    layout: str
    shard_dim: int | None = (
        None  # on a mesh: split on this dim, one chunk per chip (layout/parallel.py)
    )
    # on a 2-D mesh: the dim split over the mesh rows and the one over the columns (None:
    # replicated on that axis), ``ttnn.ShardTensor2dMesh``'s ``dims`` (layout/parallel.py)
    mesh_dims: tuple[int | None, int | None] | None = None


def shape_only_array(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only float32 array of ``shape`` that owns no memory (every stride 0): a weight
    known by its shape only (``shape_only_weights``)."""
    return np.broadcast_to(np.zeros((), np.float32), shape)


def is_shape_only(a: np.ndarray) -> bool:
    return a.size > 1 and not any(a.strides)


def contiguous(a: np.ndarray) -> np.ndarray:
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


def to_numpy(weights: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {n: t.detach().float().cpu().numpy() for n, t in weights.items()}
