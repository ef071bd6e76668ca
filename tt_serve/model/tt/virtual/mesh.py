"""CONTRACT FAKE of a ttnn 0.81.1 MeshDevice: SPMD over one ``VirtualTTNN`` per chip.

``VirtualMeshTTNN`` has the module surface of ``VirtualTTNN`` plus the mesh API of
``shared/design/notes/ttnn-mesh.md`` (sections 1-4): ``MeshShape``, ``open_mesh_device``, the
mappers ``replicate_tensor_to_mesh_mapper`` / ``shard_tensor_to_mesh_mapper`` (1-D over every
chip in row-major order), ``create_mesh_mapper`` with a ``MeshMapperConfig`` of
``PlacementShard`` / ``PlacementReplicate`` per mesh axis (and its ``ShardTensor2dMesh``
wrapper), the composer ``concat_mesh_to_tensor_composer``, ``get_device_tensors``, tensor files
that keep a mesh tensor's distribution (``dump_tensor`` / ``load_tensor``), the fabric config,
global semaphores, and the two experimental CCLs the backend uses
(``all_gather_async``, ``reduce_scatter_minimal_async``; the plain ``ttnn.all_gather`` is not
modelled: it is trace-unsafe, tt-metal #48469).

Mappers follow ttnn's ttnn/core/distributed/distributed_tensor.cpp: the 1-D mappers are a
``MeshShape(num_devices)`` distribution mapped row-major onto the mesh; a 2-D config shards
placement i's tensor dim over mesh axis i (chip (r, c) gets chunk r of the axis-0 dim and chunk
c of the axis-1 dim), needs distinct dims ("dims must be unique") and even splits ("ND
sharding requires the number of chunks to match the mesh dimension size").

CCLs take ``cluster_axis``: the collective runs independently on every line of that axis (the
chips that differ only in that coordinate), the other axis untouched (the 0.81.1 all_gather
docstring: "Other mesh axes run independent gathers"). Without ``cluster_axis`` the line is the
whole mesh, which on a mesh with more than one row and column needs a 2-D fabric (FABRIC_2D*:
tenstorrent/vllm-tt-plugin:tests/test_fabric_config.py, notes 3.2). Links are checked per axis
(tt-metal:models/tt_transformers/tt/ccl.py ``get_num_links``: TG / BHGLX (4, 3));
``Topology.Ring`` needs a ring fabric and an axis
whose chips wrap around (``ttnn.get_usable_topology``: a ring "is demoted to linear when the
tensor's devices along cluster_axis do not form a full wraparound"; this fake is strict and
raises instead).

Design: a mesh tensor (:class:`MeshTensor`) holds one shard per chip, each an ordinary
``VirtualTTNN`` tensor on that chip's fake; ``tensor.shape`` is the per-chip shard shape, as in
ttnn. Every op runs once per chip on that chip's shards, so each chip's fake applies every rule
of ``rules_*.py`` to the per-chip shapes, charges its own DRAM banks and trace region, and
records its own trace; the chips' traces share one step list, so a replay re-runs the ops of
every chip and the collectives in their call order. CCLs compute their semantics from all
chips' shards (numeric mode) or just shapes (shape-only mode), allocate their outputs and
intermediate buffers on every chip, and check the device-operation rules
(``rules_ccl.all_gather_async``, ``rules_ccl.reduce_scatter_minimal_async``), the fabric and the
topology. A one-chip mesh returns its chip's own tensors: it is exactly the single-device fake.

Fault injection (``inject_fault``): the next call of an op on one chip raises
:class:`InjectedFault`, as a device error would, after the chips before it ran theirs.

``mirror`` (shape-only mode only, what the planner uses on 8 x 4 Galaxy meshes): one chip's
fake runs and stands for every chip. In shape-only mode nothing distinguishes the chips: the
programs are SPMD on equal per-chip shapes and the mesh allocator moves every chip's free list
in lock step (tt-metal:tt_metal/distributed/mesh_buffer.cpp, "Rely on the MeshDevice allocator
to provide the address for the entire mesh buffer"), so every rule, DRAM figure and trace size
is the same on each chip; a mesh tensor holds that one chip's tensor for every chip. Faults
cannot be injected on other chips there.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual.ccl import CclOps
from tt_serve.model.tt.virtual.device import P150, VirtualTTNN
from tt_serve.model.tt.virtual.mesh_types import (
    FabricConfig,
    FakeMeshDevice,
    InjectedFault,
    MeshComposer,
    MeshMapper,
    MeshMapperConfig,
    MeshShape,
    MeshTensor,
    PlacementReplicate,
    PlacementShard,
    Topology,
    at_chip,
    distribute,
    gather_results,
    has_mesh,
    mirrored,
    owner_chip,
)
from tt_serve.model.tt.virtual.tensors import ContractViolation, CoreCoord, tensor_payload
from tt_serve.model.tt.virtual.tensors import Tensor as ChipTensor


class _Namespace:
    """``ttnn.experimental`` / ``ttnn.transformer``: chip-0's functions dispatched per chip,
    plus the mesh's own (the CCLs)."""

    def __init__(
        self, mesh: VirtualMeshTTNN, path: str, own: dict[str, Callable[..., Any]]
    ) -> None:
        self._mesh, self._path, self._own = mesh, path, own

    def __getattr__(self, name: str) -> Any:
        if name in self._own:
            return self._own[name]
        mesh, parts = self._mesh, [*self._path.split("."), name]

        def resolve(chip: VirtualTTNN) -> Any:
            obj: Any = chip
            for p in parts:
                obj = getattr(obj, p)
            return obj

        if not callable(resolve(mesh.chips[0])):  # a nested namespace (experimental.kda)
            return _Namespace(mesh, ".".join(parts), {})
        return lambda *a, **k: mesh._spmd(name, resolve, a, k)


# The module's types under other names: the class re-exports them as ttnn attributes.
_Fabric: TypeAlias = FabricConfig
_Shape: TypeAlias = MeshShape
_MapperConfig: TypeAlias = MeshMapperConfig


class VirtualMeshTTNN(CclOps):
    """The fake ttnn module for a mesh of ``num_devices`` identical chips."""

    FabricConfig = FabricConfig
    Topology = Topology
    MeshShape = MeshShape
    CoreCoord = CoreCoord
    PlacementShard = PlacementShard
    PlacementReplicate = PlacementReplicate
    MeshMapperConfig = MeshMapperConfig

    def __init__(
        self,
        *,
        num_devices: int,
        chip: ChipSpec = P150,
        max_links: int | tuple[int, int] = 0,
        ring_axes: tuple[int, ...] = (0, 1),
        mirror: bool = False,
        **chip_kwargs: Any,
    ) -> None:
        """``max_links``: Ethernet links between neighbours, one count or (axis 0, axis 1) (0:
        not checked); ``ring_axes``: the mesh axes whose chips wrap around (a ``Topology.Ring``
        CCL is refused on the others); ``mirror``: one chip's fake for all (shape-only mode
        only, see the module docstring); ``chip_kwargs`` go to every chip's ``VirtualTTNN``."""
        self._num_devices, self._chip_kwargs = num_devices, chip_kwargs
        self.max_links = (max_links, max_links) if isinstance(max_links, int) else max_links
        self.ring_axes = ring_axes
        self.chips: list[VirtualTTNN] = [
            VirtualTTNN(num_devices=num_devices, chip=chip, **chip_kwargs)
        ]  # one per chip once the mesh opens
        self.chip = chip
        self.cluster = self.chips[0].cluster
        self.shape_only = bool(chip_kwargs.get("shape_only", False))
        if mirror and not self.shape_only:
            raise ValueError("mirror=True needs shape_only=True (chips differ in numeric mode)")
        self.mirror = mirror
        self._n = 1  # chips of the open mesh
        self.fabric = FabricConfig.DISABLED
        self.device: FakeMeshDevice | None = None
        self._faults: dict[tuple[int, str], int] = {}
        self._semaphores = itertools.count(1)
        # (op, per-chip shape, topology, cluster_axis)
        self.ccl_calls: list[tuple[str, tuple[int, ...], str, int | None]] = []
        self.experimental = _Namespace(
            self,
            "experimental",
            {
                "all_gather_async": self._all_gather_async,
                "reduce_scatter_minimal_async": self._reduce_scatter,
            },
        )
        self.transformer = _Namespace(self, "transformer", {})

    # ---- module attributes -----------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "chips":
            raise AttributeError(name)
        attr = getattr(self.chips[0], name)
        if not callable(attr) or isinstance(attr, (type, Enum)):
            return attr
        return lambda *a, **k: self._spmd(name, lambda c: getattr(c, name), a, k)

    @property
    def capturing(self) -> bool:
        return any(c.capturing for c in self.chips)

    @property
    def dram_peak_per_bank(self) -> int:
        """The highest per-bank DRAM high-water mark over the chips."""
        return max(c.dram_peak_per_bank for c in self.chips)

    @property
    def dram_peak_less_traces(self) -> int:
        """The same over the chips, without the trace buffers (``DeviceBase``'s)."""
        return max(c.dram_peak_less_traces for c in self.chips)

    @property
    def counts(self) -> dict[str, int]:
        """Op counts of chip 0 (every chip runs the same ops)."""
        return self.chips[0].counts

    def inject_fault(self, chip: int, op: str = "fill_cache") -> None:
        """The next ``op`` on ``chip`` raises :class:`InjectedFault` (chips before it in mesh
        order have run theirs: a device error leaves the mesh half-done)."""
        self._faults[(chip, op)] = 1

    # ---- SPMD dispatch ---------------------------------------------------------------------
    def _spmd(
        self, name: str, resolve: Callable[[VirtualTTNN], Any], args: tuple[Any, ...], kw: dict
    ) -> Any:
        """Run ``name`` on every chip with that chip's shards; a call with only plain (one-chip)
        tensors runs on their chip alone (``get_device_tensors(t)[0]`` reads)."""
        if self._n == 1 or not has_mesh(args, kw):
            owner = owner_chip(args, kw, self.chips)
            if owner is not None or self._n == 1:
                idx = owner or 0
                self._fault(idx, name)
                return resolve(self.chips[idx])(*at_chip(args, idx), **at_chip(kw, idx))
        if self.mirror:
            self._fault(0, name)
            return mirrored(resolve(self.chips[0])(*at_chip(args, 0), **at_chip(kw, 0)), self._n)
        results = []
        for i, chip in enumerate(self.chips):
            self._fault(i, name)
            results.append(resolve(chip)(*at_chip(args, i), **at_chip(kw, i)))
        return gather_results(results)

    def _fault(self, chip: int, op: str) -> None:
        if self._faults.pop((chip, op), 0):
            raise InjectedFault(f"chip {chip}: injected {op} failure")

    # ---- device ----------------------------------------------------------------------------
    def set_fabric_config(self, config: _Fabric, *args: Any, **kwargs: Any) -> None:
        """Before ``open_mesh_device``; CCLs need a fabric (notes 1.4)."""
        if self.device is not None and config is not FabricConfig.DISABLED:
            raise ContractViolation("mesh.fabric", "set_fabric_config after the mesh is open")
        self.fabric = config

    def get_fabric_config(self) -> _Fabric:
        return self.fabric

    def open_mesh_device(
        self,
        mesh_shape: _Shape | None = None,
        l1_small_size: int = 0,
        trace_region_size: int = 0,
        num_command_queues: int = 1,
        dispatch_core_config: Any = None,
        offset: Any = None,
        physical_device_ids: Sequence[int] = (),
        worker_l1_size: int = 0,
    ) -> FakeMeshDevice:
        shape = mesh_shape or MeshShape(1, self._num_devices)
        n = shape.mesh_size()
        if n > self._num_devices:
            raise RuntimeError(f"{shape} needs {n} chips; the system has {self._num_devices}")
        ids = list(physical_device_ids) or list(range(n))
        if len(ids) != n or len(set(ids)) != n or max(ids) >= self._num_devices:
            raise ContractViolation("mesh.device_ids", f"physical_device_ids {ids} for {shape}")
        while len(self.chips) < (1 if self.mirror else n):
            self.chips.append(
                VirtualTTNN(num_devices=self._num_devices, chip=self.chip, **self._chip_kwargs)
            )
        devices = [
            c.open_device(device_id=i, trace_region_size=trace_region_size, l1_small_size=0)
            for i, c in zip(ids, self.chips, strict=False)
        ]
        self._n = n
        self.device = FakeMeshDevice(shape, devices * n if self.mirror else devices, ids)
        return self.device

    def close_mesh_device(self, mesh_device: FakeMeshDevice) -> None:
        self.device = None

    # ---- distribution ----------------------------------------------------------------------
    def replicate_tensor_to_mesh_mapper(self, mesh_device: FakeMeshDevice) -> MeshMapper:
        return MeshMapper((mesh_device.get_num_devices(),), (PlacementReplicate(),))

    def shard_tensor_to_mesh_mapper(self, mesh_device: FakeMeshDevice, dim: int) -> MeshMapper:
        """A ``MeshShape(num_devices)`` distribution mapped row-major onto the mesh
        (distributed_tensor.cpp ``shard_tensor_to_mesh_mapper``)."""
        return MeshMapper((mesh_device.get_num_devices(),), (PlacementShard(dim),))

    def create_mesh_mapper(self, mesh_device: FakeMeshDevice, config: _MapperConfig) -> MeshMapper:
        """``TensorToMesh::create``: the distribution shape is the override or the mesh's
        shape, no larger than the mesh, with one placement per dimension."""
        shape = tuple(config.mesh_shape_override or mesh_device.shape)
        if int(np.prod(shape)) > mesh_device.get_num_devices():
            raise ContractViolation(
                "mesh.mapper", f"mesh shape {shape} does not fit the device {mesh_device.shape}"
            )
        if len(shape) != len(config.placements):
            raise ContractViolation(
                "mesh.mapper",
                f"The number of dimensions in the mesh shape {shape} does not match the number "
                f"of placements in the config {list(config.placements)}",
            )
        return MeshMapper(shape, tuple(config.placements))

    def ShardTensor2dMesh(
        self,
        mesh_device: FakeMeshDevice,
        mesh_shape: tuple[int, int],
        dims: tuple[int | None, int | None],
    ) -> MeshMapper:
        """The deprecated wrapper (ttnn/ttnn/distributed/distributed.py): ``dims[i]`` None
        replicates over mesh axis i."""
        placements = [PlacementReplicate() if d is None else PlacementShard(d) for d in dims]
        return self.create_mesh_mapper(
            mesh_device, MeshMapperConfig(placements, MeshShape(*mesh_shape))
        )

    def concat_mesh_to_tensor_composer(self, mesh_device: FakeMeshDevice, dim: int) -> MeshComposer:
        return MeshComposer(dim)

    def get_device_tensors(self, tensor: MeshTensor | ChipTensor) -> list[ChipTensor]:
        return list(tensor.shards) if isinstance(tensor, MeshTensor) else [tensor]

    def Tensor(
        self,
        array: Any,
        data_type: Any = None,
        layout: Any = None,
        mesh_mapper: MeshMapper | None = None,
    ) -> ChipTensor | MeshTensor:
        """Host tensor; with a mapper, one host shard per chip in row-major mesh order (1-D:
        ``torch.chunk`` semantics, where an uneven split would leave a chip with nothing, which
        the SPMD program cannot run; N-D: every axis splits evenly)."""
        if mesh_mapper is None:
            return self.chips[0].Tensor(array, data_type=data_type, layout=layout)
        arr = np.asarray(array)
        n = mesh_mapper.num_devices
        parts = distribute(arr, mesh_mapper)
        return MeshTensor(
            [
                c.Tensor(np.ascontiguousarray(p), data_type=data_type, layout=layout)
                for c, p in zip(self._chips(n), parts, strict=True)
            ]
        )

    def _chips(self, n: int) -> list[VirtualTTNN]:
        if self._n < n:
            raise ContractViolation("mesh.open", "a mesh mapper before open_mesh_device")
        return [self.chips[0]] * n if self.mirror else self.chips[:n]

    def to_device(
        self, tensor: ChipTensor | MeshTensor, device: Any, memory_config: Any = None
    ) -> ChipTensor | MeshTensor:
        """A host tensor without a mapper is replicated (Programming_Mesh_of_Devices 4.2.2)."""
        if isinstance(device, FakeMeshDevice) and not isinstance(tensor, MeshTensor):
            if self._n == 1:
                return self.chips[0].to_device(tensor, device.chips[0], memory_config)
            tensor = MeshTensor([tensor] * self._n)
        return self._spmd(
            "to_device", lambda c: c.to_device, (tensor, device), {"memory_config": memory_config}
        )

    def copy_host_to_device_tensor(self, host: Any, device_tensor: Any) -> None:
        """The host tensor must carry the device tensor's distribution (notes 4)."""
        if isinstance(device_tensor, MeshTensor) and not isinstance(host, MeshTensor):
            raise ContractViolation(
                "mesh.distribution",
                "copy_host_to_device_tensor of a one-chip host tensor into a mesh tensor: build "
                "the host tensor with the device tensor's mesh_mapper",
            )
        self._spmd(
            "copy_host_to_device_tensor",
            lambda c: c.copy_host_to_device_tensor,
            (host, device_tensor),
            {},
        )

    # ---- tensor files ----------------------------------------------------------------------
    def dump_tensor(self, file_name: str, tensor: ChipTensor | MeshTensor) -> None:
        """A mesh tensor's file holds every chip's shard and the mesh shape (ttnn's flatbuffer
        file records the distribution); a one-chip tensor's file is the single-device one."""
        if not isinstance(tensor, MeshTensor):
            self.chips[0].dump_tensor(file_name, tensor)
            return
        shards = [tensor_payload(s) for s in tensor.shards]
        Path(file_name).write_bytes(pickle.dumps({"mesh": self._mesh_shape(), "shards": shards}))

    def load_tensor(
        self, file_name: str, *, device: FakeMeshDevice | None = None
    ) -> ChipTensor | MeshTensor:
        """A distributed file loads onto a mesh of the shape it was written on, each chip its
        own shard; a one-chip file loaded onto the mesh is replicated (``ttnn.as_tensor`` caches
        replicated weights unsharded "so that it can be loaded on any device")."""
        payload = pickle.loads(Path(file_name).read_bytes())
        on_device = device is not None
        if not isinstance(payload, dict):
            if not on_device or self._n == 1:
                return self.chips[0].from_payload(payload, device=on_device)
            return MeshTensor([c.from_payload(payload, device=True) for c in self._chips(self._n)])
        if payload["mesh"] != self._mesh_shape():
            raise ContractViolation(
                "mesh.distribution",
                f"{file_name} was written on a {payload['mesh']} mesh; this one is "
                f"{self._mesh_shape()}",
            )
        shards = payload["shards"]
        chips = self._chips(len(shards))
        return MeshTensor(
            [c.from_payload(p, device=on_device) for c, p in zip(chips, shards, strict=True)]
        )

    # ---- traces ----------------------------------------------------------------------------
    def begin_trace_capture(self, device: Any, *, cq_id: int = 0) -> Any:
        tid = self._spmd("begin_trace_capture", lambda c: c.begin_trace_capture, (device,), {})
        if self._n > 1:
            shared: list[Any] = []  # every chip's ops (and the CCLs) in call order
            for i, c in enumerate(self.chips):
                c._traces[at_chip(tid, i)].steps = shared
        return tid

    def execute_trace(
        self, device: Any, trace_id: Any, *, cq_id: int = 0, blocking: bool = True
    ) -> None:
        if self._n == 1:
            self.chips[0].execute_trace(
                at_chip(device, 0), trace_id, cq_id=cq_id, blocking=blocking
            )
            return
        traces = [c.check_replay(at_chip(trace_id, i)) for i, c in enumerate(self.chips)]
        if self.shape_only:
            return
        for replay, _ in traces[0].steps:
            replay()
