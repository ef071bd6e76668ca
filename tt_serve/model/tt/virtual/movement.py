"""Data movement: reshape, permute, slice, concat, layout and dtype changes, copies, the
per-user ``fill_cache``, and L1 height sharding (``interleaved_to_sharded``)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from tt_serve.model.tt.virtual import rules_base, rules_movement
from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.tensors import (
    ContractViolation,
    DataType,
    Layout,
    Tensor,
    require_landed,
    require_same,
)


class MovementOps(DeviceBase):
    """Data movement and L1 sharding."""

    def num_cores_to_corerangeset(self, n: int, grid: Any, row_wise: bool) -> Any:
        with self._rules():
            rules_base.num_cores_to_corerangeset(self.chip, n)
        return SimpleNamespace(num_cores=n)

    def create_sharded_memory_config(
        self,
        shape: Any,
        core_grid: Any,
        strategy: Any,
        orientation: Any = "row_major",
        use_height_and_width_as_shard_shape: bool = False,
    ) -> Any:
        return SimpleNamespace(
            sharded=True,
            shard=rules_base.Shard(core_grid.num_cores, tuple(shape), strategy, orientation),
        )

    def interleaved_to_sharded(self, x: Tensor, config: Any) -> Tensor:
        if x.shape[1] > config.shard.num_cores:
            raise ContractViolation("dtype", "more users than cores in the height-sharded config")
        out = self._single("interleaved_to_sharded", [x], lambda: x.buffer.data, x.dtype, x.layout)
        out.buffer.shard = config.shard  # lives in L1, not in the DRAM banks
        self.dram.free(out.buffer.serial)
        return out

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        if int(np.prod(list(shape))) != x.buffer.data.numel():
            raise ContractViolation("dtype", f"reshape {x.shape} -> {list(shape)}")
        return self._single(
            "reshape", [x], lambda: x.buffer.data.reshape(list(shape)), x.dtype, x.layout
        )

    def permute(self, x: Tensor, dims: Sequence[int]) -> Tensor:
        with self._rules():
            rules_movement.permute(x.info(), dims)
        return self._single(
            "permute", [x], lambda: x.buffer.data.permute(*dims).contiguous(), x.dtype, x.layout
        )

    def slice(self, x: Tensor, start: Sequence[int], end: Sequence[int]) -> Tensor:
        idx = tuple(slice(a, b) for a, b in zip(start, end, strict=True))
        return self._single("slice", [x], lambda: x.buffer.data[idx].clone(), x.dtype, x.layout)

    def concat(self, xs: Sequence[Tensor], dim: int = 0) -> Tensor:
        if len({(t.dtype, t.layout) for t in xs}) != 1:
            raise ContractViolation("dtype", "concat of mixed dtypes or layouts")
        return self._single(
            "concat",
            xs,
            lambda: torch.cat([t.buffer.data for t in xs], dim),
            xs[0].dtype,
            xs[0].layout,
        )

    def to_layout(self, x: Tensor, layout: Layout) -> Tensor:
        if x.dtype in (DataType.BFLOAT8_B, DataType.BFLOAT4_B) and layout is not Layout.TILE:
            raise ContractViolation("dtype", "Layout must be Layout::TILE for bfloat8_b")
        if not x.buffer.on_device:
            require_landed(x, "to_layout()")
            return self._new(x.buffer.data.clone(), x.dtype, layout, False)
        return self._single("to_layout", [x], lambda: x.buffer.data, x.dtype, layout)

    def typecast(self, x: Tensor, dtype: DataType) -> Tensor:
        return self._single("typecast", [x], lambda: x.buffer.data, dtype, x.layout)

    def copy(self, a: Tensor, b: Tensor) -> Tensor:
        require_same("copy", a, b)
        return self._inplace("copy", [a], b, lambda: a.buffer.data)

    def fill_cache(self, cache: Tensor, x: Tensor, batch_idx: int) -> Tensor:
        if cache.dtype != x.dtype or list(cache.shape)[1:] != list(x.shape)[1:] or x.shape[0] != 1:
            raise ContractViolation(
                "dtype", f"fill_cache {x.shape}/{x.dtype} into {cache.shape}/{cache.dtype}"
            )
        with self._rules():
            rules_movement.fill_cache(cache.info(), x.info(), batch_idx)

        def fn() -> torch.Tensor:
            new = cache.buffer.data.clone()
            new[batch_idx] = x.buffer.data[0]
            return new

        return self._inplace("fill_cache", [x], cache, fn)
