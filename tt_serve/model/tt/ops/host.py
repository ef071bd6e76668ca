"""Host <-> device, never inside a trace capture: host tensors and their mesh distribution,
uploads and allocation, blocking and non-blocking reads, and tensor files (``dump`` /
``load_tensor``); host data is numpy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tt_serve.model.tt.layout import TILE
from tt_serve.model.tt.ops.device import DeviceOps, Tensor

# bytes per element of what a read copies (float tensors are typecast to float32 first)
READ_ELEMENT_BYTES = {"float32": 4, "uint32": 4, "int32": 4, "uint16": 2}


@dataclass(frozen=True)
class PendingRead:
    """A device -> host copy in flight: ``host`` is not readable before ``event`` completes."""

    host: Tensor
    event: Any


class HostOps(DeviceOps):
    """Host tensors, uploads, reads and tensor files."""

    def host(
        self,
        array: np.ndarray,
        dtype: str,
        layout: str = TILE,
        *,
        shard_dim: int | None = None,
        mesh_dims: tuple[int | None, int | None] | None = None,
    ) -> Tensor:
        """A host ttnn tensor from numpy (torch-free: the nanobind ArrayLike constructor). On a
        mesh it carries a distribution: replicated, ``shard_dim`` split into one contiguous
        chunk per chip in row-major chip order (``shard_tensor_to_mesh_mapper``), or
        ``mesh_dims`` (the dim split over the rows, the one over the columns; None: replicated
        on that axis: ``ShardTensor2dMesh``'s ``create_mesh_mapper`` config). The host tensor of
        a persistent input must match its device tensor's distribution for
        ``copy_host_to_device_tensor``."""
        src: np.ndarray = np.ascontiguousarray(array, dtype=_numpy_source_dtype(dtype))
        kw: dict[str, Any] = {}
        if self.num_chips > 1:
            kw["mesh_mapper"] = self._mapper(shard_dim, mesh_dims)
        elif shard_dim is not None or mesh_dims is not None:
            raise ValueError("shard_dim / mesh_dims need a mesh")
        return self.ttnn.Tensor(src, data_type=self.dtype(dtype), layout=self.layout(layout), **kw)

    def to_device(self, host: Tensor) -> Tensor:
        return self.ttnn.to_device(host, self.device, memory_config=self.ttnn.DRAM_MEMORY_CONFIG)

    def _mapper(
        self, shard_dim: int | None, mesh_dims: tuple[int | None, int | None] | None
    ) -> Any:
        t = self.ttnn
        if mesh_dims is not None:
            assert self.mesh is not None
            placements = [
                t.PlacementReplicate() if d is None else t.PlacementShard(d) for d in mesh_dims
            ]
            return t.create_mesh_mapper(
                self.device, t.MeshMapperConfig(placements, t.MeshShape(*self.mesh))
            )
        if shard_dim is None:
            return t.replicate_tensor_to_mesh_mapper(self.device)
        return t.shard_tensor_to_mesh_mapper(self.device, shard_dim)

    def upload(
        self,
        array: np.ndarray,
        dtype: str,
        layout: str = TILE,
        *,
        shard_dim: int | None = None,
        mesh_dims: tuple[int | None, int | None] | None = None,
    ) -> Tensor:
        return self.to_device(
            self.host(array, dtype, layout, shard_dim=shard_dim, mesh_dims=mesh_dims)
        )

    def zeros(self, shape: Sequence[int], dtype: str, layout: str = TILE) -> Tensor:
        """A zero-filled device tensor: how persistent buffers and pools are allocated."""
        return self.ttnn.zeros(
            list(shape),
            dtype=self.dtype(dtype),
            layout=self.layout(layout),
            device=self.device,
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
        )

    def allocate(self, shape: Sequence[int], dtype: str, layout: str = TILE) -> Tensor:
        """A device tensor with no host data and no fill (contents undefined): a weight known
        by its shape only (planning; real sizes on mock boxes, where nothing computes)."""
        t = self.ttnn
        return t.allocate_tensor_on_device(
            t.Shape(list(shape)),
            self.dtype(dtype),
            self.layout(layout),
            self.device,
            t.DRAM_MEMORY_CONFIG,
        )

    def write(self, host: Tensor, device_tensor: Tensor) -> None:
        """Refresh a persistent device tensor in place (same shape, dtype and layout)."""
        self.ttnn.copy_host_to_device_tensor(host, device_tensor)

    def read(self, t: Tensor) -> np.ndarray:
        """Device tensor -> numpy (float32 for float dtypes; numpy has no bfloat16). Blocking.
        On a mesh ``t`` is replicated and chip 0's copy is read, as tt-metal reads
        ``get_device_tensors(t)[0]`` (models/common/sampling/tt_sampling.py)."""
        src = self._replica(self._readable(t))
        self.bytes_read += self._buffer_bytes(src)
        host = self.ttnn.from_device(src)
        return self._host_numpy(host)

    def read_start(self, t: Tensor) -> PendingRead:
        """Enqueue a non-blocking read of ``t`` and an event after it; returns at once.

        The device runs commands in order, so the read sees ``t`` as of this point of the queue
        even when later commands (a trace replay) overwrite it before the host looks. A typecast
        copy (float tensors) is not kept alive: anything reusing its memory runs after the read,
        and a buffer kept past the next replay would break the trace allocation rule."""
        src = self._replica(self._readable(t))
        self.bytes_read += self._buffer_bytes(src)
        host = self.ttnn.from_device(src, blocking=False)
        event = self.ttnn.record_event(self.device, cq_id=0)
        return PendingRead(host=host, event=event)

    def read_finish(self, pending: PendingRead) -> np.ndarray:
        """Wait for a read started by :meth:`read_start` and convert it like :meth:`read`."""
        self.ttnn.event_synchronize(pending.event)
        return self._host_numpy(pending.host)

    def read_concat(self, t: Tensor, dim: int) -> np.ndarray:
        """A mesh tensor sharded on ``dim`` -> numpy of the whole tensor (every chip's shard
        read, concatenated in mesh order by ``ConcatMeshToTensor``). Blocking."""
        if self.num_chips == 1:
            return self.read(t)
        src = self._readable(t)
        self.bytes_read += self._buffer_bytes(src) * self.num_chips
        host = self.ttnn.from_device(src)
        if host.layout == self.ttnn.TILE_LAYOUT:
            host = self.ttnn.to_layout(host, self.ttnn.ROW_MAJOR_LAYOUT)
        composer = self.ttnn.concat_mesh_to_tensor_composer(self.device, dim)
        return np.asarray(host.to_numpy(mesh_composer=composer))

    def _replica(self, t: Tensor) -> Tensor:
        return t if self.num_chips == 1 else self.ttnn.get_device_tensors(t)[0]

    def _readable(self, t: Tensor) -> Tensor:
        # numpy has no bfloat16: float tensors are typecast on the device (enqueued before the
        # read, so it is ordered with it).
        if t.dtype in (self.ttnn.bfloat16, self.ttnn.bfloat8_b, self.ttnn.bfloat4_b):
            return self.ttnn.typecast(t, self.ttnn.float32)
        return t

    def _buffer_bytes(self, t: Tensor) -> int:
        """What a read of ``t`` copies: its whole (tile-padded) buffer."""
        size = next(b for name, b in READ_ELEMENT_BYTES.items() if t.dtype == self.dtype(name))
        return int(np.prod(list(t.padded_shape))) * size

    def _host_numpy(self, host: Tensor) -> np.ndarray:
        if host.layout == self.ttnn.TILE_LAYOUT:
            host = self.ttnn.to_layout(host, self.ttnn.ROW_MAJOR_LAYOUT)
        return np.asarray(host.to_numpy())

    def cache_host(
        self,
        array: np.ndarray,
        dtype: str,
        layout: str = TILE,
        *,
        shard_dim: int | None = None,
        mesh_dims: tuple[int | None, int | None] | None = None,
    ) -> Tensor:
        """The host tensor a converted-weight cache file holds (:meth:`dump`): a sharded weight
        with its mesh mapper (every chip's shard in one file), a replicated one as one unmapped
        copy, which :meth:`load_tensor` and :meth:`to_device` replicate over a mesh, as
        ``ttnn.as_tensor`` caches replicated weights unsharded "so that it can be loaded on any
        device" (one copy on disk, not one per chip)."""
        if shard_dim is not None or mesh_dims is not None:
            return self.host(array, dtype, layout, shard_dim=shard_dim, mesh_dims=mesh_dims)
        src: np.ndarray = np.ascontiguousarray(array, dtype=_numpy_source_dtype(dtype))
        return self.ttnn.Tensor(src, data_type=self.dtype(dtype), layout=self.layout(layout))

    def dump(self, path: Path, host: Tensor) -> None:
        """Write a host tensor to ``path``; a mesh tensor's file keeps its distribution."""
        self.ttnn.dump_tensor(str(path), host)

    def load_tensor(self, path: Path) -> Tensor:
        """A :meth:`dump` file onto the open device or mesh, distributed as it was written."""
        return self.ttnn.load_tensor(str(path), device=self.device)

    def tensor_bytes(self, t: Tensor, scratch: Path) -> bytes:
        """A device tensor as ``dump_tensor`` bytes, in its own layout and dtype (TILE stays
        TILE, block floats stay packed: no conversion on the host, so :meth:`tensor_from_bytes`
        gives back the same bits). ``scratch``: a file path the dump may use. Blocking."""
        self.ttnn.dump_tensor(str(scratch), self.ttnn.from_device(t))
        try:
            return scratch.read_bytes()
        finally:
            scratch.unlink(missing_ok=True)

    def tensor_from_bytes(self, data: bytes, scratch: Path) -> Tensor:
        """The device tensor of :meth:`tensor_bytes` bytes, distributed as it was dumped."""
        scratch.write_bytes(data)
        try:
            return self.load_tensor(scratch)
        finally:
            scratch.unlink(missing_ok=True)

    def deallocate(self, t: Tensor) -> None:
        self.ttnn.deallocate(t)


def _numpy_source_dtype(dtype: str) -> type:
    # Float data is handed over as float32 and rounded by ttnn (round-to-nearest-even to bf16,
    # block-float for bfloat8_b and bfloat4_b); integer tensors keep their exact width.
    return {"uint32": np.uint32, "int32": np.int32}.get(dtype, np.float32)
