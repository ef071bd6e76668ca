"""The virtual device's bookkeeping, which every op family builds on: ``DeviceBase`` allocates
tensors (charged to the DRAM banks), runs an op now and records it for replay under capture
(``_op`` / ``_single`` / ``_inplace``), turns device limits into contract violations and records
the compute kernel configs ops get. The op families (``matmul.py``, ``attention.py``, ...) are
mixins over it; ``device.py`` composes them into ``VirtualTTNN``."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from tt_serve.model.formats import round_to
from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual import dram, rules_attention, rules_base
from tt_serve.model.tt.virtual.tensors import (
    INT_TYPES,
    Buffer,
    ContractViolation,
    CoreCoord,
    DataType,
    Layout,
    Ref,
    Tensor,
    Trace,
)


class DeviceBase:
    """State and bookkeeping of one virtual chip (see ``device.VirtualTTNN``)."""

    bfloat4_b = DataType.BFLOAT4_B
    CoreCoord = CoreCoord
    # ``hook(op name, compute) -> compute``: what ``_op`` runs instead of ``compute`` (None: it)
    compute_hook: Callable[[str, Callable[[], Any]], Callable[[], Any]] | None = None

    def __init__(
        self,
        *,
        num_devices: int = 1,
        chip: ChipSpec,
        require_sdpa_program_config: bool = False,
        shape_only: bool = False,
        card_formats: bool = False,
    ) -> None:
        self._num_devices = num_devices
        # card_formats: every stored value is rounded to its tensor's dtype as the card stores it
        # (``tt_serve/model/formats.py``: bf16, tt-metal's block floats); off, all is float32.
        self.card_formats = card_formats
        # shape_only: tensors hold torch ``meta`` data (shape, no storage); ops check every rule
        # and produce outputs of the right shape and dtype without computing; host reads give
        # zeros. Used by the planner (``plan/planner.py``) to run real-size models.
        self.shape_only = shape_only
        self._tdev = torch.device("meta" if shape_only else "cpu")
        self.chip = chip
        self.require_sdpa_program_config = require_sdpa_program_config
        self.dram = dram.DramBudget(chip)
        self.dram_peak_per_bank = 0  # high-water mark of ``dram.used_per_bank``
        self.trace_region = dram.TraceRegion(chip, 0)
        self.sdpa_decode_plans: list[rules_attention.SdpaDecodePlan] = []
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
        self.counts: dict[str, int] = {}

    @property
    def dram_peak_less_traces(self) -> int:
        """``dram_peak_per_bank`` without the trace buffers a region-less run keeps in DRAM
        (``DramBudget.peak_less_traces``): the peak of the same run with a trace region."""
        return self.dram.peak_less_traces

    @property
    def capturing(self) -> bool:
        return self._capturing is not None

    def _new(self, data: torch.Tensor, dtype: DataType, layout: Layout, device: bool) -> Tensor:
        if dtype in (DataType.BFLOAT8_B, DataType.BFLOAT4_B) and layout is not Layout.TILE:
            raise ContractViolation("dtype", "Layout must be Layout::TILE for bfloat8_b")
        data = self._stored(data.to(torch.int64 if dtype in INT_TYPES else torch.float32), dtype)
        if self.shape_only and not data.is_meta:
            data = torch.empty(data.shape, dtype=data.dtype, device="meta")
        buf = Buffer(data, next(self._serial), device, dtype=dtype)
        if device:
            info = rules_base.TensorInfo(tuple(data.shape), dtype.value, layout.value)
            with self._rules():
                self.dram.allocate(buf.serial, info)
            self.dram_peak_per_bank = max(self.dram_peak_per_bank, self.dram.used_per_bank)
            self._buffers.add(buf)
        return Tensor(self, buf, dtype, layout)

    def _stored(self, data: torch.Tensor, dtype: DataType | None) -> torch.Tensor:
        """``data`` as a buffer of ``dtype`` holds it: unchanged unless ``card_formats``."""
        if not self.card_formats or dtype is None or dtype in INT_TYPES or data.is_meta:
            return data
        return round_to(data, dtype.value)

    def _release(self, buf: Buffer) -> None:
        buf.freed = True
        self._buffers.discard(buf)
        self.dram.free(buf.serial)

    @contextlib.contextmanager
    def _rules(self) -> Iterator[None]:
        """Device limits as contract violations (same rule names)."""
        try:
            yield
        except rules_base.DeviceLimitError as exc:
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
        # The golden tier (``tt/golden/``) may stand a checked compute in for the op's own, for
        # this run and every replay of it.
        run = compute if self.compute_hook is None else self.compute_hook(name, compute)
        result = run()
        outs = write(result)
        if self._capturing is None:
            self._program_cache.add(sig)
            return outs
        if sig not in self._program_cache:
            raise ContractViolation("program_cache", f"{name} captured before any compile run")
        trace = self._traces[self._capturing]
        if cores is None:
            tiles = max((_tiles(b.data.shape) for b in outs), default=1)
            cores = rules_base.op_cores(self.chip, tiles)
        trace.program_cores.append(cores)
        in_bufs = [t.buffer for t in inputs]
        trace.inputs.extend(b for b in in_bufs if b.serial < trace.end_serial)
        trace.signature.append(sig)
        targets = [b for b in outs] if isinstance(outs, list) else []

        def replay() -> None:
            for buf, new in zip(targets, _flat(run()), strict=True):
                # as _new stores it
                buf.data = self._stored(new.detach().to(buf.data.dtype, copy=True), buf.dtype)

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
            target.buffer.data = self._stored(res.detach().clone(), target.dtype)
            return [target.buffer]

        if self.shape_only:  # the target keeps its shape; nothing to compute
            buf = target.buffer

            def fn() -> torch.Tensor:
                return buf.data

        self._op(name, [*inputs, target], fn, write, cores)
        return target

    def _compute_kernel_config(self, op: str, config: Any) -> None:
        """Record the compute kernel config an op got (None: the op's default) in
        ``compute_configs[op]``; anything else than a WormholeComputeKernelConfig is refused."""
        if config is not None and getattr(config, "kind", None) != "compute_kernel_config":
            raise ContractViolation("dtype", f"{op}: compute_kernel_config {config!r}")
        if "compute_configs" not in self.__dict__:
            self.compute_configs: dict[str, list[Any]] = {}
        self.compute_configs.setdefault(op, []).append(config)


def _tiles(shape: Sequence[int]) -> int:
    """32x32 tiles of a shape (the last two dims padded)."""
    s = [1, *list(shape)] if len(shape) < 2 else list(shape)
    rows, cols = -(-s[-2] // 32), -(-s[-1] // 32)
    return int(np.prod(s[:-2])) * rows * cols


def _detach_closure(fn: Callable[..., Any]) -> None:
    for cell in fn.__closure__ or ():
        value = cell.cell_contents
        if isinstance(value, Tensor):
            cell.cell_contents = Ref(value)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
            cell.cell_contents = type(value)(Ref(v) if isinstance(v, Tensor) else v for v in value)


def _flat(result: Any) -> list[torch.Tensor]:
    return list(result) if isinstance(result, tuple) else [result]
