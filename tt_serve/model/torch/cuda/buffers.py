"""Persistent input buffers of the static-shape programs (as ``tt/runtime/buffers``).

Each (phase, bucket) owns one ``FlatInputs``: a single long tensor on the device whose named
views are the program's inputs, refreshed in place from the host with one copy per replay (the
addresses never change, which is what a captured graph needs).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import torch

from tt_serve.model.torch.cuda.inputs import DecodeValues, PrefillValues


class FlatInputs:
    """Named long views of one device buffer, written from host values in a single transfer.

    On CUDA the transfer goes through one of two pinned staging buffers, so it is truly
    asynchronous (a pageable source may make the driver wait for the stream, which would stall
    the host behind the step already running: no overlap). A staging buffer is refilled only
    after the copy that last read it has completed (its event), i.e. two writes later."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], device: torch.device) -> None:
        self.shapes = shapes
        total = sum(math.prod(s) for s in shapes.values())
        self.flat = torch.zeros(total, dtype=torch.long, device=device)
        cuda = device.type == "cuda"
        self._staging = (
            [torch.empty(total, dtype=torch.long, pin_memory=True) for _ in range(2)]
            if cuda
            else []
        )
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self.views: dict[str, torch.Tensor] = {}
        off = 0
        for name, shape in shapes.items():
            size = math.prod(shape)
            self.views[name] = self.flat[off : off + size].view(shape)
            off += size

    def write(self, values: DecodeValues | PrefillValues) -> None:
        """Refresh every view from the dataclass fields of the same names (in order)."""
        host: list[int] = []
        for name, shape in self.shapes.items():
            v: list[Any] = getattr(values, name)
            flat = list(itertools.chain.from_iterable(v)) if len(shape) > 1 else v
            if len(flat) != math.prod(shape):
                raise ValueError(f"input {name}: {len(flat)} values for shape {shape}")
            host.extend(flat)
        src = torch.tensor(host, dtype=torch.long)
        if not self._staging:
            self.flat.copy_(src)
            return
        turn = self._turn
        self._turn ^= 1
        done = self._events[turn]
        if done is not None:
            done.synchronize()
        self._staging[turn].copy_(src)
        self.flat.copy_(self._staging[turn], non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.flat.device))  # the copy's stream
        self._events[turn] = event


def decode_shapes(bucket: int, width: int) -> dict[str, tuple[int, ...]]:
    names = ("ids", "fed", "positions", "slots", "lens", "kv_blocks", "kv_offsets")
    shapes: dict[str, tuple[int, ...]] = {n: (bucket,) for n in names}
    shapes["tables"] = (bucket, width)
    return shapes


def prefill_shapes(bucket: int, width: int, conv_state_len: int) -> dict[str, tuple[int, ...]]:
    fields = [f.name for f in dataclasses.fields(PrefillValues)]
    shapes: dict[str, tuple[int, ...]] = {n: (bucket,) for n in fields}
    shapes.update(table=(width,), slot=(1,), conv_idx=(conv_state_len,), last=(1,))
    return shapes
