"""Collectives (a mesh only): global semaphores, and ``all_gather`` and ``reduce_scatter`` as
tt_transformers calls tt-metal's experimental async CCLs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tt_serve.model.tt.ops.device import DeviceOps, Tensor


class CclOps(DeviceOps):
    """Global semaphores and the two collectives."""

    def global_semaphore(self) -> Any:
        """A global semaphore on every worker core of every chip, initial value 0 (host write:
        created before any capture, as tt_transformers' TT_CCL does)."""
        t, grid = self.ttnn, self.device.compute_with_storage_grid_size()
        cores = t.CoreRangeSet(
            [t.CoreRange(t.CoreCoord(0, 0), t.CoreCoord(grid.x - 1, grid.y - 1))]
        )
        return t.create_global_semaphore(self.device, cores, 0)

    def all_gather(
        self,
        x: Tensor,
        dim: int,
        *,
        cluster_axis: int,
        semaphores: Sequence[Any],
        barrier: Any,
        num_links: int,
    ) -> Tensor:
        """Every chip's ``x`` on its line of ``cluster_axis`` concatenated along ``dim`` on
        every chip of the line: ``ttnn.experimental.all_gather_async`` with caller-owned
        semaphores and a barrier (the trace-safe gather, tt-metal #48404; ``Topology.Linear``
        on the FABRIC_1D fabric), as tt_transformers' ``tt_all_gather`` calls it."""
        return self.ttnn.experimental.all_gather_async(
            x,
            dim=dim,
            multi_device_global_semaphore=list(semaphores),
            num_links=num_links,
            cluster_axis=cluster_axis,
            topology=self.ttnn.Topology.Linear,
            barrier_semaphore=barrier,
        )

    def reduce_scatter(
        self,
        x: Tensor,
        dim: int,
        *,
        cluster_axis: int,
        semaphores: Sequence[Any],
        barrier: Any,
        num_links: int,
    ) -> Tensor:
        """The sum of ``x`` over its line of ``cluster_axis``, chunk i of ``dim`` left on the
        line's chip i: ``ttnn.experimental.reduce_scatter_minimal_async`` as tt_transformers'
        ``tt_all_reduce`` calls it (DRAM intermediate, Linear topology, ``cluster_axis``)."""
        return self.ttnn.experimental.reduce_scatter_minimal_async(
            x,
            dim=dim,
            multi_device_global_semaphore=list(semaphores),
            barrier_semaphore=barrier,
            num_links=num_links,
            cluster_axis=cluster_axis,
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
            intermediate_memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
            topology=self.ttnn.Topology.Linear,
        )
