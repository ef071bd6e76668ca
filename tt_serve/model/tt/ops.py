"""The one thin adapter through which every ttnn call of the backend goes.

``Ops`` wraps a ttnn module handle: the real package (``Ops.load()``, imported lazily so that
``import tt_serve.model.tt`` works without ttnn) or, in tests, a contract fake with the same
surface. Methods are deliberately one call deep, keyword names exactly as in ttnn 0.81.1, so
``tests/tt_host`` can check every ``self.ttnn.<op>(..., kw=...)`` written here against the real
nanobind signatures. Device tensors are opaque (``Tensor = Any``); host data is numpy.

Rules this file keeps (see tt-metal's trace tech report): nothing here reads or writes the host
while a trace is being captured (the callers only use ``write``/``read`` outside captures), a
non-blocking read (``read_start``) is converted only after its event has completed, and
ops used under trace take every runtime value as a device tensor (chunk start, positions, page
tables, constant tiles), never a Python int that would be baked into the captured program.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tt_serve.model.tt.layout import TILE

Tensor = Any
# bytes per element of what a read copies (float tensors are typecast to float32 first)
READ_ELEMENT_BYTES = {"float32": 4, "uint32": 4, "int32": 4, "uint16": 2}


@dataclass(frozen=True)
class PendingRead:
    """A device -> host copy in flight: ``host`` is not readable before ``event`` completes."""

    host: Tensor
    event: Any


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


class Ops:
    """ttnn, one method per op. ``device`` is set by :meth:`open_device`."""

    def __init__(self, ttnn_module: Any) -> None:
        self.ttnn = ttnn_module
        self.device: Any = None
        self.trace_region_size = 0  # what the open device reserved for traces
        self.bytes_read = 0  # device -> host bytes copied by read / read_start (padded buffers)
        self.mesh: tuple[int, int] | None = None  # the opened MeshDevice's shape (open_mesh)

    @classmethod
    def load(cls) -> Ops:
        """The real ttnn (raises ImportError when it is not installed)."""
        import ttnn

        return cls(ttnn)

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

    # ---- host <-> device (never inside a trace capture) ----------------------------------
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

    # ---- traces ----------------------------------------------------------------------------
    def begin_trace(self) -> Any:
        return self.ttnn.begin_trace_capture(self.device, cq_id=0)

    def end_trace(self, trace_id: Any) -> None:
        self.ttnn.end_trace_capture(self.device, trace_id, cq_id=0)

    def execute_trace(self, trace_id: Any, *, blocking: bool) -> None:
        self.ttnn.execute_trace(self.device, trace_id, cq_id=0, blocking=blocking)

    def release_trace(self, trace_id: Any) -> None:
        self.ttnn.release_trace(self.device, trace_id)

    # ---- layout / data movement ------------------------------------------------------------
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

    # ---- math --------------------------------------------------------------------------------
    def embedding(self, ids: Tensor, weight: Tensor) -> Tensor:
        return self.ttnn.embedding(ids, weight, layout=self.ttnn.TILE_LAYOUT)

    def linear(self, x: Tensor, w: Tensor, compute_config: Any = None) -> Tensor:
        """x [..., in] @ w [in, out] (weights are stored transposed, as ttnn expects);
        ``compute_config`` from :meth:`compute_config` (None: the op's default, HiFi2)."""
        return self.ttnn.linear(x, w, compute_kernel_config=compute_config)

    def matmul(
        self, a: Tensor, b: Tensor, compute_config: Any = None, *, dtype: str | None = None
    ) -> Tensor:
        """a [..., M, K] @ b [..., K, N]. ``dtype``: the output's (None: a's dtype, ttnn's
        default, which is wrong when a is a block-float weight)."""
        out_dtype = self.dtype(dtype) if dtype is not None else None
        return self.ttnn.matmul(a, b, compute_kernel_config=compute_config, dtype=out_dtype)

    def matmul_1d_config(
        self, *, cores: tuple[int, int], in0_block_w: int, per_core_m: int, per_core_n: int
    ) -> Any:
        """A 1D multicast program config with in0 multicast (the one config sparse_matmul
        takes): ``cores`` (x, y) of the grid, 1x1 output subblocks, one output block per core."""
        t = self.ttnn
        return t.MatmulMultiCoreReuseMultiCast1DProgramConfig(
            compute_with_storage_grid_size=t.CoreCoord(cores[0], cores[1]),
            in0_block_w=in0_block_w,
            out_subblock_h=1,
            out_subblock_w=1,
            out_block_h=1,
            out_block_w=1,
            per_core_M=per_core_m,
            per_core_N=per_core_n,
            fuse_batch=False,
            fused_activation=None,
            mcast_in0=True,
        )

    def sparse_matmul(
        self,
        a: Tensor,
        b: Tensor,
        sparsity: Tensor,
        *,
        program_config: Any,
        a_sparse: bool,
        b_sparse: bool,
        compute_config: Any = None,
        dtype: str | None = None,
    ) -> Tensor:
        """Batched a @ b computed only where ``sparsity`` (bf16 ROW_MAJOR, rank 4) is non-zero,
        zeros elsewhere (ttnn's mode table: ``limits.sparse_matmul``). ``nnz`` stays None: the
        op counts the non-zero entries on the device, so a trace replays with any routing."""
        out_dtype = self.dtype(dtype) if dtype is not None else None
        return self.ttnn.sparse_matmul(
            a,
            b,
            sparsity=sparsity,
            program_config=program_config,
            nnz=None,
            is_input_a_sparse=a_sparse,
            is_input_b_sparse=b_sparse,
            compute_kernel_config=compute_config,
            dtype=out_dtype,
        )

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return self.ttnn.rms_norm(x, epsilon=eps, weight=weight)

    def add(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.add(a, b)

    def sub(self, a: Tensor | float, b: Tensor) -> Tensor:
        return self.ttnn.sub(a, b)

    def mul(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.mul(a, b)

    def sigmoid(self, x: Tensor) -> Tensor:
        return self.ttnn.sigmoid(x)

    def silu(self, x: Tensor) -> Tensor:
        return self.ttnn.silu(x)

    def softplus(self, x: Tensor) -> Tensor:
        return self.ttnn.softplus(x, beta=1.0, threshold=20.0)

    def rsqrt(self, x: Tensor) -> Tensor:
        return self.ttnn.rsqrt(x)

    def reciprocal(self, x: Tensor) -> Tensor:
        return self.ttnn.reciprocal(x)

    def sum(self, x: Tensor, dim: int) -> Tensor:
        return self.ttnn.sum(x, dim, keepdim=True)

    def softmax(self, x: Tensor) -> Tensor:
        return self.ttnn.softmax(x, -1, numeric_stable=True)

    def where(
        self,
        predicate: Tensor,
        true_value: Tensor | float,
        false_value: Tensor | float,
        *,
        out: Tensor | None = None,
    ) -> Tensor:
        """``predicate ? true_value : false_value``: a select, so NaN or Inf in the operand not
        taken does not leak (a multiply by a 0/1 mask would: 0 x NaN = NaN). ``out``: written
        in place (elementwise, so it may be one of the inputs)."""
        return self.ttnn.where(predicate, true_value, false_value, output_tensor=out)

    def exp(self, x: Tensor) -> Tensor:
        return self.ttnn.exp(x)

    def log(self, x: Tensor) -> Tensor:
        return self.ttnn.log(x)

    def ge(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.ge(a, b)

    def gt(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.gt(a, b)

    def le(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.le(a, b)

    def lt(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.lt(a, b)

    def eq(self, a: Tensor, b: Tensor | float) -> Tensor:
        return self.ttnn.eq(a, b)

    def topk(
        self, x: Tensor, k: int, *, labels: Tensor | None = None, stable: bool = False
    ) -> tuple[Tensor, Tensor]:
        """The k largest along the last dim, sorted: values and their positions (``labels``:
        the labels at those positions instead, ttnn's ``indices_tensor``). ``stable``: ties
        lowest position first (not allowed with labels); otherwise their order is unspecified."""
        values, indices = self.ttnn.topk(x, k, -1, True, True, indices_tensor=labels, stable=stable)
        return values, indices

    def argmax(self, logits: Tensor) -> Tensor:
        """Greedy ids on the device: UINT32, ROW_MAJOR (the multi-core argmax wants RM input)."""
        return self.ttnn.argmax(self.ttnn.to_layout(logits, self.ttnn.ROW_MAJOR_LAYOUT), dim=-1)

    def create_qkv_heads(
        self, fused: Tensor, num_heads: int, num_kv_heads: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """[1, 1, T, (nh + 2 nkv) hd] -> head-major q [1, nh, T, hd], k and v [1, nkv, T, hd]."""
        q, k, v = self.ttnn.experimental.nlp_create_qkv_heads(
            fused, num_heads=num_heads, num_kv_heads=num_kv_heads, transpose_k_heads=False
        )
        return q, k, v

    # ---- paged attention -----------------------------------------------------------------------
    def paged_fill_cache(self, cache: Tensor, x: Tensor, page_table: Tensor) -> None:
        self.ttnn.experimental.paged_fill_cache(cache, x, page_table, batch_idx=0)

    def paged_update_cache(
        self, cache: Tensor, x: Tensor, positions: Tensor, page_table: Tensor
    ) -> None:
        self.ttnn.experimental.paged_update_cache(
            cache, x, update_idxs_tensor=positions, page_table=page_table
        )

    def sdpa_program_config(
        self, q_chunk: int, k_chunk: int, *, max_cores_per_head_batch: int = 16
    ) -> Any:
        """SDPA program config on the device grid, exact exp (``exp_approx_mode`` would default
        to true). ``max_cores_per_head_batch=1``: no cross-core tree reduction in paged decode."""
        return self.ttnn.SDPAProgramConfig(
            compute_with_storage_grid_size=self.device.compute_with_storage_grid_size(),
            q_chunk_size=q_chunk,
            k_chunk_size=k_chunk,
            exp_approx_mode=False,
            max_cores_per_head_batch=max_cores_per_head_batch,
        )

    def compute_config(self, fidelity: str, *, fp32_acc: bool = False) -> Any:
        """A compute kernel config: math fidelity ``LoFi``/``HiFi2``/``HiFi4``, approximate SFPU
        math off, fp32 accumulation in the dest registers when ``fp32_acc``."""
        t = self.ttnn
        fidelities = {
            "LoFi": t.MathFidelity.LoFi,
            "HiFi2": t.MathFidelity.HiFi2,
            "HiFi4": t.MathFidelity.HiFi4,
        }
        return t.WormholeComputeKernelConfig(
            math_fidelity=fidelities[fidelity],
            math_approx_mode=False,
            fp32_dest_acc_en=fp32_acc,
            packer_l1_acc=False,
        )

    def chunked_sdpa(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        page_table: Tensor,
        chunk_start: Tensor,
        *,
        scale: float,
        program_config: Any,
        compute_config: Any = None,
    ) -> Tensor:
        return self.ttnn.transformer.chunked_scaled_dot_product_attention(
            q,
            k_cache,
            v_cache,
            page_table,
            chunk_start_idx_tensor=chunk_start,
            scale=scale,
            program_config=program_config,
            compute_kernel_config=compute_config,
        )

    def paged_sdpa_decode(
        self,
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        page_table: Tensor,
        cur_pos: Tensor,
        *,
        scale: float,
        program_config: Any = None,
        compute_config: Any = None,
    ) -> Tensor:
        """``None`` configs: the op's defaults (whole grid, tree reduction, approximate exp)."""
        return self.ttnn.transformer.paged_scaled_dot_product_attention_decode(
            q,
            k_cache,
            v_cache,
            page_table,
            cur_pos_tensor=cur_pos,
            scale=scale,
            program_config=program_config,
            compute_kernel_config=compute_config,
        )

    # ---- Gated DeltaNet ----------------------------------------------------------------------
    def conv_program_config(self, channel_chunk: int) -> Any:
        return self.ttnn.QkvCausalConv1dSiluProgramConfig(channel_chunk_size=channel_chunk)

    def qkv_causal_conv1d_silu(
        self,
        x: Tensor,
        history: Tensor,
        taps: Sequence[Tensor],
        widths: tuple[int, int, int],
        *,
        start: Tensor,
        program_config: Any,
    ) -> tuple[Tensor, Tensor, Tensor]:
        tap0, tap1, tap2, tap3 = taps
        q, k, v = self.ttnn.experimental.kda.qkv_causal_conv1d_silu(
            x,
            history,
            tap0,
            tap1,
            tap2,
            tap3,
            widths[0],
            widths[1],
            widths[2],
            program_config=program_config,
            actual_start=start,
            predecessor_carry=history,  # single device: the local history is the carry
        )
        return q, k, v

    def chunk_gated_delta_rule(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        *,
        state: Tensor,
        scale: float,
        chunk_size: int,
        consts: tuple[Tensor, Tensor, Tensor, Tensor],
    ) -> tuple[Tensor, Tensor]:
        eye, tril, ones, masks = consts
        o, final = self.ttnn.transformer.chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            scale=scale,
            initial_state=state,
            output_final_state=True,
            chunk_size=chunk_size,
            eye=eye,
            tril=tril,
            ones=ones,
            masks=masks,
        )
        return o, final

    def fused_recurrent_gated_delta_rule(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        *,
        state: Tensor,
        scale: float,
    ) -> tuple[Tensor, Tensor]:
        o, final = self.ttnn.transformer.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta, scale=scale, initial_state=state, output_final_state=True
        )
        return o, final

    # ---- collectives (a mesh only) ------------------------------------------------------------
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


def _numpy_source_dtype(dtype: str) -> type:
    # Float data is handed over as float32 and rounded by ttnn (round-to-nearest-even to bf16,
    # block-float for bfloat8_b and bfloat4_b); integer tensors keep their exact width.
    return {"uint32": np.uint32, "int32": np.int32}.get(dtype, np.float32)
