"""TTBackend: the Backend protocol on a Tenstorrent device through ttnn (mirrors ``ref/backend``).

``allocate`` creates every pool and persistent buffer, then warms and captures one prefill trace
per bucket and one decode trace, before any request runs: a prefix hit (a warm tail of any
length) therefore always finds a captured bucket and never falls back to an eager path.
``submit`` runs the step's single-token rows as one batched decode replay (state slot s in row
``pools.row(s)`` = s - 1: no row for the engine's padding slot 0, so the batch has max_batch
rows) and each multi-token row as one prefill replay; ``execute`` is ``submit(batch).result()``.

Reads: right after the decode replay (before anything of a later step is enqueued) ``submit``
starts a non-blocking read of its device-argmax ids (uint32) and records an event;
``TTPending.result`` waits on that event. Device commands run in order, so the read returns this
step's ids even when the next step's replay, submitted before ``result``, overwrites the buffer.
Rows that need logits (``want_logits``, ``top_logprobs``) and prefill rows are read blocking
inside ``submit`` (the engine does not pipeline them).

deviceResident: the decode program's ids input is fed from the previous replay's output buffer
by one device copy of the whole buffer, so a decode step is all-fed or all-host. It is fed when
its rows carry ``FED_TOKEN`` (the engine submits step n+1 before reading step n): each row's slot
must be a resident slot, i.e. a greedy decode row, of the step submitted just before, untouched
by copy_states since; anything else is a ValueError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tt_serve.engine.sampler import top_logprobs
from tt_serve.model.interface import (
    FED_TOKEN,
    CopyKind,
    StateCopy,
    StepBatch,
    StepOutput,
    StepRow,
)
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.buffers import InputBuffers
from tt_serve.model.tt.device import parse_device_ids
from tt_serve.model.tt.model import TTModel
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.pending import TTPending
from tt_serve.model.tt.plan import (
    DecodeValues,
    PrefillValues,
    choose_bucket,
    decode_values,
    make_buckets,
    prefill_values,
)
from tt_serve.model.tt.pools import DevicePools
from tt_serve.model.tt.precision import Precision
from tt_serve.model.tt.trace import Programs
from tt_serve.model.tt.weights import default_cache_dir, load_device_weights, to_numpy

if TYPE_CHECKING:
    import torch

DEFAULT_TRACE_REGION = 256 << 20
DEFAULT_L1_SMALL = 32768


class TTBackend:
    """Greedy tokens are picked on the device; logits leave it only for rows that ask."""

    def __init__(
        self,
        spec: ModelSpec,
        weights: dict[str, torch.Tensor] | Callable[[], dict[str, np.ndarray]],
        *,
        ops: Ops,
        precision: Precision | None = None,
        traced: bool = True,
        device_resident: bool = False,
        max_prefill_chunk: int = 2048,
        weight_cache_dir: Path | None = None,
    ) -> None:
        self.spec, self.ops = spec, ops
        self.precision = precision or Precision()
        self.device_resident = device_resident
        self.max_prefill_chunk = max_prefill_chunk
        source = weights if callable(weights) else (lambda: to_numpy(weights))
        dev_w = load_device_weights(ops, spec, self.precision, source, weight_cache_dir)
        self.model = TTModel(ops, spec, dev_w)
        self.programs = Programs(ops, traced=traced)
        self.pools: DevicePools | None = None
        self.prefill_bufs: dict[int, InputBuffers] = {}
        self.decode_bufs: InputBuffers | None = None
        self.buckets: tuple[int, ...] = ()
        self.width = 0
        self._resident: frozenset[int] = frozenset()  # resident slots of the last submitted step
        self._touched: set[int] = set()  # slots copy_states touched since that submit
        self.device_fed_decodes = 0  # decode steps whose ids came from the device (resident)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | int | tuple[int, ...] | None = "0",
        dtype: str = "bfloat16",
        traced: bool = True,
        device_resident: bool = False,
        max_prefill_chunk: int = 2048,
        weight_cache_dir: Path | None = None,
        trace_region_size: int = DEFAULT_TRACE_REGION,
    ) -> TTBackend:
        """Open the device, convert (or load cached) weights for a checkpoint folder."""
        from tt_serve.model.weights import load_weights

        ids = parse_device_ids(device)
        if len(ids) != 1:
            raise ValueError(f"the ttnn backend runs on one device; got device ids {ids}")
        spec = ModelSpec.from_hf_dir(path)
        ops = Ops.load()
        ops.open_device(ids[0], trace_region_size=trace_region_size, l1_small_size=DEFAULT_L1_SMALL)
        precision = Precision.named("mixed" if dtype == "mixed" else "bfloat16")
        return cls(
            spec,
            lambda: to_numpy(load_weights(path, spec)),
            ops=ops,
            precision=precision,
            traced=traced,
            device_resident=device_resident,
            max_prefill_chunk=max_prefill_chunk,
            weight_cache_dir=weight_cache_dir or default_cache_dir(),
        )

    # ---- pools and traces ----------------------------------------------------------------
    def allocate(
        self,
        *,
        num_kv_blocks: int,
        block_size: int,
        num_state_slots: int,
        num_snapshot_slots: int,
    ) -> None:
        if self.pools is not None:
            raise RuntimeError("TTBackend.allocate() may run once: traces hold the addresses")
        spec, ops = self.spec, self.ops
        self.pools = DevicePools.allocate(
            ops,
            spec,
            self.precision,
            num_kv_blocks=num_kv_blocks,
            block_size=block_size,
            num_state_slots=num_state_slots,
            num_snapshot_slots=num_snapshot_slots,
        )
        per_seq = -(-spec.max_position_embeddings // block_size)
        self.width = min(num_kv_blocks, per_seq)
        self.buckets = make_buckets(block_size, self.max_prefill_chunk)
        act, vocab = self.precision.activations, spec.vocab_size
        pools = self.pools
        for bucket in self.buckets:
            idle = self._prefill_values(StepRow(-1, (0,) * bucket, 0, (), 0, False), bucket)
            bufs = InputBuffers.allocate(ops, idle, act=act, rows=1, vocab=vocab)
            bufs.write(ops, idle)
            self.prefill_bufs[bucket] = bufs
            self.programs.add(("prefill", bucket), partial(self.model.prefill, bufs, pools))
        idle_dec = self._decode_values([])
        self.decode_bufs = InputBuffers.allocate(
            ops, idle_dec, act=act, rows=pools.rows, vocab=vocab
        )
        self.decode_bufs.write(ops, idle_dec)
        dec = self.decode_bufs
        self.programs.add(self._decode_key(), partial(self.model.decode, dec, pools))
        self.programs.capture_all()

    def _prefill_values(self, row: StepRow, bucket: int) -> PrefillValues:
        s = self.spec
        assert self.pools is not None
        return prefill_values(
            row,
            bucket=bucket,
            block_size=self.pools.block_size,
            width=self.width,
            head_dim=s.head_dim,
            rotary_dim=s.rotary_dim,
            theta=s.rope_theta,
            num_v_heads=s.linear_num_value_heads,
            conv_state_len=s.conv_state_len,
        )

    def _decode_values(self, rows: list[StepRow]) -> DecodeValues:
        s = self.spec
        assert self.pools is not None
        return decode_values(
            rows,
            num_rows=self.pools.rows,
            width=self.width,
            head_dim=s.head_dim,
            rotary_dim=s.rotary_dim,
            theta=s.rope_theta,
            num_v_heads=s.linear_num_value_heads,
        )

    def _decode_key(self) -> tuple[str, int]:
        assert self.pools is not None
        return ("decode", self.pools.rows)

    def _pools(self) -> DevicePools:
        if self.pools is None:
            raise RuntimeError("TTBackend.allocate() must be called before execute()")
        return self.pools

    # ---- steps ----------------------------------------------------------------------------
    def execute(self, batch: StepBatch) -> StepOutput:
        return self.submit(batch).result()

    def submit(self, batch: StepBatch) -> TTPending:
        """Run a step; only the decode replay's greedy ids may still be in flight on return.

        Raises ValueError (before any device work) for an empty row or a misused FED_TOKEN."""
        pools = self._pools()
        rows = batch.rows
        for row in rows:
            if row.num_tokens == 0:
                raise ValueError(f"row for seq {row.seq_id} has no tokens")
            if row.num_tokens > 1 and FED_TOKEN in row.token_ids:
                raise ValueError(f"FED_TOKEN in a multi-token row (seq {row.seq_id})")
        out = StepOutput(token_ids=[None] * len(rows), logprobs=[None] * len(rows))
        decode = [i for i, r in enumerate(rows) if r.num_tokens == 1]
        from_fed = self._check_fed([rows[i] for i in decode])
        pending = TTPending(out)
        if decode:
            pending = self._decode(rows, decode, out, from_fed)
        for i, row in enumerate(rows):
            if row.num_tokens > 1:
                self._prefill(row, i, out, pools)
        self._resident = pending.resident_slots
        self._touched = set()
        return pending

    def _check_fed(self, dec_rows: list[StepRow]) -> bool:
        """Whether the decode rows carry FED_TOKEN (then all of them do, each legitimately)."""
        fed = [r for r in dec_rows if r.token_ids[0] == FED_TOKEN]
        if not fed:
            return False
        if len(fed) != len(dec_rows):
            raise ValueError(
                "FED_TOKEN rows mixed with host-token rows in one decode step: the decode ids "
                "buffer is fed from the device whole, so a step is all-fed or all-host"
            )
        for r in fed:
            if r.state_slot in self._touched:
                raise ValueError(
                    f"FED_TOKEN for state slot {r.state_slot} (seq {r.seq_id}): copy_states "
                    "touched the slot after the step that left its id on the device"
                )
            if r.state_slot not in self._resident:
                raise ValueError(
                    f"FED_TOKEN for state slot {r.state_slot} (seq {r.seq_id}): not a resident "
                    "slot of the previously submitted step (not a greedy decode row of it"
                    + ("" if self.device_resident else "; device_resident is off")
                    + ")"
                )
        return True

    def _prefill(self, row: StepRow, i: int, out: StepOutput, pools: DevicePools) -> None:
        bucket = choose_bucket(row.num_tokens, self.buckets)
        bufs = self.prefill_bufs[bucket]
        pools.load_work(self.ops, row.state_slot)
        bufs.write(self.ops, self._prefill_values(row, bucket))
        self.programs.run(("prefill", bucket))
        pools.store_work(self.ops, row.state_slot)
        if row.sample:
            self._collect(bufs, [(i, 0, row)], out)

    def _decode(
        self, rows: tuple[StepRow, ...], idx: list[int], out: StepOutput, from_fed: bool
    ) -> TTPending:
        assert self.decode_bufs is not None and self.pools is not None
        bufs, dec_rows = self.decode_bufs, [rows[i] for i in idx]
        # deviceResident (FED_TOKEN rows): step n's output buffer feeds step n+1 on the device
        # and only positions and tables upload.
        host_rows = [replace(r, token_ids=(0,)) if from_fed else r for r in dec_rows]
        values = self._decode_values(host_rows)
        if from_fed:
            self.ops.copy(bufs.out_ids, bufs.ids)
            self.device_fed_decodes += 1
        bufs.write(self.ops, values, skip=("ids",) if from_fed else ())
        self.programs.run(self._decode_key())
        # (row index, decode batch row, row); resident slots stay engine slot numbers.
        picks = [(i, self.pools.row(rows[i].state_slot), rows[i]) for i in idx if rows[i].sample]
        greedy = [(i, b, r) for i, b, r in picks if not r.want_logits]
        resident = (
            frozenset(r.state_slot for _, _, r in greedy) if self.device_resident else frozenset()
        )
        if not picks:
            return TTPending(out, resident_slots=resident)
        if any(r.want_logits or r.top_logprobs > 0 for _, _, r in picks):
            # Rows that need logits are not pipelined by the engine: read them now.
            self._collect(bufs, picks, out)
            return TTPending(out, resident_slots=resident)
        # Started before anything of the next step is enqueued: the in-order device reads this
        # replay's ids although the next replay overwrites out_ids.
        read = self.ops.read_start(bufs.out_ids)
        return TTPending(
            out,
            resident_slots=resident,
            ops=self.ops,
            read=read,
            rows=tuple((i, b) for i, b, _ in greedy),
        )

    def _collect(
        self, bufs: InputBuffers, picks: list[tuple[int, int, StepRow]], out: StepOutput
    ) -> None:
        """Read ids (and logits only if a row needs them) for (row index, buffer row, row)."""
        if not picks:
            return
        ids = self.ops.read(bufs.out_ids).reshape(-1).astype(np.int64)
        logits = None
        if any(r.want_logits or r.top_logprobs > 0 for _, _, r in picks):
            logits = self.ops.read(bufs.out_logits).reshape(len(ids), -1)
        for i, b, row in picks:
            if row.want_logits:
                assert logits is not None
                out.logits[i] = logits[b].astype(np.float32)
                continue
            out.token_ids[i] = int(ids[b])
            if row.top_logprobs > 0:
                assert logits is not None
                out.logprobs[i] = top_logprobs(logits[b], int(ids[b]), row.top_logprobs)

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        self._pools().copy_states(self.ops, ops)
        # A save only reads the slot: the id the slot's last step left on the device still
        # continues its sequence (the torch backend agrees).
        self._touched.update(op.slot for op in ops if op.kind is not CopyKind.SAVE)

    def close(self) -> None:
        self.programs.release()
        self.ops.close_device()
