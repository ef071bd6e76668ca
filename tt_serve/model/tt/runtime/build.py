"""Building the ttnn backend on an open device: tensor parallel once -> numpy layout of the
checkpoint -> upload (converted-weight cache) -> model -> backend.

The device is already open (``launch.py`` opens it; tests and the planner open a virtual one);
this is the one place a :class:`TTBackend` is put together, so every start (server, planner,
tests) builds the same thing the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

import numpy as np

from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.experts import MoeDispatch
from tt_serve.model.tt.layout.host import to_numpy
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.precision import Precision
from tt_serve.model.tt.runtime.backend import RuntimeOptions, TTBackend
from tt_serve.model.tt.runtime.model import TTModel
from tt_serve.model.tt.runtime.weight_cache import WeightCache
from tt_serve.model.tt.runtime.weights import load_device_weights

if TYPE_CHECKING:
    import torch

DEFAULT_CCL_LINKS = 1  # tt_transformers get_num_links: 1 on N300/T3K, 2 on P150x4 (both work)


class TTOptions(RuntimeOptions, total=False):
    """What the model is built from, all optional (defaults in brackets), plus the backend's
    ``RuntimeOptions``."""

    precision: Precision  # [Precision()] the weight profile (``Precision.named``)
    # [DEFAULT_CCL_LINKS] Ethernet links each collective uses on a mesh: one count, or
    # (axis 0, axis 1) as tt_transformers' get_num_links gives Galaxy (4, 3)
    ccl_links: int | tuple[int, int]
    # [None: no cache; launch.open_backend uses the default dir] converted weights cached here,
    # keyed on the content of ``checkpoint`` (required with it)
    weight_cache_dir: Path | None
    checkpoint: Path | None  # [None] the folder the weights were read from
    moe_dispatch: MoeDispatch  # ["sparse"] only the routed experts; "dense": all (the reference)


_RUNTIME_KEYS = RuntimeOptions.__optional_keys__


def build_backend(
    spec: ModelSpec,
    weights: dict[str, torch.Tensor] | Callable[[], dict[str, np.ndarray]],
    *,
    ops: Ops,
    **options: Unpack[TTOptions],
) -> TTBackend:
    """The backend for ``spec`` on the device ``ops`` has open: ``weights`` are the canonical
    checkpoint tensors, or a function giving them as numpy (called only when the converted-weight
    cache misses; the cache needs the ``checkpoint`` folder they come from, whose content keys
    it). A mesh split that does not divide the model fails before any weight is converted."""
    precision = options.get("precision") or Precision()
    tp = TensorParallel.for_mesh(spec, ops.mesh) if ops.mesh else TensorParallel(spec, 1)
    source = weights if callable(weights) else (lambda: to_numpy(weights))
    moe = options.get("moe_dispatch", "sparse")
    cache = _weight_cache(options)
    device_weights = load_device_weights(ops, spec, precision, source, cache, tp, moe)
    links = options.get("ccl_links", DEFAULT_CCL_LINKS)
    model = TTModel(ops, spec, device_weights, precision, tp, links, moe_dispatch=moe)
    runtime: RuntimeOptions = {k: v for k, v in options.items() if k in _RUNTIME_KEYS}  # type: ignore[assignment]
    return TTBackend(model, ops=ops, **runtime)


def _weight_cache(options: TTOptions) -> WeightCache | None:
    root, checkpoint = options.get("weight_cache_dir"), options.get("checkpoint")
    if root is None:
        return None
    if checkpoint is None:
        raise ValueError(
            "weight_cache_dir needs checkpoint: the folder whose content keys the cached weights"
        )
    return WeightCache(Path(root), Path(checkpoint))
