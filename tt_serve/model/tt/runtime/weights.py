"""Device weights: the laid-out host weights uploaded once, through the converted-weight cache
(``weight_cache.py``) when one is given.

The layout itself is numpy (``layout/checkpoint.py``, ``layout/parallel.py``); this module turns
it into device tensors. A cache hit loads the tensor files onto the device or mesh as they were
written (a sharded weight with every chip's shard, a replicated one once): the checkpoint is not
read and nothing is laid out or converted again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from tt_serve.model.precision import Precision
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.checkpoint import layout_weights
from tt_serve.model.tt.layout.experts import MoeDispatch
from tt_serve.model.tt.layout.host import is_shape_only
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.runtime.weight_cache import WeightCache

log = logging.getLogger(__name__)


def load_device_weights(
    ops: Ops,
    spec: ModelSpec,
    precision: Precision,
    source: Callable[[], dict[str, np.ndarray]],
    cache: WeightCache | None,
    tp: TensorParallel,
    moe_dispatch: MoeDispatch = "sparse",
) -> dict[str, Tensor]:
    """Device weights from the cache when it holds this key, else converted from ``source()``
    (canonical checkpoint arrays) and, with a cache, written to it. With ``tp`` (a mesh) each
    weight is replicated or sharded as its table entry places it (``layout/parallel.py``).
    A cache that cannot be written (a full disk) is skipped with a warning."""
    entry = cache.entry(spec, precision, moe_dispatch, tp) if cache is not None else None
    names = entry.names() if entry is not None else None
    if entry is not None and names is not None:
        return {n: ops.load_tensor(entry.file(i)) for i, n in enumerate(names)}
    laid = layout_weights(spec, source(), precision, moe_dispatch, tp)
    if entry is None or any(is_shape_only(hw.array) for hw in laid.values()):
        # No cache, or shape-only weights (planning, mock boxes): device tensors of the same
        # shape, dtype and layout, the shape-only ones allocated with no host data or fill;
        # nothing is written.
        return {
            n: ops.allocate(tp.chip_shape(hw), hw.dtype, hw.layout)
            if is_shape_only(hw.array)
            else ops.upload(
                hw.array, hw.dtype, hw.layout, shard_dim=hw.shard_dim, mesh_dims=hw.mesh_dims
            )
            for n, hw in laid.items()
        }
    host = {
        n: ops.cache_host(
            hw.array, hw.dtype, hw.layout, shard_dim=hw.shard_dim, mesh_dims=hw.mesh_dims
        )
        for n, hw in laid.items()
    }
    try:
        entry.write(sorted(host), lambda path, n: ops.dump(path, host[n]))
    except OSError as e:
        log.warning("converted weights not cached in %s: %s", entry.folder.parent, e)
    return {n: ops.to_device(t) for n, t in host.items()}
