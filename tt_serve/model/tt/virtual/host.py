"""Host <-> device: host tensors, uploads, blocking and non-blocking reads, device allocation
without data, and tensor files (``dump_tensor`` / ``load_tensor``)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tt_serve.model.tt.virtual.base import DeviceBase
from tt_serve.model.tt.virtual.tensors import (
    INT_TYPES,
    ContractViolation,
    DataType,
    FakeDevice,
    Layout,
    Tensor,
    require_landed,
    require_same,
    tensor_payload,
)


class HostOps(DeviceBase):
    """Host tensors, uploads, reads and tensor files."""

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
        require_landed(tensor, "to_device()")
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
        require_landed(host, "copy_host_to_device_tensor()")
        require_same("copy_host_to_device_tensor", host, device_tensor)
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
