"""The virtual mesh's values: fabric and topology settings, ``MeshShape``, placements, mesh
mappers and composers, mesh tensors (one shard per chip) and the mesh device; and the SPMD
helpers that take a call's mesh values apart per chip and put the chips' results together
(``mesh.py`` runs the calls, ``ccl.py`` the collectives)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeAlias

import numpy as np

from tt_serve.model.tt.virtual import rules_base
from tt_serve.model.tt.virtual.device import VirtualTTNN
from tt_serve.model.tt.virtual.tensors import Buffer, ContractViolation, CoreCoord, FakeDevice
from tt_serve.model.tt.virtual.tensors import Tensor as ChipTensor


class InjectedFault(RuntimeError):
    """A device error the test injected (``VirtualMeshTTNN.inject_fault``)."""


class FabricConfig(Enum):
    DISABLED = "disabled"
    FABRIC_1D = "fabric_1d"
    FABRIC_1D_RING = "fabric_1d_ring"
    FABRIC_2D = "fabric_2d"
    FABRIC_2D_TORUS_XY = "fabric_2d_torus_xy"


TWO_D_FABRICS = (FabricConfig.FABRIC_2D, FabricConfig.FABRIC_2D_TORUS_XY)
RING_FABRICS = (FabricConfig.FABRIC_1D_RING, FabricConfig.FABRIC_2D_TORUS_XY)


class Topology(Enum):
    Ring = "ring"
    Linear = "linear"


class MeshShape:
    """``ttnn.MeshShape(s0, s1)`` or ``MeshShape(sequence)``; no ``y=``/``x=`` kwargs (0.81.1)."""

    def __init__(self, *dims: Any) -> None:
        vals = tuple(dims[0]) if len(dims) == 1 and not isinstance(dims[0], int) else dims
        self._dims = tuple(int(d) for d in vals)

    def dims(self) -> int:
        return len(self._dims)

    def mesh_size(self) -> int:
        return int(np.prod(self._dims))

    def __getitem__(self, i: int) -> int:
        return self._dims[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._dims)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeshShape) and other._dims == self._dims

    def __hash__(self) -> int:
        return hash(self._dims)

    def __repr__(self) -> str:
        return f"MeshShape({list(self._dims)})"


@dataclass(frozen=True)
class PlacementShard:
    """``ttnn.PlacementShard(dim)``: split tensor dim ``dim`` over one mesh axis."""

    dim: int


@dataclass(frozen=True)
class PlacementReplicate:
    """``ttnn.PlacementReplicate()``: a full copy on every chip of one mesh axis."""


Placement: TypeAlias = PlacementShard | PlacementReplicate


@dataclass(frozen=True)
class MeshMapperConfig:
    """``ttnn.MeshMapperConfig(placements, mesh_shape_override=None)``: one placement per
    dimension of the distribution shape (the mesh's own shape unless overridden)."""

    placements: Sequence[Placement]
    mesh_shape_override: MeshShape | None = None


@dataclass(frozen=True)
class MeshMapper:
    """A ``CppTensorToMesh``: a distribution ``shape`` (row-major onto the mesh) and one
    placement per distribution dim."""

    shape: tuple[int, ...]
    placements: tuple[Placement, ...]

    @property
    def num_devices(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class MeshComposer:
    """A ``CppMeshToTensor`` concatenating the shards along ``dim`` in mesh-coordinate order."""

    dim: int


@dataclass(frozen=True)
class PerChip:
    """A value that differs per chip (device handles, events): chip i gets ``values[i]``."""

    values: tuple[Any, ...]


@dataclass(frozen=True)
class GlobalSemaphore:
    """``ttnn.create_global_semaphore``: one L1 word on the given cores of every chip."""

    serial: int


class MeshTensor:
    """One shard per chip (row-major mesh order); ``shape`` is the per-chip shard shape."""

    def __init__(self, shards: list[ChipTensor]) -> None:
        self.shards = shards

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shards[0].shape

    @property
    def padded_shape(self) -> tuple[int, ...]:
        return self.shards[0].padded_shape

    @property
    def dtype(self) -> Any:
        return self.shards[0].dtype

    @property
    def layout(self) -> Any:
        return self.shards[0].layout

    @property
    def buffer(self) -> Buffer:
        """Chip 0's buffer (what a test pokes; per-chip buffers are in ``shards``)."""
        return self.shards[0].buffer

    def info(self) -> rules_base.TensorInfo:
        return self.shards[0].info()

    def to_numpy(self, mesh_composer: MeshComposer | None = None) -> np.ndarray:
        if mesh_composer is None:
            raise ContractViolation(
                "mesh.compose",
                f"Can't convert a tensor distributed on {len(self.shards)} chips to a row-major "
                "logical tensor. Supply a mesh composer (or read get_device_tensors(t)[0])",
            )
        return np.concatenate([s.to_numpy() for s in self.shards], mesh_composer.dim)


class FakeMeshDevice:
    """``ttnn.MeshDevice``: ``shape``, ``get_num_devices``, ``get_device_ids`` (no
    ``get_devices``, absent in 0.81.1)."""

    def __init__(self, shape: MeshShape, chips: list[FakeDevice], ids: list[int]) -> None:
        self.shape, self.chips, self._ids = shape, chips, ids

    def get_num_devices(self) -> int:
        return len(self.chips)

    def get_device_ids(self) -> list[int]:
        return list(self._ids)

    def compute_with_storage_grid_size(self) -> CoreCoord:
        return self.chips[0].compute_with_storage_grid_size()


def distribute(arr: np.ndarray, mapper: MeshMapper) -> list[np.ndarray]:
    """The host shards ``mapper`` gives, in row-major order of its distribution shape."""
    dims = [p.dim % arr.ndim for p in mapper.placements if isinstance(p, PlacementShard)]
    if len(dims) != len(set(dims)):
        raise ContractViolation("mesh.mapper", f"dims must be unique: {list(mapper.placements)}")
    pieces = [arr]
    for ways, placement in zip(mapper.shape, mapper.placements, strict=True):
        if isinstance(placement, PlacementReplicate):
            pieces = [p for p in pieces for _ in range(ways)]
            continue
        d = placement.dim
        if arr.shape[d] % ways:
            rule = "mesh.shard_uneven"
            if len(mapper.shape) > 1:
                raise ContractViolation(
                    rule,
                    f"ND sharding requires the number of chunks to match the mesh dimension size "
                    f"{ways}: dim {d} of {arr.shape}",
                )
            raise ContractViolation(rule, f"dim {d} of {arr.shape} over {ways} chips")
        pieces = [q for p in pieces for q in np.split(p, ways, axis=d)]
    return pieces


def has_mesh(args: Any, kw: dict) -> bool:
    def walk(v: Any) -> bool:
        if isinstance(v, (MeshTensor, PerChip, FakeMeshDevice)):
            return True
        if isinstance(v, (list, tuple)):
            return any(walk(x) for x in v)
        return False

    return walk(args) or walk(tuple(kw.values()))


def owner_chip(args: Any, kw: dict, chips: list[VirtualTTNN]) -> int | None:
    """The chip of the first plain tensor among the arguments."""
    for v in itertools.chain(args, kw.values()):
        for t in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(t, ChipTensor):
                return next(i for i, c in enumerate(chips) if c is t._fake)
    return None


def at_chip(v: Any, i: int) -> Any:
    if isinstance(v, MeshTensor):
        return v.shards[i]
    if isinstance(v, PerChip):
        return v.values[i]
    if isinstance(v, FakeMeshDevice):
        return v.chips[i]
    if isinstance(v, dict):
        return {k: at_chip(x, i) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(at_chip(x, i) for x in v)
    return v


def mirrored(result: Any, n: int) -> Any:
    """One chip's result standing for all ``n`` (``mirror``)."""
    if isinstance(result, ChipTensor):
        return MeshTensor([result] * n)
    if isinstance(result, (list, tuple)):
        return type(result)(mirrored(r, n) for r in result)
    return result


def gather_results(results: list[Any]) -> Any:
    first = results[0]
    if isinstance(first, ChipTensor):
        return MeshTensor(list(results))
    if isinstance(first, (list, tuple)):
        return type(first)(gather_results(list(col)) for col in zip(*results, strict=True))
    if all(r == first for r in results[1:]):
        return first
    return PerChip(tuple(results))
