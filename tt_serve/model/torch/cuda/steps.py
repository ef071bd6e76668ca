"""StaticSteps: runs a step's rows through the bucketed (graph-captured) programs.

Decode rows (one token) go together through the decode bucket holding them; each prefill row
goes through the prefill bucket holding its chunk. Rows no bucket holds (too many decode rows,
a chunk longer than the largest bucket, a table wider than the graphs') are left to the caller's
eager path. ``launch`` only enqueues device work and starts a non-blocking copy of the greedy
ids into (pinned) host memory; ``PendingStep.result`` waits on an event for it.

Rows with a ``RowSampling`` are drawn on the device from the program's logits right after the
replay (``torch/sampling.py`` in its sync-free form: no host read, so the step stays in flight).
deviceResident: each row's picked id (argmax or draw) is left in ``slot_ids[slot]`` on the
device, where a fed decode row (``model/interface.py``) reads its input id.
"""

from __future__ import annotations

import torch

from tt_serve.model.buckets import NoBucket, choose_bucket, fit_table
from tt_serve.model.interface import StepOutput, StepRow
from tt_serve.model.torch.cuda.buffers import FlatInputs, decode_shapes, prefill_shapes
from tt_serve.model.torch.cuda.inputs import decode_values, prefill_values
from tt_serve.model.torch.cuda.model import decode_program, prefill_program
from tt_serve.model.torch.cuda.programs import GraphPrograms
from tt_serve.model.torch.model import HybridModel
from tt_serve.model.torch.pending import PendingStep
from tt_serve.model.torch.pools import Pools
from tt_serve.model.torch.sampling import draw_rows

Key = tuple[str, int]


class StaticSteps:
    """Owns the per-bucket inputs and the programs; built after the pools, captured once."""

    def __init__(
        self,
        programs: GraphPrograms,
        *,
        decode: dict[int, FlatInputs],
        prefill: dict[int, FlatInputs],
        block_size: int,
        width: int,
        conv_state_len: int,
        scratch_slot: int,
        slot_ids: torch.Tensor | None,
    ) -> None:
        self.programs = programs
        self.decode_inputs = decode
        self.prefill_inputs = prefill
        self.block_size = block_size
        self.width = width
        self.conv_state_len = conv_state_len
        self.scratch_slot = scratch_slot
        self.slot_ids = slot_ids
        self.num_fed_rows = 0

    @staticmethod
    def build(
        model: HybridModel,
        pools: Pools,
        programs: GraphPrograms,
        *,
        decode_buckets: tuple[int, ...],
        prefill_buckets: tuple[int, ...],
        width: int,
        conv_state_len: int,
        slot_ids: torch.Tensor | None,
    ) -> StaticSteps:
        """Allocate every bucket's inputs, write the idle values, register largest first."""
        device, bs, scratch = programs.device, pools.block_size, pools.scratch_slot
        dec: dict[int, FlatInputs] = {}
        pre: dict[int, FlatInputs] = {}
        for t in sorted(prefill_buckets, reverse=True):
            pre[t] = FlatInputs(prefill_shapes(t, width, conv_state_len), device)
            idle = prefill_values(
                None,
                bucket=t,
                block_size=bs,
                width=width,
                conv_state_len=conv_state_len,
                scratch_slot=scratch,
            )
            pre[t].write(idle)
            program = prefill_program(model, pools, pre[t], slot_ids)
            programs.add(("prefill", t), program, traced=programs.capture)
        for b in sorted(decode_buckets, reverse=True):
            dec[b] = FlatInputs(decode_shapes(b, width), device)
            dec[b].write(
                decode_values([], bucket=b, block_size=bs, width=width, scratch_slot=scratch)
            )
            program = decode_program(model, pools, dec[b], slot_ids)
            programs.add(("decode", b), program, traced=programs.capture)
        programs.capture_all()
        return StaticSteps(
            programs,
            decode=dec,
            prefill=pre,
            block_size=bs,
            width=width,
            conv_state_len=conv_state_len,
            scratch_slot=scratch,
            slot_ids=slot_ids,
        )

    def assign(self, rows: tuple[StepRow, ...]) -> tuple[list[tuple[Key, list[int]]], list[int]]:
        """(bucketed work as (key, row indices), row indices left for the eager path)."""
        work: list[tuple[Key, list[int]]] = []
        rest: list[int] = []
        dec = [i for i, r in enumerate(rows) if r.num_tokens == 1]
        if dec and self.decode_inputs:
            try:
                b = choose_bucket(len(dec), tuple(self.decode_inputs))
                for i in dec:
                    fit_table(rows[i], self.width, block_size=self.block_size, held_by="graphs")
                work.append((("decode", b), dec))
            except NoBucket:
                rest.extend(dec)
        else:
            rest.extend(dec)
        for i, r in enumerate(rows):
            if r.num_tokens <= 1:
                continue
            try:
                t = choose_bucket(r.num_tokens, tuple(self.prefill_inputs))
                fit_table(r, self.width, block_size=self.block_size, held_by="graphs")
                work.append((("prefill", t), [i]))
            except NoBucket:
                rest.append(i)
        return work, sorted(rest)

    def launch(
        self, rows: tuple[StepRow, ...], work: list[tuple[Key, list[int]]], out: StepOutput
    ) -> PendingStep:
        pending = PendingStep(out, rows)
        parts: list[torch.Tensor] = []
        n = 0
        for (phase, bucket), idx in work:
            sel = [rows[i] for i in idx]
            if phase == "decode":
                self.num_fed_rows += sum(r.fed for r in sel)
                values = decode_values(
                    sel,
                    bucket=bucket,
                    block_size=self.block_size,
                    width=self.width,
                    scratch_slot=self.scratch_slot,
                )
                self.decode_inputs[bucket].write(values)
            else:
                pv = prefill_values(
                    sel[0],
                    bucket=bucket,
                    block_size=self.block_size,
                    width=self.width,
                    conv_state_len=self.conv_state_len,
                    scratch_slot=self.scratch_slot,
                )
                self.prefill_inputs[bucket].write(pv)
            logits, ids = self.programs.run((phase, bucket))
            # Graph outputs are overwritten by the next replay of this key: copy now.
            part = ids[: len(idx)].clone()  # the program's argmax
            drawn = [b for b, r in enumerate(sel) if r.sampling is not None]
            if drawn:
                rows_drawn = torch.tensor(drawn, device=part.device)
                specs = [s for r in sel if (s := r.sampling) is not None]
                part[rows_drawn] = draw_rows(logits[rows_drawn], specs, sync_free=True)
                if self.slot_ids is not None:
                    slots = torch.tensor([r.state_slot for r in sel], device=part.device)
                    self.slot_ids.index_copy_(0, slots, part)
            parts.append(part)
            for b, i in enumerate(idx):
                pending.positions[i] = n + b
                if rows[i].sample and (rows[i].want_logits or rows[i].top_logprobs > 0):
                    pending.logits[i] = logits[b : b + 1].clone()
                    if rows[i].want_logits:
                        pending.host_bytes += logits[b].numel() * logits.element_size()
            n += len(idx)
        if self.slot_ids is not None:  # greedy rows leave their id in slot_ids
            pending.resident_slots = frozenset(
                rows[i].state_slot
                for i in pending.positions
                if rows[i].sample and not rows[i].want_logits
            )
        if parts:
            ids_dev = torch.cat(parts)
            cuda = ids_dev.device.type == "cuda"
            host = torch.empty(ids_dev.shape, dtype=torch.long, pin_memory=cuda)
            host.copy_(ids_dev, non_blocking=cuda)
            pending.ids_host = host
            pending.host_bytes += host.numel() * host.element_size()
            if cuda:
                pending.event = torch.cuda.Event()
                pending.event.record(torch.cuda.current_stream(ids_dev.device))
        return pending
