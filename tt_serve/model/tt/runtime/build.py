"""Building the ttnn backend on an open device: numpy layout of the checkpoint -> upload
(converted-weight cache) -> model -> backend.

The device is already open (``launch.py`` opens it; tests and the planner open a virtual one);
this is the one place a :class:`TTBackend` is put together, so every start (server, planner,
tests) builds the same thing the same way, from the same :class:`TTOptions`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.host import to_numpy
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.options import DEFAULT_CCL_LINKS, TTOptions
from tt_serve.model.tt.runtime.backend import TTBackend
from tt_serve.model.tt.runtime.model import TTModel
from tt_serve.model.tt.runtime.weight_cache import WeightCache
from tt_serve.model.tt.runtime.weights import load_device_weights

if TYPE_CHECKING:
    import torch


def build_backend(
    spec: ModelSpec,
    weights: dict[str, torch.Tensor] | Callable[[], dict[str, np.ndarray]],
    *,
    ops: Ops,
    options: TTOptions,
    tp: TensorParallel,
    ccl_links: int | tuple[int, int] = DEFAULT_CCL_LINKS,
    weight_cache_dir: Path | None = None,
    checkpoint: Path | None = None,
    on_capture: Callable[[], None] | None = None,
) -> TTBackend:
    """The backend ``options`` describe for ``spec`` on the device ``ops`` has open.

    ``weights``: the canonical checkpoint tensors, or a function giving them as numpy (called
    only when the converted-weight cache misses). ``tp``: the split over ``ops.mesh``, the
    start's ``Target.tp`` (worked out once per start, before any device opens). ``ccl_links``: Ethernet links each collective uses
    on a mesh, one count or per axis. ``weight_cache_dir``: converted weights cached there,
    keyed on the content of ``checkpoint`` (required with it). ``on_capture``: called once when
    the programs are captured (the planner tags its op log with it)."""
    precision = options.weights
    source = weights if callable(weights) else (lambda: to_numpy(weights))
    cache = _weight_cache(weight_cache_dir, checkpoint)
    moe = options.moe_dispatch
    device_weights = load_device_weights(ops, spec, precision, source, cache, tp, moe)
    model = TTModel(ops, spec, device_weights, precision, tp, ccl_links, moe_dispatch=moe)
    return TTBackend(model, ops=ops, options=options, on_capture=on_capture)


def _weight_cache(root: Path | None, checkpoint: Path | None) -> WeightCache | None:
    if root is None:
        return None
    if checkpoint is None:
        raise ValueError(
            "weight_cache_dir needs checkpoint: the folder whose content keys the cached weights"
        )
    return WeightCache(Path(root), Path(checkpoint))
