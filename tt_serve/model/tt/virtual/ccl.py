"""The virtual mesh's collectives (``CclOps``, a mixin of ``VirtualMeshTTNN``): global
semaphores, the lines of a ``cluster_axis``, the fabric, topology and link checks, and the two
experimental CCLs the backend uses (``all_gather_async``, ``reduce_scatter_minimal_async``),
computed from every chip's shards and recorded on every chip (see ``mesh.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual import rules_base, rules_ccl
from tt_serve.model.tt.virtual.device import VirtualTTNN
from tt_serve.model.tt.virtual.mesh_types import (
    RING_FABRICS,
    TWO_D_FABRICS,
    FabricConfig,
    FakeMeshDevice,
    GlobalSemaphore,
    MeshTensor,
    Topology,
)
from tt_serve.model.tt.virtual.tensors import ContractViolation, CoreCoord


class CclOps:
    """Collectives over ``VirtualMeshTTNN``'s chips; the attributes below are the mesh's."""

    chips: list[VirtualTTNN]
    chip: ChipSpec
    device: FakeMeshDevice | None
    fabric: FabricConfig
    max_links: tuple[int, int]
    ring_axes: tuple[int, ...]
    mirror: bool
    ccl_calls: list[tuple[str, tuple[int, ...], str, int | None]]
    _n: int
    _semaphores: Iterator[int]

    @property
    def capturing(self) -> bool:
        raise NotImplementedError

    def _fault(self, chip: int, op: str) -> None:
        raise NotImplementedError

    def CoreRange(self, start: CoreCoord, end: CoreCoord) -> tuple[CoreCoord, CoreCoord]:
        return (start, end)

    def CoreRangeSet(self, ranges: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(ranges)

    def create_global_semaphore(
        self, mesh_device: Any, cores: Any, initial_value: int, buffer_type: Any = None
    ) -> GlobalSemaphore:
        """A host write: not allowed while a trace is being captured (notes 3.6)."""
        if self.capturing:
            raise ContractViolation("host_io", "create_global_semaphore while capturing a trace")
        return GlobalSemaphore(next(self._semaphores))

    def _mesh_shape(self) -> tuple[int, int]:
        if self.device is None:
            raise ContractViolation("mesh.open", "a collective before open_mesh_device")
        rows, cols = tuple(self.device.shape)
        return rows, cols

    def _lines(self, name: str, cluster_axis: int | None) -> list[list[int]]:
        """The chips (row-major indices) of every independent line of the collective."""
        rows, cols = self._mesh_shape()
        if cluster_axis is None:
            if rows > 1 and cols > 1 and self.fabric not in TWO_D_FABRICS:
                raise ContractViolation(
                    "ccl.cluster_axis",
                    f"{name} without cluster_axis on the {rows} x {cols} mesh needs a 2-D fabric "
                    f"(FABRIC_2D), not {self.fabric.name}: pass cluster_axis=0 or 1",
                )
            return [list(range(rows * cols))]
        if cluster_axis not in (0, 1):
            raise ContractViolation("ccl.cluster_axis", f"{name}: cluster_axis {cluster_axis}")
        if cluster_axis == 1:
            return [[r * cols + c for c in range(cols)] for r in range(rows)]
        return [[r * cols + c for r in range(rows)] for c in range(cols)]

    def _links_on(self, cluster_axis: int | None) -> int:
        rows, cols = self._mesh_shape()
        if cluster_axis is None:  # get_num_links(cluster_axis=None): the minimum over axes
            used = [self.max_links[a] for a, n in enumerate((rows, cols)) if n > 1]
            return min(used) if used else 0
        return self.max_links[cluster_axis]

    def _ccl_checks(self, name: str, topology: Topology | None, cluster_axis: int | None) -> str:
        if self.fabric is FabricConfig.DISABLED:
            raise ContractViolation(
                "ccl.fabric", f"{name} without a fabric: set_fabric_config before open_mesh_device"
            )
        topo = topology or Topology.Ring  # the experimental ops' default (notes 3.3)
        if topo is Topology.Ring and self.fabric not in RING_FABRICS:
            raise ContractViolation(
                "ccl.topology",
                f"{name} with Topology.Ring on {self.fabric.name}: pass Topology.Linear on a "
                "FABRIC_1D system (the experimental CCLs default to Ring)",
            )
        rows, cols = self._mesh_shape()
        axes = [a for a, n in enumerate((rows, cols)) if n > 1]
        along = axes if cluster_axis is None else [cluster_axis]
        if topo is Topology.Ring and any(a not in self.ring_axes for a in along):
            raise ContractViolation(
                "ccl.topology",
                f"{name} with Topology.Ring along mesh axis {along} of {rows} x {cols}, whose "
                "chips do not wrap around (get_usable_topology demotes it to Linear): pass "
                "Topology.Linear",
            )
        return topo.value

    def _all_gather_async(
        self,
        input_tensor: MeshTensor,
        dim: int,
        multi_device_global_semaphore: Any,
        *,
        persistent_output_buffer: Any = None,
        num_links: int | None = None,
        memory_config: Any = None,
        topology: Topology | None = None,
        subdevice_id: Any = None,
        cluster_axis: int | None = None,
        barrier_semaphore: GlobalSemaphore | None = None,
        chunks_per_sync: int | None = None,
        num_workers_per_link: int | None = None,
        num_buffers_per_channel: int | None = None,
    ) -> MeshTensor:
        """Concatenation of the shards of every chip on a line of ``cluster_axis`` along
        ``dim`` in mesh order, on every chip of that line (each line independently)."""
        name = "all_gather_async"
        topo = self._ccl_checks(name, topology, cluster_axis)
        sems = _semaphores(multi_device_global_semaphore)
        x = _mesh_input(name, input_tensor, self._n)
        lines = self._lines(name, cluster_axis)
        line_of = {i: line for line in lines for i in line}
        with self.chips[0]._rules():
            out_shape = rules_ccl.all_gather_async(
                self.chip,
                x.info(),
                dim,
                len(lines[0]),
                len(sems),
                1 if num_links is None else num_links,
                self._links_on(cluster_axis),
                capturing=self.capturing,
            )
        self.ccl_calls.append((name, x.shape, topo, cluster_axis))
        bufs = [s.buffer for s in x.shards]

        def gather(i: int) -> torch.Tensor:
            if bufs[0].data.is_meta:
                return torch.empty(out_shape, device="meta")
            return torch.cat([bufs[j].data for j in line_of[i]], dim)

        return self._collective("all_gather_async", x, gather)

    def _reduce_scatter(
        self,
        input_tensor: MeshTensor,
        persistent_output_buffers: Any = None,
        dim: int = 3,
        multi_device_global_semaphore: Any = None,
        *,
        barrier_semaphore: GlobalSemaphore | None = None,
        num_links: int | None = None,
        memory_config: Any = None,
        intermediate_memory_config: Any = None,
        topology: Topology | None = None,
        subdevice_id: Any = None,
        cluster_axis: int | None = None,
        chunks_per_sync: int | None = None,
        num_workers_per_link: int | None = None,
        num_buffers_per_channel: int | None = None,
        compute_kernel_config: Any = None,
    ) -> MeshTensor:
        """The sum over each line of ``cluster_axis``, chunk i of ``dim`` to the line's chip i
        (fp32 in line order; each line independently). Its intermediate DRAM buffer is
        allocated on every chip for the op's duration."""
        name = "reduce_scatter_minimal_async"
        topo = self._ccl_checks(name, topology, cluster_axis)
        sems = _semaphores(multi_device_global_semaphore)
        x = _mesh_input(name, input_tensor, self._n)
        lines = self._lines(name, cluster_axis)
        n = len(lines[0])
        place = {i: (line, k) for line in lines for k, i in enumerate(line)}
        with self.chips[0]._rules():
            inter, out_shape = rules_ccl.reduce_scatter_minimal_async(
                self.chip,
                x.info(),
                dim,
                n,
                len(sems),
                1 if num_links is None else num_links,
                self._links_on(cluster_axis),
                topo,
            )
        self.ccl_calls.append((name, x.shape, topo, cluster_axis))
        for c in self.chips:  # the staging buffer: charged while the op runs
            key = -(1 << 40) - c.dram.used_per_bank
            with c._rules():
                c.dram.allocate(key, rules_base.TensorInfo(inter, x.dtype.value, x.layout.value))
            c.dram_peak_per_bank = max(c.dram_peak_per_bank, c.dram.used_per_bank)
            c.dram.free(key)
        bufs = [s.buffer for s in x.shards]
        d = dim % len(x.shape)

        def scatter(i: int) -> torch.Tensor:
            if bufs[0].data.is_meta:
                return torch.empty(out_shape, device="meta")
            line, k = place[i]
            total = bufs[line[0]].data.clone()
            for j in line[1:]:
                total = total + bufs[j].data
            return torch.chunk(total, n, d)[k].contiguous()

        return self._collective("reduce_scatter_minimal_async", x, scatter)

    def _collective(
        self, name: str, x: MeshTensor, part: Callable[[int], torch.Tensor]
    ) -> MeshTensor:
        """Chip i's output = ``part(i)``, recorded on chip i (replays read every chip's input
        buffers: they were written by earlier steps of the shared step list)."""
        outs = []
        for i, c in enumerate(self.chips):
            self._fault(i, name)

            def run(i: int = i) -> torch.Tensor:
                return part(i)

            outs.append(c._single(name, [x.shards[i]], run, x.dtype, x.layout))
        return MeshTensor(outs * self._n if self.mirror else outs)


def _semaphores(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _mesh_input(name: str, x: Any, n: int) -> MeshTensor:
    if not isinstance(x, MeshTensor) or len(x.shards) != n:
        raise ContractViolation("ccl.input", f"{name} of a tensor that is not on the whole mesh")
    return x
