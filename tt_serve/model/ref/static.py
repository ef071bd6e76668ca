"""Static-shape step programs: persistent input buffers and the decode / prefill programs.

Each (phase, bucket) owns one ``FlatInputs``: a single long tensor on the device whose named
views are the program's inputs, refreshed in place from the host with one copy per replay (the
addresses never change, which is what a captured graph needs). Programs end with a device argmax
and return (logits, ids); with ``slot_ids`` (deviceResident) they also scatter the ids into a
per-state-slot device tensor, and a decode row marked ``fed`` reads its input id from there
instead of from the host-written buffer.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F

from tt_serve.model.interface import PAD_SLOT
from tt_serve.model.ref.attention import AttentionWeights
from tt_serve.model.ref.buckets import DecodeValues, PrefillValues
from tt_serve.model.ref.gdn import GdnWeights
from tt_serve.model.ref.graphs import Program
from tt_serve.model.ref.layers import rope_cos_sin
from tt_serve.model.ref.model import HybridModel
from tt_serve.model.ref.plan import StepPlan
from tt_serve.model.ref.pools import Pools
from tt_serve.model.ref.static_layers import PrefillRow, masked_attention, masked_gdn


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


def decode_program(
    model: HybridModel, pools: Pools, inputs: FlatInputs, slot_ids: torch.Tensor | None
) -> Program:
    """B single-token rows through the eager decode kernels, on fixed-shape inputs."""
    v = inputs.views
    rows = torch.arange(v["ids"].shape[0], device=inputs.flat.device)

    def run() -> tuple[torch.Tensor, ...]:
        ids = v["ids"]
        if slot_ids is not None:
            ids = torch.where(v["fed"] != 0, slot_ids.index_select(0, v["slots"]), ids)
        plan = StepPlan(
            token_ids=ids,
            positions=v["positions"],
            kv_blocks=v["kv_blocks"],
            kv_offsets=v["kv_offsets"],
            spans=(),
            dec_tokens=rows,
            dec_slots=v["slots"],
            dec_tables=v["tables"],
            dec_lens=v["lens"],
            last_tokens=rows,
        )
        logits = model.logits(model.hidden_states(plan, pools))
        return _finish(logits, v["slots"], pools, slot_ids)

    return run


def prefill_program(
    model: HybridModel,
    pools: Pools,
    inputs: FlatInputs,
    slot_ids: torch.Tensor | None,
) -> Program:
    """One padded prefill row through the masked mixers; logits of its last valid token."""
    v = inputs.views
    key_pos = torch.arange(v["table"].shape[0] * pools.block_size, device=inputs.flat.device)
    row = PrefillRow(**v, key_pos=key_pos)

    def gdn(h: torch.Tensor, w: GdnWeights, j: int) -> torch.Tensor:
        return masked_gdn(h, w, row, pools.conv[j], pools.rec[j])

    def run() -> tuple[torch.Tensor, ...]:
        x = F.embedding(row.ids, model.embed)
        cos, sin = rope_cos_sin(row.positions, model.inv_freq, x.dtype)

        def attn(h: torch.Tensor, w: AttentionWeights, j: int) -> torch.Tensor:
            return masked_attention(h, w, row, cos, sin, pools.k[j], pools.v[j])

        hidden = model.run_layers(x, gdn, attn)
        logits = model.logits(hidden.index_select(0, row.last))
        return _finish(logits, row.slot, pools, slot_ids)

    return run


def _finish(
    logits: torch.Tensor, slots: torch.Tensor, pools: Pools, slot_ids: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    ids = logits.argmax(dim=-1)
    if slot_ids is not None:
        slot_ids.index_copy_(0, slots, ids)
    # Padding rows ran in PAD_SLOT: reset it so its garbage never grows across steps.
    pools.zero_slot(PAD_SLOT)
    return logits, ids
