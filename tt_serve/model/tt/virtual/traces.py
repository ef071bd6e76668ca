"""The device, its command queue's events and traces: open/close, ``record_event`` /
``event_synchronize`` (a non-blocking read lands), and trace capture, replay and release with
their rules (``host_io``, ``alloc``, ``identity``, ``one_trace``, ``trace.region``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tt_serve.model.tt.virtual import dram
from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.tensors import (
    ContractViolation,
    FakeDevice,
    FakeEvent,
    Trace,
)


class TraceOps(DeviceBase):
    """The device, events and traces of one virtual chip."""

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
