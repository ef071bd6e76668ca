"""StaticSteps: runs a step's rows through the bucketed (graph-captured) programs.

Decode rows (one token) go together through the decode bucket holding them; each prefill row
goes through the prefill bucket holding its chunk. Rows no bucket holds (too many decode rows,
a chunk longer than the largest bucket, a table wider than the graphs') are left to the caller's
eager path. ``launch`` only enqueues device work and starts a non-blocking copy of the greedy
ids into (pinned) host memory; ``PendingStep.result`` waits on an event for it.

deviceResident: each program leaves its argmax in ``slot_ids[slot]`` on the device. A decode row
carrying ``FED_TOKEN`` (see ``model/interface``: the engine submits step n+1 before reading step
n) reads its input id from there; it is accepted only for a slot the previous launch left an id
in (``resident_slots``) and no state copy has touched since.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tt_serve.model.interface import FED_TOKEN, StepOutput, StepRow
from tt_serve.model.ref.buckets import (
    NoBucket,
    choose_bucket,
    decode_values,
    fit_table,
    prefill_values,
)
from tt_serve.model.ref.graphs import GraphRunner
from tt_serve.model.ref.model import HybridModel
from tt_serve.model.ref.outputs import fill_logprobs
from tt_serve.model.ref.pools import Pools
from tt_serve.model.ref.static import (
    FlatInputs,
    decode_program,
    decode_shapes,
    prefill_program,
    prefill_shapes,
)

Key = tuple[str, int]


@dataclass
class PendingStep:
    """A launched step: results are read (blocking on an event) only in ``result``."""

    out: StepOutput
    rows: tuple[StepRow, ...]
    ids_host: torch.Tensor | None = None
    event: torch.cuda.Event | None = None
    positions: dict[int, int] = field(default_factory=dict)  # row index -> index in ids_host
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # row index -> [1, vocab]
    resident_slots: frozenset[int] = frozenset()
    done: bool = False

    def result(self) -> StepOutput:
        if self.done:
            return self.out
        if self.event is not None:
            self.event.synchronize()
        ids = self.ids_host.tolist() if self.ids_host is not None else []
        for i, p in self.positions.items():
            row = self.rows[i]
            if row.sample and not row.want_logits:
                self.out.token_ids[i] = int(ids[p])
        for i, lg in self.logits.items():
            if self.rows[i].want_logits:
                self.out.logits[i] = lg[0].cpu().numpy()
            else:
                chosen = torch.tensor([ids[self.positions[i]]], device=lg.device)
                fill_logprobs(self.out, lg, chosen, [i], self.rows)
        self.done = True
        return self.out


class StaticSteps:
    """Owns the per-bucket inputs and the runner; built after the pools, captured once."""

    def __init__(
        self,
        runner: GraphRunner,
        *,
        decode: dict[int, FlatInputs],
        prefill: dict[int, FlatInputs],
        block_size: int,
        width: int,
        conv_state_len: int,
        slot_ids: torch.Tensor | None,
    ) -> None:
        self.runner = runner
        self.decode_inputs = decode
        self.prefill_inputs = prefill
        self.block_size = block_size
        self.width = width
        self.conv_state_len = conv_state_len
        self.slot_ids = slot_ids
        self._resident: frozenset[int] = frozenset()  # slots the newest launch left an id in
        self.num_fed_rows = 0

    @staticmethod
    def build(
        model: HybridModel,
        pools: Pools,
        runner: GraphRunner,
        *,
        decode_buckets: tuple[int, ...],
        prefill_buckets: tuple[int, ...],
        width: int,
        conv_state_len: int,
        slot_ids: torch.Tensor | None,
    ) -> StaticSteps:
        """Allocate every bucket's inputs, write the idle values, register largest first."""
        device, bs = runner.device, pools.block_size
        dec: dict[int, FlatInputs] = {}
        pre: dict[int, FlatInputs] = {}
        for t in sorted(prefill_buckets, reverse=True):
            pre[t] = FlatInputs(prefill_shapes(t, width, conv_state_len), device)
            pre[t].write(
                prefill_values(
                    None, bucket=t, block_size=bs, width=width, conv_state_len=conv_state_len
                )
            )
            runner.add(("prefill", t), prefill_program(model, pools, pre[t], slot_ids))
        for b in sorted(decode_buckets, reverse=True):
            dec[b] = FlatInputs(decode_shapes(b, width), device)
            dec[b].write(decode_values([], [], bucket=b, block_size=bs, width=width))
            runner.add(("decode", b), decode_program(model, pools, dec[b], slot_ids))
        runner.capture_all()
        return StaticSteps(
            runner,
            decode=dec,
            prefill=pre,
            block_size=bs,
            width=width,
            conv_state_len=conv_state_len,
            slot_ids=slot_ids,
        )

    def plan(self, rows: tuple[StepRow, ...]) -> tuple[list[tuple[Key, list[int]]], list[int]]:
        """(bucketed work as (key, row indices), row indices left for the eager path)."""
        work: list[tuple[Key, list[int]]] = []
        rest: list[int] = []
        dec = [i for i, r in enumerate(rows) if r.num_tokens == 1]
        if dec and self.decode_inputs:
            try:
                b = choose_bucket(len(dec), tuple(self.decode_inputs))
                for i in dec:
                    fit_table(rows[i], self.block_size, self.width)
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
                fit_table(r, self.block_size, self.width)
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
                fed = [self._feeds(r) for r in sel]
                self.num_fed_rows += sum(fed)
                values = decode_values(
                    sel, fed, bucket=bucket, block_size=self.block_size, width=self.width
                )
                self.decode_inputs[bucket].write(values)
            else:
                pv = prefill_values(
                    sel[0],
                    bucket=bucket,
                    block_size=self.block_size,
                    width=self.width,
                    conv_state_len=self.conv_state_len,
                )
                self.prefill_inputs[bucket].write(pv)
            logits, ids = self.runner.run((phase, bucket))
            # Graph outputs are overwritten by the next replay of this key: copy now.
            parts.append(ids[: len(idx)].clone())
            for b, i in enumerate(idx):
                pending.positions[i] = n + b
                if rows[i].sample and (rows[i].want_logits or rows[i].top_logprobs > 0):
                    pending.logits[i] = logits[b : b + 1].clone()
            n += len(idx)
        if self.slot_ids is not None:
            pending.resident_slots = frozenset(
                rows[i].state_slot
                for i in pending.positions
                if rows[i].sample and not rows[i].want_logits
            )
        self._resident = pending.resident_slots
        if parts:
            ids_dev = torch.cat(parts)
            cuda = ids_dev.device.type == "cuda"
            host = torch.empty(ids_dev.shape, dtype=torch.long, pin_memory=cuda)
            host.copy_(ids_dev, non_blocking=cuda)
            pending.ids_host = host
            if cuda:
                pending.event = torch.cuda.Event()
                pending.event.record(torch.cuda.current_stream(ids_dev.device))
        return pending

    def _feeds(self, row: StepRow) -> bool:
        if row.token_ids[0] != FED_TOKEN:
            return False
        if row.state_slot not in self._resident:
            raise ValueError(
                f"decode row for seq {row.seq_id} asks for the device-resident id of state "
                f"slot {row.state_slot}, but the previous step left none there"
            )
        return True

    def forget(self, slots: set[int]) -> None:
        """State copies touched ``slots``: their device ids no longer continue any sequence."""
        self._resident = self._resident - slots
