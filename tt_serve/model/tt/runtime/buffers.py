"""Persistent device buffers: the fixed-address inputs and outputs of each traced program (as
``torch/cuda/buffers``).

Allocated once, before any capture; refreshed in place with ``copy_host_to_device_tensor``
before every replay, never rebound (a trace keeps reading the addresses it was captured with).
Outputs (picked ids, logits, the sampling candidates' ids and logprobs) are written by the
program itself with a device copy, so no buffer is allocated behind a capture.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from tt_serve.model.tt.layout import ROW_MAJOR, TILE
from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.runtime.inputs import DecodeValues, PrefillValues
from tt_serve.model.tt.runtime.sampling import CANDIDATES

# field -> (dtype, layout); "act" is the activation dtype of the precision config.
PREFILL_FIELDS: dict[str, tuple[str, str]] = {
    "ids": ("uint32", ROW_MAJOR),
    "positions": ("uint32", ROW_MAJOR),
    "start": ("int32", ROW_MAJOR),
    "start_u32": ("uint32", ROW_MAJOR),
    "page_table": ("int32", ROW_MAJOR),
    "fill_table": ("int32", ROW_MAJOR),
    "gate_mask": ("float32", TILE),
    "conv_select": ("act", TILE),
    "last_select": ("act", TILE),
    "sampling": ("float32", TILE),
}
DECODE_FIELDS: dict[str, tuple[str, str]] = {
    "ids": ("uint32", ROW_MAJOR),
    "positions": ("uint32", ROW_MAJOR),
    "cur_pos": ("int32", ROW_MAJOR),
    "write_pos": ("int32", ROW_MAJOR),
    "page_table": ("int32", ROW_MAJOR),
    "gate_mask": ("float32", TILE),
    "conv_mask": ("act", TILE),
    "sampling": ("float32", TILE),
    "fed": ("float32", TILE),
}


@dataclass
class InputBuffers:
    """Device tensors named like the fields of the host values they are refreshed from."""

    tensors: dict[str, Tensor]
    kinds: dict[str, tuple[str, str]]
    out_ids: Tensor  # [1, N] uint32 ROW_MAJOR
    out_logits: Tensor  # [1, N, vocab] float32
    out_top_ids: Tensor  # [1, N, CANDIDATES] uint32: the sampling candidates' ids
    out_top_logprobs: Tensor  # [1, N, CANDIDATES] float32: their raw logprobs

    def __getattr__(self, name: str) -> Tensor:
        tensors = self.__dict__.get("tensors", {})
        if name in tensors:
            return tensors[name]
        raise AttributeError(name)

    @staticmethod
    def allocate(
        ops: Ops,
        values: PrefillValues | DecodeValues,
        *,
        act: str,
        rows: int,
        vocab: int,
    ) -> InputBuffers:
        kinds = PREFILL_FIELDS if isinstance(values, PrefillValues) else DECODE_FIELDS
        resolved = {n: (act if d == "act" else d, lay) for n, (d, lay) in kinds.items()}
        tensors = {
            n: ops.zeros(getattr(values, n).shape, d, lay) for n, (d, lay) in resolved.items()
        }
        return InputBuffers(
            tensors=tensors,
            kinds=resolved,
            out_ids=ops.zeros([1, rows], "uint32", ROW_MAJOR),
            out_logits=ops.zeros([1, rows, vocab], "float32", TILE),
            out_top_ids=ops.zeros([1, rows, CANDIDATES], "uint32", TILE),
            out_top_logprobs=ops.zeros([1, rows, CANDIDATES], "float32", TILE),
        )

    def write(
        self, ops: Ops, values: PrefillValues | DecodeValues, *, skip: tuple[str, ...] = ()
    ) -> None:
        for f in dataclasses.fields(values):
            if f.name not in self.tensors or f.name in skip:
                continue
            dtype, layout = self.kinds[f.name]
            array = np.asarray(getattr(values, f.name))
            ops.write(ops.host(array, dtype, layout), self.tensors[f.name])
