"""Device weights: the laid-out host weights uploaded once, with an on-disk cache of the
converted tensors.

The layout itself is numpy (``layout/checkpoint.py``, ``layout/parallel.py``); this module turns
it into device tensors. The cache folder holds one ``.tensorbin`` per tensor
(``ttnn.dump_tensor``) and a manifest keyed by the checkpoint id, the precision and this file's
format version; a stale key is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.checkpoint import layout_weights
from tt_serve.model.tt.layout.experts import MoeDispatch
from tt_serve.model.tt.layout.host import is_shape_only
from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.precision import Precision

if TYPE_CHECKING:
    from tt_serve.model.tt.layout.parallel import TensorParallel

FORMAT_VERSION = 4  # 3: stacked expert groups (tt/runtime/moe.py); 4: the sparse expert layout
CACHE_ENV = "TT_SERVE_TTNN_WEIGHT_CACHE"


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
    replicated or sharded as ``layout/parallel.py`` lays it out; the cache is not used there yet (its
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
