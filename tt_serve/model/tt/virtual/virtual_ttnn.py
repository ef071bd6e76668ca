"""CONTRACT FAKE of the ttnn surface that ``tt_serve/model/tt/ops.py`` uses. Not a simulator.

It computes each op's documented semantics with torch in float32 (so the tt backend can be
compared token for token with the torch reference; device numerics are tested only in
``tests/tt_hardware``) and enforces the ttnn rules the backend must respect, raising
``ContractViolation`` when one is broken:

* tile: TILE tensors pad to 32; paged caches, chunk lengths and conv widths must be tile-aligned;
* dtype: op inputs have the documented dtypes/layouts (uint32 ids, int32 page tables and
  positions, cache dtype == fill input dtype, bfloat8_b only in TILE, ...); argmax returns
  UINT32 ROW_MAJOR; copies need equal shape, dtype and layout;
* host_io: no host read or write while a trace is being captured;
* alloc: no device buffer allocated after a trace's capture may be alive when it replays;
* identity: a trace's inputs must still be alive (same buffers) at replay;
* one_trace: capturing a program identical to a live trace (same ops and shapes) is refused;
* runtime_args: under capture, the chunk start and cache positions must be device tensors, and
  chunk_gated_delta_rule must get its constant tiles explicitly;
* program_cache: every program captured must have run eagerly before (compile run);
* device limits (``tt_serve/model/tt/contract/rules.py``, rule names ``<op>.<check>``): every op call is
  checked against tt-metal's own validation for the virtual chip (default a Blackhole P150,
  ``VirtualTTNN(chip=WORMHOLE)`` for an 8x8 Wormhole): core-grid limits, shape, dtype, layout and
  sharding rules; every device allocation is charged to the chip's DRAM banks
  (``dram.capacity``); every capture is charged to the trace region at ``end_trace_capture``
  (``trace.region``, an estimate of the command stream) and released by ``release_trace``.
  Paged SDPA decode calls are recorded in ``sdpa_decode_plans`` (whether a program config was
  given, cores per head, exp_approx_mode); ``require_sdpa_program_config=True`` makes a missing
  config an error;
* async_read: the host tensor of ``from_device(blocking=False)`` is unreadable (to_numpy,
  to_layout, upload) until ``event_synchronize`` of an event recorded after the read, or
  ``synchronize_device``. The fake copies the value when the read is enqueued, as the in-order
  device would read it then, whatever later replays write into the source buffer.

Replay re-runs the recorded ops on the recorded buffers, in place, like a device trace.

``VirtualTTNN(shape_only=True)`` (the planner's device model, ``plan/planner.py``): tensors hold torch
``meta`` data (shape, dtype, layout and placement, no storage); ops run every rule above and
produce outputs of the right shape without computing; host reads return zeros; replays check
their rules and recompute nothing. Real-size models (Qwen3.5-9B) run in seconds.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tt_serve.model.ref.gdn import chunk_gated_delta, recurrent_gated_delta_step
from tt_serve.model.ref.layers import l2norm
from tt_serve.model.tt.contract import dram, rules
from tt_serve.model.tt.contract.boards import DEVICES, ChipSpec, device_spec

WORMHOLE = device_spec("n150").chip  # 8x8 workers, 12 x 1 GiB DRAM banks
P150 = device_spec("p150").chip  # 11x10 workers, 8 x (4 GiB - 16 MiB) DRAM banks


class ContractViolation(AssertionError):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


class DataType(Enum):
    BFLOAT16 = "bfloat16"
    BFLOAT8_B = "bfloat8_b"
    BFLOAT4_B = "bfloat4_b"
    FLOAT32 = "float32"
    UINT32 = "uint32"
    UINT16 = "uint16"
    INT32 = "int32"


class Layout(Enum):
    TILE = "tile"
    ROW_MAJOR = "row_major"


INT_TYPES = (DataType.UINT32, DataType.UINT16, DataType.INT32)


@dataclass(eq=False)
class Buffer:
    data: torch.Tensor
    serial: int
    on_device: bool
    freed: bool = False
    shard: rules.Shard | None = None  # L1 height-sharded (interleaved_to_sharded)
    pending: int = 0  # stamp of a non-blocking read not yet synchronized (0: readable)

    @property
    def sharded(self) -> bool:
        return self.shard is not None


class Shape(tuple):
    """``Tensor.shape`` as ttnn 0.81.1 returns it: ``ttnn.Shape`` indexes, iterates, compares
    and has a length, but does not slice (``shape[1:]`` raises TypeError on the real module)."""

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        if isinstance(key, slice):
            raise TypeError(
                "__getitem__(): incompatible function arguments: ttnn.Shape takes an int "
                "index, not a slice (use list(t.shape)[...])"
            )
        return tuple.__getitem__(self, key)


class Tensor:
    """A handle; device buffers die with their last handle (as ttnn tensors do)."""

    def __init__(self, fake: VirtualTTNN, buf: Buffer, dtype: DataType, layout: Layout) -> None:
        self._fake, self.buffer, self.dtype, self.layout = fake, buf, dtype, layout

    def __del__(self) -> None:
        self._fake._release(self.buffer)

    @property
    def shape(self) -> Shape:
        return Shape(self.buffer.data.shape)

    @property
    def padded_shape(self) -> tuple[int, ...]:
        s = list(self.shape)
        if self.layout is Layout.TILE and len(s) >= 2:
            s[-1], s[-2] = -(-s[-1] // 32) * 32, -(-s[-2] // 32) * 32
        return tuple(s)

    def info(self) -> rules.TensorInfo:
        """The operand as the device rules see it."""
        buf = self.buffer
        return rules.TensorInfo(
            tuple(self.shape),
            self.dtype.value,
            self.layout.value,
            "l1" if buf.shard is not None else "dram",
            buf.shard,
        )

    def to_numpy(self) -> np.ndarray:
        if self.buffer.on_device:
            raise ContractViolation("host_io", "to_numpy() of a device tensor: from_device first")
        _landed(self, "to_numpy()")
        d = self.buffer.data
        if d.is_meta:  # shape-only mode: a host read gives zeros of the right shape
            kind = np.uint32 if self.dtype is DataType.UINT32 else None
            return np.zeros(d.shape, kind or (np.int64 if self.dtype in INT_TYPES else np.float32))
        return d.numpy().astype(np.uint32 if self.dtype is DataType.UINT32 else d.numpy().dtype)


@dataclass
class Trace:
    steps: list[tuple[Callable[[], None], list[Buffer]]] = field(default_factory=list)
    inputs: list[Buffer] = field(default_factory=list)
    signature: list[tuple[Any, ...]] = field(default_factory=list)
    program_cores: list[int] = field(default_factory=list)  # per captured program
    end_serial: int = 0
    released: bool = False


@dataclass(frozen=True)
class CoreCoord:
    x: int
    y: int


class FakeDevice:
    def __init__(self, chip: ChipSpec) -> None:
        self.chip = chip

    def compute_with_storage_grid_size(self) -> CoreCoord:
        return CoreCoord(self.chip.grid_x, self.chip.grid_y)


@dataclass(frozen=True)
class FakeEvent:
    """Marks a point of the command queue: every command enqueued before it has a smaller
    stamp."""

    stamp: int


def cluster_type_of(chip: ChipSpec, num_devices: int) -> str:
    """The ClusterType name a box of ``num_devices`` ``chip``s reports (the first description
    that matches), or ``"CUSTOM"``."""
    for d in DEVICES.values():
        if d.chip == chip and d.num_chips == num_devices and d.cluster_types:
            return d.cluster_types[0]
    return "CUSTOM"


def _cluster(name: str) -> SimpleNamespace:
    """``ttnn.cluster``: ``get_cluster_type()`` returns a ClusterType-like value (``.name``)."""
    value = SimpleNamespace(name=name)
    return SimpleNamespace(get_cluster_type=lambda: value)


class VirtualTTNN:
    """The module-like fake: attribute names as in ttnn 0.81.1."""

    def __init__(
        self,
        *,
        num_devices: int = 1,
        chip: ChipSpec = P150,
        require_sdpa_program_config: bool = False,
        shape_only: bool = False,
        cluster_type: str | None = None,
    ) -> None:
        self._num_devices = num_devices
        # shape_only: tensors hold torch ``meta`` data (shape, no storage); ops check every rule
        # and produce outputs of the right shape and dtype without computing; host reads give
        # zeros. Used by the planner (``plan/planner.py``) to run real-size models.
        self.shape_only = shape_only
        self._tdev = torch.device("meta" if shape_only else "cpu")
        self.chip = chip
        # ``ttnn.cluster.get_cluster_type()``: given, or the box of ``num_devices`` such chips
        self.cluster = _cluster(cluster_type or cluster_type_of(chip, num_devices))
        self.require_sdpa_program_config = require_sdpa_program_config
        self.dram = dram.DramBudget(chip)
        self.dram_peak_per_bank = 0  # high-water mark of ``dram.used_per_bank``
        self.trace_region = dram.TraceRegion(chip, 0)
        self.sdpa_decode_plans: list[rules.SdpaDecodePlan] = []
        self.argmax_paths: list[str] = []
        self._serial = itertools.count(1)
        self._capturing: int | None = None
        self._traces: dict[int, Trace] = {}
        self._trace_ids = itertools.count(1)
        self._program_cache: set[tuple[Any, ...]] = set()
        self._buffers: set[Buffer] = set()
        self._in_flight: list[Buffer] = []  # host buffers of non-blocking reads
        self.bfloat16, self.bfloat8_b = DataType.BFLOAT16, DataType.BFLOAT8_B
        self.float32, self.uint32, self.int32 = DataType.FLOAT32, DataType.UINT32, DataType.INT32
        self.uint16 = DataType.UINT16
        self.TILE_LAYOUT, self.ROW_MAJOR_LAYOUT = Layout.TILE, Layout.ROW_MAJOR
        self.DRAM_MEMORY_CONFIG = SimpleNamespace(sharded=False)
        self.ShardStrategy = SimpleNamespace(HEIGHT="height", WIDTH="width", BLOCK="block")
        self.ShardOrientation = SimpleNamespace(ROW_MAJOR="row_major", COL_MAJOR="col_major")
        self.Tensor = self._host_tensor
        self.experimental = SimpleNamespace(
            paged_fill_cache=self._paged_fill_cache,
            paged_update_cache=self._paged_update_cache,
            nlp_create_qkv_heads=self._create_qkv_heads,
            kda=SimpleNamespace(qkv_causal_conv1d_silu=self._qkv_conv),
        )
        self.transformer = SimpleNamespace(
            chunked_scaled_dot_product_attention=self._chunked_sdpa,
            paged_scaled_dot_product_attention_decode=self._sdpa_decode,
            chunk_gated_delta_rule=self._chunk_gdr,
            fused_recurrent_gated_delta_rule=self._recurrent_gdr,
        )
        self.counts: dict[str, int] = {}

    # ---- bookkeeping -------------------------------------------------------------------------
    @property
    def capturing(self) -> bool:
        return self._capturing is not None

    def _new(self, data: torch.Tensor, dtype: DataType, layout: Layout, device: bool) -> Tensor:
        if dtype in (DataType.BFLOAT8_B, DataType.BFLOAT4_B) and layout is not Layout.TILE:
            raise ContractViolation("dtype", "Layout must be Layout::TILE for bfloat8_b")
        data = data.to(torch.int64 if dtype in INT_TYPES else torch.float32)
        if self.shape_only and not data.is_meta:
            data = torch.empty(data.shape, dtype=data.dtype, device="meta")
        buf = Buffer(data, next(self._serial), device)
        if device:
            info = rules.TensorInfo(tuple(data.shape), dtype.value, layout.value)
            with self._rules():
                self.dram.allocate(buf.serial, info)
            self.dram_peak_per_bank = max(self.dram_peak_per_bank, self.dram.used_per_bank)
            self._buffers.add(buf)
        return Tensor(self, buf, dtype, layout)

    def _release(self, buf: Buffer) -> None:
        buf.freed = True
        self._buffers.discard(buf)
        self.dram.free(buf.serial)

    @contextlib.contextmanager
    def _rules(self) -> Iterator[None]:
        """Device limits as contract violations (same rule names)."""
        try:
            yield
        except rules.DeviceLimitError as exc:
            raise ContractViolation(exc.rule, str(exc).split("] ", 1)[1]) from None

    def _no_host_io(self, what: str) -> None:
        if self.capturing:
            raise ContractViolation("host_io", f"{what} while a trace is being captured")

    def _live(self, *ts: Tensor) -> None:
        for t in ts:
            if t.buffer.freed:
                raise ContractViolation("identity", "use of a deallocated tensor")
            if not t.buffer.on_device:
                raise ContractViolation("host_io", "device op on a host tensor")

    def _op(
        self,
        name: str,
        inputs: Sequence[Tensor],
        compute: Callable[[], Any],
        write: Callable[[Any], list[Buffer]],
        cores: int | None = None,
    ) -> Any:
        """Run an op now; under capture also record it for replay (same buffers, in place).
        ``cores``: the cores its program runs on (default: one per output tile, up to the grid),
        for the trace-size estimate."""
        self._live(*inputs)
        self.counts[name] = self.counts.get(name, 0) + 1
        sig = (name, tuple((t.shape, t.dtype, t.layout) for t in inputs))
        result = compute()
        outs = write(result)
        if self._capturing is None:
            self._program_cache.add(sig)
            return outs
        if sig not in self._program_cache:
            raise ContractViolation("program_cache", f"{name} captured before any compile run")
        trace = self._traces[self._capturing]
        if cores is None:
            tiles = max((_tiles(b.data.shape) for b in outs), default=1)
            cores = rules.op_cores(self.chip, tiles)
        trace.program_cores.append(cores)
        in_bufs = [t.buffer for t in inputs]
        trace.inputs.extend(b for b in in_bufs if b.serial < trace.end_serial)
        trace.signature.append(sig)
        targets = [b for b in outs] if isinstance(outs, list) else []

        def replay() -> None:
            for buf, new in zip(targets, _flat(compute()), strict=True):
                buf.data = new.detach().to(buf.data.dtype, copy=True)  # as _new stores it

        trace.steps.append((replay, in_bufs))
        _detach_closure(compute)
        return outs

    def _out(self, result: torch.Tensor, dtype: DataType, layout: Layout) -> Tensor:
        return self._new(result, dtype, layout, True)

    def _single(
        self,
        name: str,
        inputs: Sequence[Tensor],
        fn: Callable[[], torch.Tensor],
        dtype: DataType,
        layout: Layout = Layout.TILE,
        cores: int | None = None,
    ) -> Tensor:
        holder: list[Tensor] = []

        def write(res: torch.Tensor) -> list[Buffer]:
            t = self._out(res, dtype, layout)
            holder.append(t)
            return [t.buffer]

        self._op(name, inputs, fn, write, cores)
        return holder[0]

    def _inplace(
        self,
        name: str,
        inputs: Sequence[Tensor],
        target: Tensor,
        fn: Callable[[], torch.Tensor],
        cores: int | None = None,
    ) -> Tensor:
        def write(res: torch.Tensor) -> list[Buffer]:
            target.buffer.data = res.detach().clone()
            return [target.buffer]

        if self.shape_only:  # the target keeps its shape; nothing to compute
            buf = target.buffer

            def fn() -> torch.Tensor:
                return buf.data

        self._op(name, [*inputs, target], fn, write, cores)
        return target

    # ---- device and traces -------------------------------------------------------------------
    def GetNumAvailableDevices(self) -> int:
        return self._num_devices

    def get_arch_name(self) -> str:
        return self.chip.arch

    def open_device(
        self, *, device_id: int, trace_region_size: int, l1_small_size: int
    ) -> FakeDevice:
        if device_id >= self._num_devices:
            raise RuntimeError("No chips detected in the cluster")
        self.dram.trace_region_size = trace_region_size
        self.trace_region = dram.TraceRegion(self.chip, trace_region_size)
        return FakeDevice(self.chip)

    def close_device(self, device: FakeDevice) -> None:
        pass

    def synchronize_device(
        self, device: FakeDevice, cq_id: int | None = None, sub_device_ids: Sequence[Any] = ()
    ) -> None:
        self._no_host_io("synchronize_device")
        self._land(next(self._serial))

    def record_event(
        self,
        mesh_device: FakeDevice,
        cq_id: int | None = None,
        sub_device_ids: Sequence[Any] = (),
        device_range: Any = None,
    ) -> FakeEvent:
        self._no_host_io("record_event")
        return FakeEvent(next(self._serial))

    def event_synchronize(self, mesh_event: FakeEvent) -> None:
        self._no_host_io("event_synchronize")
        self._land(mesh_event.stamp)

    def _land(self, stamp: int) -> None:
        """Every non-blocking read enqueued before ``stamp`` has reached the host."""
        for buf in self._in_flight:
            if buf.pending < stamp:
                buf.pending = 0
        self._in_flight = [b for b in self._in_flight if b.pending]

    def begin_trace_capture(self, device: FakeDevice, *, cq_id: int = 0) -> int:
        if self.capturing:
            raise ContractViolation("host_io", "nested trace capture")
        tid = next(self._trace_ids)
        self._traces[tid] = Trace(end_serial=next(self._serial))
        self._capturing = tid
        return tid

    def end_trace_capture(self, device: FakeDevice, trace_id: int, *, cq_id: int = 0) -> None:
        trace = self._traces[trace_id]
        self._capturing = None
        trace.end_serial = next(self._serial)
        for other_id, other in self._traces.items():
            if other_id != trace_id and not other.released and other.signature == trace.signature:
                trace.released = True
                raise ContractViolation(
                    "one_trace", f"trace {trace_id} repeats trace {other_id}: one trace per bucket"
                )
        try:
            with self._rules():
                size = self.trace_region.end_capture(trace_id, trace.program_cores)
                if self.trace_region.size == 0:  # the trace buffer is an ordinary DRAM buffer
                    pages = size // dram.TRACE_PAGE_BYTES
                    label = f"trace {trace_id}"
                    self.dram.allocate_pages(-trace_id, pages, dram.TRACE_PAGE_BYTES, label)
        except ContractViolation:
            trace.released = True
            self.trace_region.release(trace_id)
            raise

    def execute_trace(
        self, device: FakeDevice, trace_id: int, *, cq_id: int = 0, blocking: bool = True
    ) -> None:
        trace = self.check_replay(trace_id)
        if self.shape_only:  # outputs keep their shapes; nothing to recompute
            return
        for replay, _ in trace.steps:
            replay()

    def check_replay(self, trace_id: int) -> Trace:
        """The rules a replay of ``trace_id`` must pass (a mesh checks them on every chip, then
        replays the steps its chips recorded together once)."""
        self._no_host_io("execute_trace")
        trace = self._traces[trace_id]
        if trace.released:
            raise ContractViolation("identity", f"trace {trace_id} was released")
        for buf in trace.inputs:
            if buf.freed:
                raise ContractViolation("identity", "a trace input was deallocated or rebound")
        late = [b for b in self._buffers if b.serial > trace.end_serial]
        if late:
            raise ContractViolation(
                "alloc", f"{len(late)} device buffer(s) allocated after capture are alive at replay"
            )
        return trace

    def release_trace(self, device: FakeDevice, trace_id: int) -> None:
        self._traces[trace_id].released = True
        self.trace_region.release(trace_id)
        self.dram.free(-trace_id)

    # ---- host <-> device --------------------------------------------------------------------
    def _host_tensor(
        self, array: Any, data_type: DataType | None = None, layout: Layout | None = None
    ) -> Tensor:
        arr = np.asarray(array)
        dtype = data_type or DataType.FLOAT32
        if self.shape_only:
            return self._new(
                torch.empty(arr.shape, device="meta"), dtype, layout or Layout.ROW_MAJOR, False
            )
        return self._new(
            torch.from_numpy(arr.astype(np.int64 if dtype in INT_TYPES else np.float32)),
            dtype,
            layout or Layout.ROW_MAJOR,
            False,
        )

    def to_device(self, tensor: Tensor, device: FakeDevice, memory_config: Any = None) -> Tensor:
        self._no_host_io("to_device")
        _landed(tensor, "to_device()")
        return self._new(tensor.buffer.data.clone(), tensor.dtype, tensor.layout, True)

    def from_device(
        self, tensor: Tensor, blocking: bool = True, *, queue_id: int | None = None
    ) -> Tensor:
        self._no_host_io("from_device")
        self._live(tensor)
        # The value is copied now: the in-order device reads the buffer as of this point.
        host = self._new(tensor.buffer.data.clone(), tensor.dtype, tensor.layout, False)
        if not blocking:
            host.buffer.pending = next(self._serial)
            self._in_flight.append(host.buffer)
        return host

    def copy_host_to_device_tensor(self, host: Tensor, device_tensor: Tensor) -> None:
        self._no_host_io("copy_host_to_device_tensor")
        self._live(device_tensor)
        _landed(host, "copy_host_to_device_tensor()")
        _same("copy_host_to_device_tensor", host, device_tensor)
        device_tensor.buffer.data = host.buffer.data.clone()

    def zeros(
        self,
        shape: Sequence[int],
        dtype: DataType | None = None,
        layout: Layout | None = None,
        device: FakeDevice | None = None,
        memory_config: Any = None,
    ) -> Tensor:
        if device is not None:
            self._no_host_io("zeros(device=...) upload")
        dt = dtype or DataType.BFLOAT16
        return self._new(
            torch.zeros(list(shape), device=self._tdev),
            dt,
            layout or Layout.ROW_MAJOR,
            device is not None,
        )

    def Shape(self, dims: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(d) for d in dims)

    def allocate_tensor_on_device(
        self,
        shape: Sequence[int],
        dtype: DataType,
        layout: Layout,
        device: FakeDevice,
        memory_config: Any = None,
    ) -> Tensor:
        """A device tensor allocated without host data or a fill (ttnn leaves its contents
        undefined; here they are zeros, or nothing in shape-only mode)."""
        return self._new(torch.zeros(list(shape), device=self._tdev), dtype, layout, True)

    def deallocate(self, tensor: Tensor, force: bool = False) -> None:
        self._release(tensor.buffer)

    def dump_tensor(self, file_name: str, tensor: Tensor) -> None:
        Path(file_name).write_bytes(pickle.dumps(tensor_payload(tensor)))

    def load_tensor(self, file_name: str, *, device: FakeDevice | None = None) -> Tensor:
        payload = pickle.loads(Path(file_name).read_bytes())
        if isinstance(payload, dict):
            raise ContractViolation(
                "mesh.distribution",
                f"{file_name} holds a tensor distributed over a {payload['mesh']} mesh; "
                "load it onto that mesh",
            )
        return self.from_payload(payload, device=device is not None)

    def from_payload(self, payload: tuple[Any, ...], *, device: bool) -> Tensor:
        """The tensor a ``dump_tensor`` payload describes, on this chip's DRAM when ``device``."""
        if device:
            self._no_host_io("load_tensor(device=...)")
        data, dtype, layout = payload
        return self._new(torch.from_numpy(data), DataType(dtype), Layout(layout), device)

    # ---- configs --------------------------------------------------------------------------
    def SDPAProgramConfig(
        self,
        *,
        compute_with_storage_grid_size: Any,
        q_chunk_size: int,
        k_chunk_size: int,
        exp_approx_mode: bool | None = None,
        max_cores_per_head_batch: int = 16,
    ) -> rules.SdpaConfig:
        grid = compute_with_storage_grid_size
        return rules.SdpaConfig(
            (grid.x, grid.y), q_chunk_size, k_chunk_size, exp_approx_mode, max_cores_per_head_batch
        )

    def QkvCausalConv1dSiluProgramConfig(self, *, channel_chunk_size: int) -> Any:
        return SimpleNamespace(channel_chunk_size=channel_chunk_size)

    def num_cores_to_corerangeset(self, n: int, grid: Any, row_wise: bool) -> Any:
        with self._rules():
            rules.num_cores_to_corerangeset(self.chip, n)
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
            shard=rules.Shard(core_grid.num_cores, tuple(shape), strategy, orientation),
        )

    def interleaved_to_sharded(self, x: Tensor, config: Any) -> Tensor:
        if x.shape[1] > config.shard.num_cores:
            raise ContractViolation("dtype", "more users than cores in the height-sharded config")
        out = self._single("interleaved_to_sharded", [x], lambda: x.buffer.data, x.dtype, x.layout)
        out.buffer.shard = config.shard  # lives in L1, not in the DRAM banks
        self.dram.free(out.buffer.serial)
        return out

    # ---- data movement ------------------------------------------------------------------------
    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        if int(np.prod(list(shape))) != x.buffer.data.numel():
            raise ContractViolation("dtype", f"reshape {x.shape} -> {list(shape)}")
        return self._single(
            "reshape", [x], lambda: x.buffer.data.reshape(list(shape)), x.dtype, x.layout
        )

    def permute(self, x: Tensor, dims: Sequence[int]) -> Tensor:
        with self._rules():
            rules.permute(x.info(), dims)
        return self._single(
            "permute", [x], lambda: x.buffer.data.permute(*dims).contiguous(), x.dtype, x.layout
        )

    def slice(self, x: Tensor, start: Sequence[int], end: Sequence[int]) -> Tensor:
        idx = tuple(slice(a, b) for a, b in zip(start, end, strict=True))
        return self._single("slice", [x], lambda: x.buffer.data[idx].clone(), x.dtype, x.layout)

    def _create_qkv_heads(
        self,
        input: Tensor,
        input_kv: Tensor | None = None,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        transpose_k_heads: bool = True,
        kv_tied: bool = False,
        memory_config: Any = None,
        output_tensors: Any = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        if input_kv is not None or kv_tied or output_tensors is not None:
            raise ContractViolation(
                "not_modelled", "nlp_create_qkv_heads: only the fused, untied form is modelled"
            )
        nkv = num_heads if num_kv_heads is None else num_kv_heads
        with self._rules():
            qs, _, _ = rules.nlp_create_qkv_heads(input.info(), num_heads, nkv, transpose_k_heads)
        hd = qs[-1]

        def split() -> tuple[torch.Tensor, ...]:
            d = input.buffer.data
            b, _, n, _ = d.shape
            cuts = (0, num_heads * hd, (num_heads + nkv) * hd, (num_heads + 2 * nkv) * hd)
            heads = (num_heads, nkv, nkv)
            parts = [
                d[..., a:e].reshape(b, n, h, hd).permute(0, 2, 1, 3)
                for (a, e), h in zip(itertools.pairwise(cuts), heads, strict=True)
            ]
            if transpose_k_heads:
                parts[1] = parts[1].transpose(-1, -2)
            return tuple(t.contiguous() for t in parts)

        holder: list[Tensor] = []

        def write(res: tuple[torch.Tensor, ...]) -> list[Buffer]:
            holder.extend(self._out(r, input.dtype, Layout.TILE) for r in res)
            return [t.buffer for t in holder]

        self._op("nlp_create_qkv_heads", [input], split, write)
        return holder[0], holder[1], holder[2]

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
            _landed(x, "to_layout()")
            return self._new(x.buffer.data.clone(), x.dtype, layout, False)
        return self._single("to_layout", [x], lambda: x.buffer.data, x.dtype, layout)

    def typecast(self, x: Tensor, dtype: DataType) -> Tensor:
        return self._single("typecast", [x], lambda: x.buffer.data, dtype, x.layout)

    def copy(self, a: Tensor, b: Tensor) -> Tensor:
        _same("copy", a, b)
        return self._inplace("copy", [a], b, lambda: a.buffer.data)

    def fill_cache(self, cache: Tensor, x: Tensor, batch_idx: int) -> Tensor:
        if cache.dtype != x.dtype or list(cache.shape)[1:] != list(x.shape)[1:] or x.shape[0] != 1:
            raise ContractViolation(
                "dtype", f"fill_cache {x.shape}/{x.dtype} into {cache.shape}/{cache.dtype}"
            )
        with self._rules():
            rules.fill_cache(cache.info(), x.info(), batch_idx)

        def fn() -> torch.Tensor:
            new = cache.buffer.data.clone()
            new[batch_idx] = x.buffer.data[0]
            return new

        return self._inplace("fill_cache", [x], cache, fn)

    # ---- math ---------------------------------------------------------------------------------
    def embedding(self, ids: Tensor, weight: Tensor, *, layout: Layout | None = None) -> Tensor:
        if ids.dtype is not DataType.UINT32 or ids.layout is not Layout.ROW_MAJOR:
            raise ContractViolation(
                "dtype", f"embedding ids must be UINT32 ROW_MAJOR, got {ids.dtype}"
            )
        return self._single(
            "embedding",
            [ids, weight],
            lambda: F.embedding(ids.buffer.data, weight.buffer.data),
            weight.dtype,
            layout or Layout.ROW_MAJOR,
        )

    def linear(self, a: Tensor, b: Tensor, *, compute_kernel_config: Any = None) -> Tensor:
        return self.matmul(a, b, compute_kernel_config=compute_kernel_config)

    def matmul(
        self,
        a: Tensor,
        b: Tensor,
        *,
        compute_kernel_config: Any = None,
        dtype: DataType | None = None,
    ) -> Tensor:
        """Batch dims as ``rules.matmul`` allows (B broadcast when its batch is 1, else equal);
        the output dtype is ``dtype`` or, as in ttnn, A's."""
        self._compute_kernel_config("matmul", compute_kernel_config)
        with self._rules():
            rules.matmul(a.info(), b.info())
        return self._single(
            "matmul", [a, b], lambda: a.buffer.data @ b.buffer.data, dtype or a.dtype
        )

    def rms_norm(self, x: Tensor, *, epsilon: float, weight: Tensor) -> Tensor:
        def fn() -> torch.Tensor:
            d = x.buffer.data
            return (
                d
                * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + epsilon)
                * weight.buffer.data.reshape(-1)
            )

        return self._single("rms_norm", [x, weight], fn, x.dtype)

    def _binary(self, name: str, a: Any, b: Any, f: Callable[[Any, Any], torch.Tensor]) -> Tensor:
        """An eltwise binary op (binary_ng): TILE operands broadcast as ``rules.binary``
        allows; comparisons give 0/1 in the first tensor's dtype."""
        ts = [t for t in (a, b) if isinstance(t, Tensor)]
        for t in ts:
            if t.layout is not Layout.TILE:
                raise ContractViolation("tile", f"{name} on a ROW_MAJOR tensor")
        if len(ts) == 2:
            with self._rules():
                rules.binary(ts[0].shape, ts[1].shape)

        def val(v: Any) -> Any:
            return v.buffer.data if isinstance(v, (Tensor, Ref)) else v

        return self._single(name, ts, lambda: f(val(a), val(b)), ts[0].dtype)

    def add(self, a: Any, b: Any) -> Tensor:
        return self._binary("add", a, b, lambda x, y: x + y)

    def sub(self, a: Any, b: Any) -> Tensor:
        return self._binary("sub", a, b, lambda x, y: x - y)

    def mul(self, a: Any, b: Any) -> Tensor:
        return self._binary("mul", a, b, lambda x, y: x * y)

    def ge(self, a: Any, b: Any) -> Tensor:
        return self._binary("ge", a, b, lambda x, y: (x >= y).float())

    def gt(self, a: Any, b: Any) -> Tensor:
        return self._binary("gt", a, b, lambda x, y: (x > y).float())

    def le(self, a: Any, b: Any) -> Tensor:
        return self._binary("le", a, b, lambda x, y: (x <= y).float())

    def lt(self, a: Any, b: Any) -> Tensor:
        return self._binary("lt", a, b, lambda x, y: (x < y).float())

    def eq(self, a: Any, b: Any) -> Tensor:
        return self._binary("eq", a, b, lambda x, y: (x == y).float())

    def _unary(self, name: str, x: Tensor, f: Callable[[torch.Tensor], torch.Tensor]) -> Tensor:
        return self._single(name, [x], lambda: f(x.buffer.data), x.dtype)

    def sigmoid(self, x: Tensor) -> Tensor:
        return self._unary("sigmoid", x, torch.sigmoid)

    def silu(self, x: Tensor) -> Tensor:
        return self._unary("silu", x, F.silu)

    def softplus(self, x: Tensor, *, beta: float, threshold: float) -> Tensor:
        return self._unary("softplus", x, lambda d: F.softplus(d, beta=beta, threshold=threshold))

    def exp(self, x: Tensor) -> Tensor:
        return self._unary("exp", x, torch.exp)

    def log(self, x: Tensor) -> Tensor:
        return self._unary("log", x, torch.log)

    def rsqrt(self, x: Tensor) -> Tensor:
        return self._unary("rsqrt", x, torch.rsqrt)

    def reciprocal(self, x: Tensor) -> Tensor:
        return self._unary("reciprocal", x, torch.reciprocal)

    def sum(self, x: Tensor, dim: int, keepdim: bool = False) -> Tensor:
        return self._unary("sum", x, lambda d: d.sum(dim, keepdim=keepdim))

    def softmax(self, x: Tensor, dim: int = -1, *, numeric_stable: bool = True) -> Tensor:
        return self._unary("softmax", x, lambda d: torch.softmax(d, dim))

    def topk(
        self,
        x: Tensor,
        k: int,
        dim: int = -1,
        largest: bool = True,
        sorted: bool = True,
        *,
        indices_tensor: Tensor | None = None,
        stable: bool = False,
    ) -> list[Tensor]:
        """Values (x's dtype) and indices (``rules.topk``'s dtype; the labels of
        ``indices_tensor`` when given), both TILE, sorted. Ties: ``stable`` puts the lowest index
        first (as the 0.81.1 docstring says); otherwise the virtual device orders them highest index
        first, a legal outcome of an unstable sort that differs from the stable one, so code
        that needs an order among ties must ask for it."""
        if not largest or not sorted:
            raise ContractViolation("not_modelled", "topk: only largest=True, sorted=True")
        labels = indices_tensor.info() if indices_tensor is not None else None
        with self._rules():
            kind = rules.topk(
                x.info(), k, dim, indices=labels, stable=stable, l1_bytes=self.chip.l1_bytes
            )
        shape = (*list(x.shape)[:-1], k)

        def pick() -> tuple[torch.Tensor, torch.Tensor]:
            d = x.buffer.data
            if d.is_meta:
                return torch.empty(shape, device="meta"), torch.empty(shape, device="meta")
            width = d.shape[-1]
            src = d if stable else d.flip(-1)
            order = torch.sort(src, dim=-1, descending=True, stable=True).indices[..., :k]
            pos = order if stable else width - 1 - order
            idx = pos if indices_tensor is None else indices_tensor.buffer.data.gather(-1, pos)
            return d.gather(-1, pos), idx

        outs: list[Tensor] = []

        def write(res: tuple[torch.Tensor, torch.Tensor]) -> list[Buffer]:
            outs.append(self._out(res[0], x.dtype, Layout.TILE))
            outs.append(self._out(res[1], DataType(kind), Layout.TILE))
            return [o.buffer for o in outs]

        ins = [x] + ([indices_tensor] if indices_tensor is not None else [])
        self._op("topk", ins, pick, write)
        return outs

    def argmax(self, x: Tensor, dim: int | None = None) -> Tensor:
        if x.dtype not in (DataType.BFLOAT16, DataType.FLOAT32):
            raise ContractViolation("dtype", f"argmax input must be bf16/fp32, got {x.dtype}")
        if dim is None and x.layout is not Layout.ROW_MAJOR:
            raise ContractViolation("dtype", "argmax over all dims needs ROW_MAJOR")
        with self._rules():
            self.argmax_paths.append(rules.argmax(x.info(), dim))
        return self._single(
            "argmax", [x], lambda: x.buffer.data.argmax(dim=-1), DataType.UINT32, Layout.ROW_MAJOR
        )

    # ---- paged attention ------------------------------------------------------------------------
    def _check_cache(self, cache: Tensor, table: Tensor) -> None:
        if cache.layout is not Layout.TILE or cache.shape[2] % 32 or cache.shape[3] % 32:
            raise ContractViolation(
                "tile", f"paged cache {cache.shape} must be TILE with 32-aligned block/head"
            )
        if table.dtype is not DataType.INT32 or table.layout is not Layout.ROW_MAJOR:
            raise ContractViolation("dtype", "page tables must be INT32 ROW_MAJOR")

    def _paged_fill_cache(
        self, cache: Tensor, x: Tensor, page_table: Tensor, *, batch_idx: int = 0
    ) -> Tensor:
        self._check_cache(cache, page_table)
        if x.dtype != cache.dtype:
            raise ContractViolation(
                "dtype", f"paged_fill_cache input {x.dtype} != cache {cache.dtype}"
            )
        if x.shape[2] % 32:
            raise ContractViolation("tile", f"paged_fill_cache of {x.shape[2]} tokens")
        with self._rules():
            rules.paged_fill_cache(cache.info(), x.info(), page_table.info(), batch_idx)

        def fn() -> torch.Tensor:
            new, bs = cache.buffer.data.clone(), cache.shape[2]
            t = x.shape[2]
            pos = torch.arange(t)
            blocks = page_table.buffer.data[batch_idx, pos // bs]
            new[blocks, :, pos % bs] = x.buffer.data[0].permute(1, 0, 2)
            return new

        return self._inplace("paged_fill_cache", [x, page_table], cache, fn)

    def _paged_update_cache(
        self,
        cache: Tensor,
        x: Tensor,
        *,
        update_idxs: Sequence[int] = (),
        update_idxs_tensor: Tensor | None = None,
        page_table: Tensor | None = None,
    ) -> Tensor:
        if update_idxs_tensor is None:
            if self.capturing:
                raise ContractViolation(
                    "runtime_args", "paged_update_cache positions as a list under trace"
                )
            raise ContractViolation("runtime_args", "pass positions as update_idxs_tensor")
        assert page_table is not None
        self._check_cache(cache, page_table)
        if not x.buffer.sharded:
            raise ContractViolation("dtype", "paged_update_cache input must be height-sharded")
        if update_idxs_tensor.dtype is not DataType.INT32:
            raise ContractViolation("dtype", "update_idxs_tensor must be INT32")
        with self._rules():
            rules.paged_update_cache(
                self.chip, cache.info(), x.info(), update_idxs_tensor.info(), page_table.info()
            )

        def fn() -> torch.Tensor:
            new, bs = cache.buffer.data.clone(), cache.shape[2]
            for b, p in enumerate(update_idxs_tensor.buffer.data.tolist()):
                if p >= 0:
                    new[page_table.buffer.data[b, p // bs], :, p % bs] = x.buffer.data[0, b]
            return new

        return self._inplace(
            "paged_update_cache", [x, update_idxs_tensor, page_table], cache, fn, x.shape[1]
        )

    @staticmethod
    def _attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor:
        scores = (q @ k.transpose(-1, -2)) * scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return probs @ v

    @staticmethod
    def _gather(cache: torch.Tensor, row: torch.Tensor, length: int) -> torch.Tensor:
        g = cache[row]  # [W, kvh, bs, hd]
        return g.permute(1, 0, 2, 3).reshape(cache.shape[1], -1, cache.shape[3])[:, :length]

    def _chunked_sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        page_table: Tensor,
        chunk_start_idx: int | None = None,
        *,
        chunk_start_idx_tensor: Tensor | None = None,
        scale: float | None = None,
        program_config: Any = None,
        compute_kernel_config: Any = None,
    ) -> Tensor:
        self._compute_kernel_config("chunked_sdpa", compute_kernel_config)
        if chunk_start_idx_tensor is None:
            if self.capturing:
                raise ContractViolation("runtime_args", "chunk start as a Python int under trace")
        elif chunk_start_idx_tensor.dtype is not DataType.INT32:
            raise ContractViolation("dtype", "chunk_start_idx_tensor must be INT32")
        self._check_cache(k, page_table)
        t, hd = q.shape[2], q.shape[3]
        if t % 32:
            raise ContractViolation("tile", f"chunked SDPA chunk of {t} tokens")
        start_info = chunk_start_idx_tensor.info() if chunk_start_idx_tensor is not None else None
        with self._rules():
            rules.chunked_sdpa(
                q.info(), k.info(), v.info(), page_table.info(), start_info, program_config
            )
        qc = program_config.q_chunk_size if program_config is not None else 32
        kc = program_config.k_chunk_size if program_config is not None else 32
        sc = scale if scale is not None else hd**-0.5

        def fn() -> torch.Tensor:
            if q.buffer.data.is_meta:
                return torch.empty(q.shape, device="meta")
            start = (
                int(chunk_start_idx_tensor.buffer.data.reshape(-1)[0])
                if chunk_start_idx_tensor is not None
                else int(chunk_start_idx or 0)
            )
            with self._rules():
                rules.chunked_sdpa_start(start, qc, kc)
            end = start + t
            row = page_table.buffer.data[0]
            keys = self._gather(k.buffer.data, row, end)
            vals = self._gather(v.buffer.data, row, end)
            rep = q.shape[1] // keys.shape[0]
            keys, vals = keys.repeat_interleave(rep, 0), vals.repeat_interleave(rep, 0)
            mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
            return self._attend(q.buffer.data[0], keys, vals, mask, sc)[None]

        ins = [q, k, v, page_table] + (
            [chunk_start_idx_tensor] if chunk_start_idx_tensor is not None else []
        )
        return self._single("chunked_sdpa", ins, fn, q.dtype)

    def _sdpa_decode(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        page_table: Tensor,
        *,
        cur_pos_tensor: Tensor | None = None,
        scale: float | None = None,
        program_config: rules.SdpaConfig | None = None,
        compute_kernel_config: Any = None,
    ) -> Tensor:
        self._compute_kernel_config("sdpa_decode", compute_kernel_config)
        if cur_pos_tensor is None or cur_pos_tensor.dtype is not DataType.INT32:
            raise ContractViolation(
                "runtime_args", "decode positions must be an INT32 cur_pos_tensor"
            )
        self._check_cache(k, page_table)
        with self._rules():
            plan = rules.paged_sdpa_decode(
                self.chip,
                q.info(),
                k.info(),
                v.info(),
                page_table.info(),
                cur_pos_tensor.info(),
                program_config,
                require_program_config=self.require_sdpa_program_config,
            )
        self.sdpa_decode_plans.append(plan)
        active = plan.cores_per_head * k.shape[1] * plan.batch // plan.heads_per_core
        b, nh, hd = q.shape[1], q.shape[2], q.shape[3]
        sc = scale if scale is not None else hd**-0.5

        def fn() -> torch.Tensor:
            out = torch.zeros(1, b, -(-nh // 32) * 32, hd, device=q.buffer.data.device)
            if out.is_meta:
                return out
            for i, p in enumerate(cur_pos_tensor.buffer.data.tolist()):
                if p < 0:
                    continue
                row = page_table.buffer.data[i]
                keys = self._gather(k.buffer.data, row, p + 1)
                vals = self._gather(v.buffer.data, row, p + 1)
                rep = nh // keys.shape[0]
                qi = q.buffer.data[0, i].reshape(keys.shape[0], rep, hd)
                mask = torch.ones(rep, p + 1, dtype=torch.bool)
                out[0, i, :nh] = self._attend(qi, keys, vals, mask, sc).reshape(nh, hd)
            return out

        ins = [q, k, v, page_table, cur_pos_tensor]
        return self._single(
            "sdpa_decode", ins, fn, q.dtype, cores=min(active, plan.cores_available)
        )

    # ---- Gated DeltaNet ---------------------------------------------------------------------------
    def _qkv_conv(
        self,
        x: Tensor,
        history: Tensor,
        tap0: Tensor,
        tap1: Tensor,
        tap2: Tensor,
        tap3: Tensor,
        q_width: int,
        k_width: int,
        v_width: int,
        *,
        program_config: Any,
        actual_start: Tensor,
        predecessor_carry: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        taps = [tap0, tap1, tap2, tap3]
        c = q_width + k_width + v_width
        if history.layout is not Layout.ROW_MAJOR or history.dtype is not DataType.BFLOAT16:
            raise ContractViolation("dtype", "conv history must be ROW_MAJOR BFLOAT16")
        if x.dtype is not DataType.BFLOAT16 or any(
            t.layout is not Layout.TILE or t.dtype is not DataType.BFLOAT16 for t in taps
        ):
            raise ContractViolation("dtype", "conv input and taps must be BFLOAT16 (taps TILE)")
        if actual_start.dtype is not DataType.UINT32:
            raise ContractViolation("dtype", "actual_start must be UINT32")
        if x.shape[1] % 32 or any(w % 32 for w in (q_width, k_width, v_width)) or x.shape[2] != c:
            raise ContractViolation(
                "tile", f"conv T={x.shape[1]} widths={q_width, k_width, v_width}"
            )
        if c % program_config.channel_chunk_size:
            raise ContractViolation("tile", "channel_chunk_size must divide the channels")

        def fn() -> tuple[torch.Tensor, ...]:
            if x.buffer.data.is_meta:
                t = x.shape[1]
                return tuple(
                    torch.empty(1, t, w, device="meta") for w in (q_width, k_width, v_width)
                )
            if int(actual_start.buffer.data.reshape(-1)[0]) % 32:
                raise ContractViolation("tile", "actual_start must be 32-aligned")
            full = torch.cat([history.buffer.data[0], x.buffer.data[0]], 0).T  # [C, 3+T]
            w = torch.stack([t.buffer.data.reshape(-1) for t in taps], 1)[:, None, :]
            out = F.silu(F.conv1d(full[None], w, groups=c)[0]).T[None]  # [1, T, C]
            return tuple(torch.split(out, [q_width, k_width, v_width], -1))

        outs: list[Tensor] = []

        def write(res: tuple[torch.Tensor, ...]) -> list[Buffer]:
            outs.extend(self._out(r, DataType.BFLOAT16, Layout.TILE) for r in res)
            return [o.buffer for o in outs]

        self._op("qkv_causal_conv1d_silu", [x, history, *taps, actual_start], fn, write)
        return outs[0], outs[1], outs[2]

    def _gdr_out(
        self,
        name: str,
        ins: list[Tensor],
        fn: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        o_layout: Layout,
        cores: int,
    ) -> tuple[Tensor, Tensor]:
        outs: list[Tensor] = []

        def write(res: tuple[torch.Tensor, torch.Tensor]) -> list[Buffer]:
            outs.append(self._out(res[0], DataType.FLOAT32, o_layout))
            outs.append(self._out(res[1], DataType.FLOAT32, Layout.TILE))
            return [o.buffer for o in outs]

        self._op(name, ins, fn, write, cores)
        return outs[0], outs[1]

    def _chunk_gdr(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        *,
        scale: float | None = None,
        initial_state: Tensor | None = None,
        output_final_state: bool = False,
        chunk_size: int = 64,
        eye: Tensor | None = None,
        tril: Tensor | None = None,
        ones: Tensor | None = None,
        masks: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        consts = [eye, tril, ones, masks]
        if self.capturing and any(c is None for c in consts):
            raise ContractViolation(
                "runtime_args", "chunk_gated_delta_rule under trace needs eye/tril/ones/masks"
            )
        if any(t.layout is not Layout.TILE for t in (q, k, v, g, beta)):
            raise ContractViolation("tile", "chunk_gated_delta_rule inputs must be TILE")
        if initial_state is None or initial_state.dtype is not DataType.FLOAT32:
            raise ContractViolation("dtype", "initial_state must be FLOAT32")
        b, t = q.shape[0], q.shape[1]
        hv, dv = initial_state.shape[1], initial_state.shape[3]
        if len(q.shape) == 3 and (chunk_size != 32 or t % 32 or initial_state.shape[2] != dv):
            raise ContractViolation(
                "tile", "flat chunk_gated_delta_rule needs chunk 32, T%32==0, K==V"
            )
        with self._rules():
            rules.chunk_gated_delta_rule(
                self.chip,
                [q.info(), k.info(), v.info()],
                g.info(),
                beta.info(),
                initial_state.info(),
                chunk_size,
                [c.info() for c in consts if c is not None],
            )

        def fn() -> tuple[torch.Tensor, torch.Tensor]:
            dk = initial_state.shape[2]
            qd = q.buffer.data.reshape(b, t, -1, dk)
            kd = k.buffer.data.reshape(b, t, -1, dk)
            rep = hv // qd.shape[2]
            sc = scale if scale is not None else dk**-0.5
            outs, finals = [], []
            for i in range(b):
                qi = l2norm(qd[i]).repeat_interleave(rep, 1) * sc
                ki = l2norm(kd[i]).repeat_interleave(rep, 1)
                vi = v.buffer.data[i].reshape(t, hv, dv)
                o, s = chunk_gated_delta(
                    qi,
                    ki,
                    vi,
                    g.buffer.data[i],
                    beta.buffer.data[i],
                    initial_state.buffer.data[i],
                    chunk=chunk_size,
                )
                outs.append(o)
                finals.append(s)
            return torch.stack(outs), torch.stack(finals)

        ins = [q, k, v, g, beta, initial_state] + [c for c in consts if c is not None]
        return self._gdr_out("chunk_gated_delta_rule", ins, fn, Layout.ROW_MAJOR, b * hv)

    def _recurrent_gdr(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        *,
        scale: float | None = None,
        initial_state: Tensor | None = None,
        output_final_state: bool = False,
    ) -> tuple[Tensor, Tensor]:
        if initial_state is None or initial_state.dtype is not DataType.FLOAT32:
            raise ContractViolation("dtype", "initial_state must be FLOAT32")
        if q.shape[1] != 1:
            raise ContractViolation("dtype", "decode runs one token per row")
        with self._rules():
            rules.fused_recurrent_gated_delta_rule(
                self.chip, q.info(), v.info(), initial_state.info()
            )

        def fn() -> tuple[torch.Tensor, torch.Tensor]:
            hv, dk = v.shape[2], q.shape[3]
            rep = hv // q.shape[2]
            qd = q.buffer.data[:, 0].repeat_interleave(rep, 1) * (
                scale if scale is not None else dk**-0.5
            )
            kd = k.buffer.data[:, 0].repeat_interleave(rep, 1)
            o, s = recurrent_gated_delta_step(
                qd,
                kd,
                v.buffer.data[:, 0],
                g.buffer.data[:, 0],
                beta.buffer.data[:, 0],
                initial_state.buffer.data,
            )
            return o[:, None], s

        return self._gdr_out(
            "fused_recurrent_gated_delta_rule",
            [q, k, v, g, beta, initial_state],
            fn,
            Layout.TILE,
            q.shape[0] * v.shape[2],
        )

    # ---- ops added for the real-size fixes ----
    bfloat4_b = DataType.BFLOAT4_B
    MathFidelity = SimpleNamespace(LoFi="LoFi", HiFi2="HiFi2", HiFi3="HiFi3", HiFi4="HiFi4")

    def WormholeComputeKernelConfig(
        self,
        *,
        math_fidelity: str = "Invalid",
        math_approx_mode: bool = True,
        fp32_dest_acc_en: bool = False,
        packer_l1_acc: bool = False,
        dst_full_sync_en: bool = False,
    ) -> Any:
        """ttnn.WormholeComputeKernelConfig (also the Blackhole one in 0.81.1)."""
        if math_fidelity not in ("LoFi", "HiFi2", "HiFi3", "HiFi4"):
            raise ContractViolation("dtype", f"math_fidelity {math_fidelity!r}")
        return SimpleNamespace(
            kind="compute_kernel_config",
            math_fidelity=math_fidelity,
            math_approx_mode=math_approx_mode,
            fp32_dest_acc_en=fp32_dest_acc_en,
            packer_l1_acc=packer_l1_acc,
        )

    def _compute_kernel_config(self, op: str, config: Any) -> None:
        """Record the compute kernel config an op got (None: the op's default) in
        ``compute_configs[op]``; anything else than a WormholeComputeKernelConfig is refused."""
        if config is not None and getattr(config, "kind", None) != "compute_kernel_config":
            raise ContractViolation("dtype", f"{op}: compute_kernel_config {config!r}")
        if "compute_configs" not in self.__dict__:
            self.compute_configs: dict[str, list[Any]] = {}
        self.compute_configs.setdefault(op, []).append(config)

    def where(
        self,
        predicate: Tensor,
        true_value: Any,
        false_value: Any,
        *,
        output_tensor: Tensor | None = None,
    ) -> Tensor:
        """ttnn.where: ``predicate ? true_value : false_value`` elementwise, a select (NaN in the
        operand not taken does not leak, unlike a multiply by a 0/1 mask). Values are tensors
        or Python numbers. TILE only; shapes broadcast as ternary_op_utils.cpp
        ``get_broadcast_type`` allows: equal, outer dims only (same H and W), row (H = 1),
        column (W = 1) or scalar ((1, 1) last two dims) with equal outer dims.
        ``output_tensor``: written in place (same shape and dtype as the result), which may be
        one of the inputs (elementwise, tile by tile)."""
        tensors = [t for t in (predicate, true_value, false_value) if isinstance(t, Tensor)]
        if any(t.layout is not Layout.TILE for t in tensors):
            raise ContractViolation("tile", "where operands must be TILE")
        shapes = [tuple(t.shape) for t in tensors]
        if len({len(sh) for sh in shapes}) != 1:
            raise ContractViolation("where.broadcast", f"where of ranks {shapes}")
        out = tuple(max(d) for d in zip(*shapes, strict=True))
        hw = {sh[-2:] for sh in shapes}
        outer_same = len({sh[:-2] for sh in shapes}) == 1
        ok = all(all(d in (1, o) for d, o in zip(sh, out, strict=True)) for sh in shapes) and (
            len(hw) == 1
            or (outer_same and all(sh[-2:] in ((1, 1), out[-2:]) for sh in shapes))
            or (outer_same and len({sh[-1] for sh in shapes}) == 1)
            or (outer_same and len({sh[-2] for sh in shapes}) == 1)
        )
        if not ok:
            raise ContractViolation("where.broadcast", f"where of shapes {shapes}")
        values = [v for v in (true_value, false_value) if isinstance(v, Tensor)]
        dtype = values[0].dtype if values else predicate.dtype

        def fn() -> torch.Tensor:
            def val(v: Any) -> Any:
                return v.buffer.data if isinstance(v, (Tensor, Ref)) else float(v)

            pred = predicate.buffer.data
            if pred.is_meta:
                return torch.empty(out, device="meta")
            return torch.where(pred != 0, val(true_value), val(false_value))

        if output_tensor is not None:
            if output_tensor.shape != out or output_tensor.dtype != dtype:
                raise ContractViolation(
                    "dtype", f"where output_tensor {output_tensor.shape}/{output_tensor.dtype}"
                )
            return self._inplace("where", tensors, output_tensor, fn)
        return self._single("where", tensors, fn, dtype)

    # ---- sparse matmul (MoE experts) ---------------------------------------------------------
    CoreCoord = CoreCoord

    def MatmulMultiCoreReuseMultiCast1DProgramConfig(
        self,
        *,
        compute_with_storage_grid_size: Any,
        in0_block_w: int,
        out_subblock_h: int,
        out_subblock_w: int,
        out_block_h: int | None = None,
        out_block_w: int | None = None,
        per_core_M: int,
        per_core_N: int,
        fuse_batch: bool,
        fused_activation: Any = None,
        mcast_in0: bool,
        gather_in0: bool = False,
        hop_cores: Any = None,
        num_global_cb_receivers: int = 1,
        untilize_out: bool = False,
        allowed_worker_cores: Any = None,
        stream_in1: bool = False,
    ) -> rules.Matmul1DConfig:
        """ttnn.MatmulMultiCoreReuseMultiCast1DProgramConfig (the 0.81.1 signature); unset
        out_block_h / out_block_w are per_core_M / per_core_N, as tt-metal defaults them
        (matmul/device/config/matmul_program_config_types.hpp). Fused activations, gathered in0,
        untilized output and streamed in1 are not modelled."""
        if fused_activation is not None or gather_in0 or untilize_out or stream_in1:
            raise ContractViolation(
                "not_modelled", "1D program config: fused_activation / gather_in0 / untilize_out"
            )
        grid = compute_with_storage_grid_size
        return rules.Matmul1DConfig(
            (grid.x, grid.y),
            in0_block_w,
            out_subblock_h,
            out_subblock_w,
            per_core_M if out_block_h is None else out_block_h,
            per_core_N if out_block_w is None else out_block_w,
            per_core_M,
            per_core_N,
            fuse_batch,
            mcast_in0,
        )

    def sparse_matmul(
        self,
        input_tensor_a: Tensor,
        input_tensor_b: Tensor,
        *,
        sparsity: Tensor,
        program_config: rules.Matmul1DConfig | None = None,
        nnz: int | None = None,
        is_input_a_sparse: bool = False,
        is_input_b_sparse: bool = True,
        memory_config: Any = None,
        dtype: DataType | None = None,
        compute_kernel_config: Any = None,
        core_grid: Any = None,
        output_tile: Any = None,
        optional_output_tensor: Tensor | None = None,
        global_cb: Any = None,
        sub_device_id: Any = None,
        indices: Tensor | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        """ttnn.sparse_matmul in the scan modes (no ``indices``, op-owned expanded output), rules
        in ``rules.sparse_matmul``. Batch entry (i, e) is A's block times B's expert e where the
        sparsity entry is non-zero; the op zero-fills the entries it skips (0.81.1 docstring:
        "skipped positions are zero-filled", create_output_tensors' zeros_like, tt-metal PR
        #36714: an unfilled output gave different users different outputs in GPT-OSS), and never
        reads their operands, so garbage there does not leak. ``nnz`` must equal
        count_nonzero(sparsity) at every run, replays included (rule ``sparse_matmul.nnz``: the
        device deadlocks otherwise, #45943). Each run is recorded in ``sparse_matmul_work``
        (the plan and the entries computed; None in shape-only mode, where the values are
        unknown)."""
        unmodelled = (core_grid, output_tile, optional_output_tensor, global_cb, indices, bias)
        if any(v is not None for v in unmodelled) or sub_device_id is not None:
            raise ContractViolation(
                "not_modelled", "sparse_matmul: only the scan modes with an op-owned output"
            )
        a, b, s = input_tensor_a, input_tensor_b, sparsity
        for t in (a, b, s):
            if t.buffer.sharded:
                raise ContractViolation("sparse_matmul.memory", "inputs must be interleaved")
        self._compute_kernel_config("sparse_matmul", compute_kernel_config)
        with self._rules():
            plan = rules.sparse_matmul(
                self.chip,
                a.info(),
                b.info(),
                s.info(),
                program_config,
                nnz=nnz,
                is_input_a_sparse=is_input_a_sparse,
                is_input_b_sparse=is_input_b_sparse,
            )
        if "sparse_matmul_work" not in self.__dict__:
            self.sparse_matmul_work: list[tuple[rules.SparseMatmulPlan, int | None]] = []
        work = self.sparse_matmul_work

        def fn() -> torch.Tensor:
            ad, bd, sd = a.buffer.data, b.buffer.data, s.buffer.data
            if ad.is_meta:
                work.append((plan, None))
                return torch.empty(plan.shape, device="meta")
            active = int((sd != 0).sum())
            if nnz is not None and active != nnz:
                raise ContractViolation(
                    "sparse_matmul.nnz",
                    f"nnz={nnz} but the sparsity tensor has {active} non-zero entries: the "
                    "device deadlocks (tt-metal #45943); pass nnz=None under trace",
                )
            work.append((plan, active))
            if is_input_a_sparse and is_input_b_sparse:
                full, keep = ad @ bd, sd.reshape(1, -1, 1, 1) != 0
            elif is_input_b_sparse:  # [A, B, 1, E, M, N]
                full = ad[:, :, None, None] @ bd[None]
                keep = (sd != 0)[..., None, None]
            else:  # [A, E, M, N]
                full, keep = ad @ bd, (sd[0, 0] != 0)[..., None, None]
            return torch.where(keep, full, torch.zeros(()))

        assert program_config is not None  # rules.sparse_matmul refuses None
        cores = program_config.grid[0] * program_config.grid[1]
        return self._single("sparse_matmul", [a, b, s], fn, dtype or a.dtype, cores=cores)


def _tiles(shape: Sequence[int]) -> int:
    """32x32 tiles of a shape (the last two dims padded)."""
    s = [1, *list(shape)] if len(shape) < 2 else list(shape)
    rows, cols = -(-s[-2] // 32), -(-s[-1] // 32)
    return int(np.prod(s[:-2])) * rows * cols


def tensor_payload(t: Tensor) -> tuple[Any, ...]:
    """What ``dump_tensor`` writes for one chip's tensor: its values, dtype and layout."""
    return (t.buffer.data.numpy(), t.dtype.value, t.layout.value)


def _landed(t: Tensor, what: str) -> None:
    if t.buffer.pending:
        raise ContractViolation(
            "async_read",
            f"{what} of a non-blocking from_device result before event_synchronize of an event "
            "recorded after it",
        )


def _same(what: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape or a.dtype != b.dtype or a.layout != b.layout:
        raise ContractViolation(
            "dtype", f"{what}: {a.shape}/{a.dtype}/{a.layout} vs {b.shape}/{b.dtype}/{b.layout}"
        )


class Ref:
    """What a recorded op keeps of a tensor: its buffer, not the user's handle (a trace does
    not keep the tensors it read alive; their addresses may be reused after capture)."""

    def __init__(self, t: Tensor) -> None:
        self.buffer, self.dtype, self.layout = t.buffer, t.dtype, t.layout

    @property
    def shape(self) -> Shape:
        return Shape(self.buffer.data.shape)


def _detach_closure(fn: Callable[..., Any]) -> None:
    for cell in fn.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, Tensor):
            cell.cell_contents = Ref(value)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
            cell.cell_contents = type(value)(Ref(v) if isinstance(v, Tensor) else v for v in value)


def _flat(result: Any) -> list[torch.Tensor]:
    return list(result) if isinstance(result, tuple) else [result]
