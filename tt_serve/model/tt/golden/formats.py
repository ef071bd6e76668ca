"""The block-float check: every device tensor declared ``bfloat8_b`` / ``bfloat4_b`` must hold
values that format can represent (a weight declared bfloat8_b whose values were left fp32 is
a precision profile the card would not run). The oracle is ttnn's own host packing:
``ttnn.from_torch(x, dtype, TILE_LAYOUT).to_torch()`` rounds to the format (shared exponents per
16 values of a tile row), so a representable tensor comes back unchanged.

ttnn packs TILE tensors on the host only with a cluster descriptor (no card needed):
``mock_cluster_env`` writes one of an n150 for the process that imports ttnn.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tt_serve.model.tt.virtual.tensors import Buffer, DataType, Tensor

MOCK_ENV = "TT_METAL_MOCK_CLUSTER_DESC_PATH"
BLOCK_FLOATS = (DataType.BFLOAT8_B, DataType.BFLOAT4_B)


def mock_cluster_env() -> None:
    """Point ttnn at a one-chip mock box (unless the caller already did); before ``import
    ttnn``."""
    if os.environ.get(MOCK_ENV):
        return
    from tt_serve.model.tt.boards import device_spec
    from tt_serve.model.tt.plan.cluster_desc import write_cluster_descriptor

    folder = Path(tempfile.mkdtemp(prefix="golden-cluster-"))
    os.environ[MOCK_ENV] = str(write_cluster_descriptor(device_spec("n150"), folder))


class BlockFloatLedger:
    """The live device buffers declared in a block-float format (``DeviceBase._new`` wrapped)."""

    def __init__(self) -> None:
        self._bufs: weakref.WeakKeyDictionary[Buffer, DataType] = weakref.WeakKeyDictionary()

    def install(self, chip: Any) -> None:
        new: Callable[..., Tensor] = chip._new

        def recording(data: torch.Tensor, dtype: DataType, layout: Any, device: bool) -> Tensor:
            t = new(data, dtype, layout, device)
            if device and dtype in BLOCK_FLOATS:
                self._bufs[t.buffer] = dtype
            return t

        chip._new = recording

    def unrepresentable(self, ttnn: Any) -> list[dict[str, Any]]:
        """Each live block-float buffer whose values the format would change: shape, dtype and
        the largest change."""
        bad = []
        for buf, dtype in list(self._bufs.items()):
            if buf.freed or buf.data.is_meta:
                continue
            x = buf.data.float()
            kind = getattr(ttnn, dtype.value)
            packed = ttnn.from_torch(x, dtype=kind, layout=ttnn.TILE_LAYOUT).to_torch().float()
            change = float((packed - x).abs().max()) if x.numel() else 0.0
            if change > 0.0:
                bad.append({"shape": list(x.shape), "dtype": dtype.value, "max_change": change})
        return bad

    def __len__(self) -> int:
        return sum(1 for b in self._bufs if not b.freed)
