"""Checkpoint tensors -> the device layouts the ttnn ops want (numpy only, testable without ttnn).

Canonical checkpoint tensors (``model/weights.py``) become host weights laid out the way the
device ops want them, one per entry of the device-weight table (``table.py``): linear weights
transposed to [in, out] TILE in the group's precision, the attention q projection split into its
query and gate halves, Qwen RMSNorm weights stored as ``1 + w``, GDN conv taps as four
[1, 1, 1, C] vectors (oldest first), the gate constants ``dt_bias`` and ``-exp(A_log)`` in fp32,
embeddings ROW_MAJOR, MoE experts in sparse_matmul's [1, E, in, out] layout (the dense reference
path stacks them per group). The transforms are in ``transforms.py``; ``tests/tt_host`` checks
this layout against the real ``ttnn.Tensor``.
"""

from __future__ import annotations

import numpy as np

from tt_serve.model.precision import Precision
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.experts import DISPATCHES, MoeDispatch
from tt_serve.model.tt.layout.host import HostWeight
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.layout.table import slots


def layout_weights(
    spec: ModelSpec,
    w: dict[str, np.ndarray],
    precision: Precision,
    moe_dispatch: MoeDispatch = "sparse",
    tp: TensorParallel | None = None,
) -> dict[str, HostWeight]:
    """Canonical float32 arrays -> device layouts (pure numpy), one host weight per device
    weight the table declares for ``spec``; MoE experts as ``moe_dispatch``'s path reads them;
    with ``tp`` over several chips, each placed (replicated or sharded) as its entry says."""
    if moe_dispatch not in DISPATCHES:
        raise ValueError(f"moe_dispatch={moe_dispatch!r}; choose one of {DISPATCHES}")
    out: dict[str, HostWeight] = {}
    for s in slots(spec, moe_dispatch):
        d = s.weight
        array = d.transform([w[k] for k in s.checkpoint_keys()], spec, s.index)
        out[s.name] = HostWeight(array, d.dtype(precision), d.layout)
    return tp.layout(out) if tp is not None and tp.degree > 1 else out
