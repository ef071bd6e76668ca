"""Layout and data movement: reshape, permute, slice, concat, layout and dtype changes, copies,
the pool row write (``fill_cache``) and L1 height sharding (``interleaved_to_sharded``)."""

from __future__ import annotations

from collections.abc import Sequence

from tt_serve.model.tt.ops.device import DeviceOps, Tensor


class MovementOps(DeviceOps):
    """Data movement and L1 sharding."""

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        return self.ttnn.reshape(x, list(shape))

    def permute(self, x: Tensor, dims: Sequence[int]) -> Tensor:
        return self.ttnn.permute(x, list(dims))

    def slice(self, x: Tensor, start: Sequence[int], end: Sequence[int]) -> Tensor:
        """Static slice: the bounds are compile-time constants of a captured program."""
        return self.ttnn.slice(x, list(start), list(end))

    def concat(self, xs: Sequence[Tensor], dim: int) -> Tensor:
        return self.ttnn.concat(list(xs), dim)

    def to_tile(self, x: Tensor) -> Tensor:
        return self.ttnn.to_layout(x, self.ttnn.TILE_LAYOUT)

    def to_row_major(self, x: Tensor) -> Tensor:
        return self.ttnn.to_layout(x, self.ttnn.ROW_MAJOR_LAYOUT)

    def typecast(self, x: Tensor, dtype: str) -> Tensor:
        return self.ttnn.typecast(x, self.dtype(dtype))

    def copy(self, src: Tensor, dst: Tensor) -> None:
        """Device-to-device copy into an existing buffer (its address stays fixed)."""
        self.ttnn.copy(src, dst)

    def fill_row(self, pool: Tensor, value: Tensor, row: int) -> None:
        """Write ``value`` [1, ...] into row ``row`` of a pool [N, ...] in place (eager only)."""
        self.ttnn.fill_cache(pool, value, row)

    def height_sharded(self, x: Tensor, rows: int) -> Tensor:
        """Shard [1, B, heads, dim] one user per core, as paged_update_cache requires."""
        grid = self.ttnn.num_cores_to_corerangeset(
            rows, self.device.compute_with_storage_grid_size(), True
        )
        config = self.ttnn.create_sharded_memory_config(
            shape=(32, x.shape[-1]),
            core_grid=grid,
            strategy=self.ttnn.ShardStrategy.HEIGHT,
            use_height_and_width_as_shard_shape=True,
        )
        return self.ttnn.interleaved_to_sharded(x, config)
