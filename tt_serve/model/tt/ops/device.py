"""The device every op family builds on (``DeviceOps``): open and close one chip or a mesh
(with its fabric), the worker grid, the allocator's view, the dtype and layout names, and trace
capture, replay and release. Device tensors are opaque (``Tensor = Any``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tt_serve.model.tt.layout import TILE

Tensor = Any


# L1 kept back at device open for ops that want small L1 buffers (sharded inputs, CCL scratch):
# what a ttnn start opens with (tt_transformers' demos open with the same 32 KiB).
DEFAULT_L1_SMALL = 32768


@dataclass(frozen=True)
class MemoryView:
    """The allocator's view of one buffer type on one chip (``ttnn.get_memory_view``)."""

    banks: int
    bank_bytes: int
    allocated_per_bank: int
    largest_free_block_per_bank: int


class DeviceOps:
    """The ttnn module handle and the open device: what every op family's methods use."""

    def __init__(self, ttnn_module: Any) -> None:
        self.ttnn = ttnn_module
        self.device: Any = None
        self.trace_region_size = 0  # what the open device reserved for traces
        self.bytes_read = 0  # device -> host bytes copied by read / read_start (padded buffers)
        self.mesh: tuple[int, int] | None = None  # the opened MeshDevice's shape (open_mesh)

    # ---- device --------------------------------------------------------------------------
    def num_devices(self) -> int:
        return int(self.ttnn.GetNumAvailableDevices())

    def arch_name(self) -> str:
        """The chips' architecture ("wormhole_b0", "blackhole"), known before any device opens."""
        return str(self.ttnn.get_arch_name())

    def cluster_type(self) -> str:
        """The box's ClusterType name ("P150", "N300", "T3K", ...), known before any device
        opens: what the launch identifies the hardware by (``model/tt/boards.py``)."""
        t = self.ttnn.cluster.get_cluster_type()
        return str(getattr(t, "name", t))

    def open_device(self, device_id: int, *, trace_region_size: int, l1_small_size: int) -> Any:
        self.device = self.ttnn.open_device(
            device_id=device_id,
            trace_region_size=trace_region_size,
            l1_small_size=l1_small_size,
        )
        self.trace_region_size = trace_region_size
        return self.device

    def open_mesh(
        self,
        shape: tuple[int, int],
        *,
        trace_region_size: int,
        l1_small_size: int,
        device_ids: Sequence[int] = (),
        dispatch_core_type: str | None = None,
    ) -> Any:
        """A MeshDevice of ``shape`` (rows, cols) over ``device_ids`` (empty: the first chips).
        The fabric is brought up first, as tt-metal's mesh fixture does (CCLs need it):
        ``FABRIC_1D``, the config qwen36 and tt_transformers use for 1 x N meshes; the
        collectives then run ``Topology.Linear`` (notes/ttnn-mesh.md 1.4, 7). On a 2-D mesh
        every collective names its ``cluster_axis``, so the 1-D fabric serves both axes (a
        collective over the whole 2-D mesh would need ``FABRIC_2D``). ``dispatch_core_type``
        ("WORKER" | "ETH"): tt-metal's default for the box unless given (the mock checker
        opens Wormhole meshes with WORKER: plan/mock.py)."""
        t = self.ttnn
        t.set_fabric_config(t.FabricConfig.FABRIC_1D)
        kw: dict[str, Any] = {}
        if dispatch_core_type is not None:
            kw["dispatch_core_config"] = t.DispatchCoreConfig(
                getattr(t.DispatchCoreType, dispatch_core_type)
            )
        self.device = t.open_mesh_device(
            mesh_shape=t.MeshShape(*shape),
            l1_small_size=l1_small_size,
            trace_region_size=trace_region_size,
            physical_device_ids=list(device_ids),
            **kw,
        )
        self.mesh = (int(shape[0]), int(shape[1]))
        self.trace_region_size = trace_region_size
        return self.device

    @property
    def num_chips(self) -> int:
        """Chips the programs run on (1 for a single device)."""
        return 1 if self.mesh is None else self.mesh[0] * self.mesh[1]

    def close_device(self) -> None:
        if self.device is None:
            return
        if self.mesh is not None:
            self.ttnn.close_mesh_device(self.device)
            self.ttnn.set_fabric_config(self.ttnn.FabricConfig.DISABLED)
        else:
            self.ttnn.close_device(self.device)
        self.device = None

    def num_worker_cores(self) -> int:
        """Cores of the compute-with-storage grid: the bound one-core-per-item ops check."""
        grid = self.device.compute_with_storage_grid_size()
        return int(grid.x) * int(grid.y)

    def worker_grid(self) -> tuple[int, int]:
        """(x, y) of the compute-with-storage grid (program configs pick their cores in it)."""
        grid = self.device.compute_with_storage_grid_size()
        return int(grid.x), int(grid.y)

    def synchronize(self) -> None:
        self.ttnn.synchronize_device(self.device)

    def memory_view(self, kind: str) -> MemoryView:
        """tt-metal's allocator, ``kind`` "DRAM" or "L1", of the device (chip 0 of a mesh:
        every chip holds the same buffers)."""
        t = self.ttnn
        v = t.get_memory_view(self.device, getattr(t.BufferType, kind))
        return MemoryView(
            int(v.num_banks),
            int(v.total_bytes_per_bank),
            int(v.total_bytes_allocated_per_bank),
            int(v.largest_contiguous_bytes_free_per_bank),
        )

    # ---- dtypes and layouts --------------------------------------------------------------
    DTYPES = ("bfloat16", "bfloat8_b", "bfloat4_b", "float32", "uint32", "uint16", "int32")

    def dtype(self, name: str) -> Any:
        if name not in self.DTYPES:
            raise KeyError(name)
        return getattr(self.ttnn, name)

    def dtype_name(self, tensor: Tensor) -> str:
        """The name :meth:`dtype` takes for ``tensor``'s dtype (its inverse)."""
        return next(n for n in self.DTYPES if self.dtype(n) == tensor.dtype)

    def layout(self, name: str) -> Any:
        return self.ttnn.TILE_LAYOUT if name == TILE else self.ttnn.ROW_MAJOR_LAYOUT

    # ---- traces ----------------------------------------------------------------------------
    def begin_trace(self) -> Any:
        return self.ttnn.begin_trace_capture(self.device, cq_id=0)

    def end_trace(self, trace_id: Any) -> None:
        self.ttnn.end_trace_capture(self.device, trace_id, cq_id=0)

    def execute_trace(self, trace_id: Any, *, blocking: bool) -> None:
        self.ttnn.execute_trace(self.device, trace_id, cq_id=0, blocking=blocking)

    def release_trace(self, trace_id: Any) -> None:
        self.ttnn.release_trace(self.device, trace_id)
