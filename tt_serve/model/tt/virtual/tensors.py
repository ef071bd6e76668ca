"""The virtual device's values: tensors and their buffers, dtypes and layouts, traces, events,
and the ``ContractViolation`` every broken rule raises (no op semantics here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import numpy as np
import torch

from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.virtual import rules_base


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
    shard: rules_base.Shard | None = None  # L1 height-sharded (interleaved_to_sharded)
    pending: int = 0  # stamp of a non-blocking read not yet synchronized (0: readable)
    dtype: DataType | None = None  # what a replay's write is stored as (``card_formats``)

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


class Owner(Protocol):
    """The device that frees a tensor's buffer when its last handle dies."""

    def _release(self, buf: Buffer) -> None: ...


class Tensor:
    """A handle; device buffers die with their last handle (as ttnn tensors do)."""

    def __init__(self, fake: Owner, buf: Buffer, dtype: DataType, layout: Layout) -> None:
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

    def info(self) -> rules_base.TensorInfo:
        """The operand as the device rules see it."""
        buf = self.buffer
        return rules_base.TensorInfo(
            tuple(self.shape),
            self.dtype.value,
            self.layout.value,
            "l1" if buf.shard is not None else "dram",
            buf.shard,
        )

    def to_numpy(self) -> np.ndarray:
        if self.buffer.on_device:
            raise ContractViolation("host_io", "to_numpy() of a device tensor: from_device first")
        require_landed(self, "to_numpy()")
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


def tensor_payload(t: Tensor) -> tuple[Any, ...]:
    """What ``dump_tensor`` writes for one chip's tensor: its values, dtype and layout."""
    return (t.buffer.data.numpy(), t.dtype.value, t.layout.value)


def require_landed(t: Tensor, what: str) -> None:
    if t.buffer.pending:
        raise ContractViolation(
            "async_read",
            f"{what} of a non-blocking from_device result before event_synchronize of an event "
            "recorded after it",
        )


def require_same(what: str, a: Tensor, b: Tensor) -> None:
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
