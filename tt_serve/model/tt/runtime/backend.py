"""TTBackend: the Backend protocol on a Tenstorrent device through ttnn (mirrors ``model/torch/backend.py``).

``allocate`` creates every pool and persistent buffer, then warms and captures one prefill trace
per bucket and one decode trace, before any request runs: a prefix hit (a warm tail of any
length) therefore always finds a captured bucket and never falls back to an eager path.
``submit`` runs the step's single-token rows as one batched decode replay (engine state slot s in
decode row s: the batch has exactly num_state_slots rows) and each multi-token row as one
prefill replay; ``execute`` is ``submit(batch).result()``.

Picks: every sampling row's token is picked inside the program (argmax, or a ``RowSampling``
draw with 1 <= top_k <= ``max_device_top_k``: ``sampling.py``), and its logprobs come from the
sampling candidates on the device. Reads: right after the decode replay (before anything of a
later step is enqueued) ``submit`` starts non-blocking reads of the picked ids (and of the
candidates' ids and logprobs when a row asks for logprobs) and records an event;
``PendingStep.result`` waits on it. Device commands run in order, so the reads return this
step's values even when the next step's replay, submitted before ``result``, overwrites the
buffers. Logits leave the device only for ``want_logits`` rows, one row each, read blocking
inside ``submit`` (the engine picks those on the host and does not pipeline them); prefill picks
are read at once too. ``ops.bytes_read`` counts every byte read.

deviceResident (fed rows: ``model/interface.py``): a fed row's input id is the previous decode
replay's pick for its slot, chosen per row inside the decode program (``TTModel._decode_ids``),
so fed and host-token rows may share a step.

Mesh (``mesh=(R, C)``, tensor parallel; 1 x N, or 2-D as T3K 2x4 and Galaxy 8x4): the ops open
a MeshDevice and the programs run SPMD on every chip (``layout/parallel.py`` splits every layer, heads
over the columns and widths over the rows too, ``ccl.py`` reduces per ``cluster_axis``); pools,
working state and snapshots are sharded by heads over the columns and replicated over the rows. Picks, candidates and fed ids are replicated on every chip (the
final pick runs on the gathered candidates on each chip), so chip 0's copy is what is read and
what a fed row's next decode takes, as tt-metal reads ``get_device_tensors(tok)[0]``; logits
stay vocabulary-sharded and are read with a concat composer. A state copy runs on every chip;
one that fails on any chip raises :class:`StateCopyError` for the whole call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from tt_serve.model.buckets import choose_bucket, prefill_buckets
from tt_serve.model.interface import StateCopy, StepBatch, StepOutput, StepRow, check_rows
from tt_serve.model.resident import ResidentSlots
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.runtime.buffers import InputBuffers
from tt_serve.model.tt.runtime.inputs import (
    DecodeValues,
    PrefillValues,
    decode_values,
    prefill_values,
)
from tt_serve.model.tt.runtime.model import TTModel
from tt_serve.model.tt.runtime.pending import PendingStep, PickReads
from tt_serve.model.tt.runtime.pools import DevicePools
from tt_serve.model.tt.runtime.programs import TracePrograms
from tt_serve.model.tt.runtime.sampling import CANDIDATES
from tt_serve.model.tt.runtime.units import UnitMover


class StateCopyError(RuntimeError):
    """A snapshot save/restore/reset failed on the device (on a mesh: on some chip, the others
    may have run theirs). The slot's state is undefined; the engine fails the step's requests,
    which frees their slots, blocks and snapshots, and a slot is reset or restored before reuse."""


TABLE_ALIGN = 8  # page-table entries per 32-byte int32 stick


def table_width(num_kv_blocks: int, per_seq: int) -> int:
    """The page tables' width for a pool of ``num_kv_blocks`` and sequences of ``per_seq``
    blocks: whole ``TABLE_ALIGN`` sticks, no wider than the pool."""
    per_seq_row = -(-per_seq // TABLE_ALIGN) * TABLE_ALIGN
    return min(per_seq_row, num_kv_blocks // TABLE_ALIGN * TABLE_ALIGN)


class TTBackend:
    """Tokens are picked on the device (argmax or a draw); logits leave it only for rows that
    ask."""

    # Draws of top_k in 1..32 happen on the device (tt-metal's models sample after a topk with
    # k <= 32); the engine picks other sampling rows on the host.
    max_device_top_k = CANDIDATES

    def __init__(
        self,
        model: TTModel,
        *,
        ops: Ops,
        options: TTOptions,
        on_capture: Callable[[], None] | None = None,
    ) -> None:
        """A backend over a built model (``runtime/build.build_backend`` builds both: weight
        layout and upload, model), run as ``options`` say (prefill buckets up to
        ``prefill_chunk``, tracing, residency, the page tables' context); ``on_capture`` is
        called once when the programs are captured. Nothing is allocated until
        :meth:`allocate`."""
        self.spec, self.ops, self.model = model.spec, ops, model
        self.precision, self.tp = model.precision, model.tp
        self.device_resident = options.device_resident
        self.max_prefill_chunk = options.prefill_chunk
        self.max_model_len = options.max_model_len or None
        self.programs = TracePrograms(ops, on_capture=on_capture)
        # Decode is always traced on a device (an eager step dispatches ~1.5-2k ops from the
        # host); prefill tracing is the ``--traced-prefill`` choice.
        self.traced_decode = options.traced_decode
        self.traced_prefill = options.traced_prefill
        self.pools: DevicePools | None = None
        self.prefill_bufs: dict[int, InputBuffers] = {}
        self.decode_bufs: InputBuffers | None = None
        self.buckets: tuple[int, ...] = ()
        self.width = 0
        self.resident = ResidentSlots(self.device_resident)
        self.device_fed_decodes = 0  # decode steps whose ids came from the device (resident)
        # The state slot whose GDN state lives in the prefill working buffers, not yet written
        # back: consecutive prefill chunks of one row load and store it once, not per replay.
        self._work_slot: int | None = None
        self._unit_mover: UnitMover | None = None  # made at the first tier read or write
        self._closed = False

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
            tp=self.tp,
        )
        limit = spec.max_position_embeddings
        per_seq = -(-min(self.max_model_len or limit, limit) // block_size)
        # The page table is a row of int32 block ids whose byte size chunked SDPA wants a
        # multiple of 32 (sdpa_program_factory.cpp:165, 0.81.1): 8 entries at a time (the extra
        # ones the padding block), and no wider than the pool (paged_update_cache's
        # "max_num_blocks_per_seq must be less than max_num_blocks").
        if num_kv_blocks < TABLE_ALIGN:
            raise ValueError(
                f"the ttnn backend needs at least {TABLE_ALIGN} KV blocks (got {num_kv_blocks}): "
                "a page-table row is a whole 32-byte stick of int32 block ids"
            )
        self.width = table_width(num_kv_blocks, per_seq)
        self.buckets = prefill_buckets(self.max_prefill_chunk, block_size, unit="block_size")
        self.model.upload_rope(self.width * block_size, self.precision.activations)
        act, vocab = self.precision.activations, self.tp.vocab  # out_logits: the chip's shard
        pools = self.pools
        for bucket in self.buckets:
            idle = self._prefill_values(StepRow(-1, (0,) * bucket, 0, (), 0, False), bucket)
            bufs = InputBuffers.allocate(ops, idle, act=act, rows=1, vocab=vocab)
            bufs.write(ops, idle)
            self.prefill_bufs[bucket] = bufs
            self.programs.add(
                ("prefill", bucket),
                partial(self.model.prefill, bufs, pools),
                traced=self.traced_prefill,
            )
        idle_dec = self._decode_values([])
        self.decode_bufs = InputBuffers.allocate(
            ops, idle_dec, act=act, rows=pools.num_slots, vocab=vocab
        )
        self.decode_bufs.write(ops, idle_dec)
        dec = self.decode_bufs
        self.programs.add(
            self._decode_key(), partial(self.model.decode, dec, pools), traced=self.traced_decode
        )
        self.programs.capture_all()

    def _prefill_values(self, row: StepRow, bucket: int) -> PrefillValues:
        s = self.spec
        assert self.pools is not None
        return prefill_values(
            row,
            bucket=bucket,
            block_size=self.pools.block_size,
            width=self.width,
            num_v_heads=self.tp.v_heads,
            conv_state_len=s.conv_state_len,
        )

    def _decode_values(self, rows: list[StepRow]) -> DecodeValues:
        assert self.pools is not None
        return decode_values(
            rows,
            num_rows=self.pools.num_slots,
            width=self.width,
            num_v_heads=self.tp.v_heads,
        )

    def _decode_key(self) -> tuple[str, int]:
        assert self.pools is not None
        return ("decode", self.pools.num_slots)

    def _pools(self) -> DevicePools:
        if self.pools is None:
            raise RuntimeError("TTBackend.allocate() must be called before execute()")
        return self.pools

    # ---- steps ----------------------------------------------------------------------------
    def execute(self, batch: StepBatch) -> StepOutput:
        return self.submit(batch).result()

    def submit(self, batch: StepBatch) -> PendingStep:
        """Run a step; only the decode replay's picks may still be in flight on return.

        Raises ValueError (before any device work) for an empty row, a fed row this backend
        cannot feed, or a draw this backend does not make on the device (``check_rows``,
        ``ResidentSlots``)."""
        pools = self._pools()
        rows = batch.rows
        check_rows(rows, max_device_top_k=self.max_device_top_k)
        decode = [i for i, r in enumerate(rows) if r.num_tokens == 1]
        fed = self.resident.check(rows)
        out = StepOutput(token_ids=[None] * len(rows), logprobs=[None] * len(rows))
        pending = PendingStep(out)
        if decode:
            self.flush_state()
            pending = self._decode(rows, decode, out, from_fed=fed > 0)
        for i, row in enumerate(rows):
            if row.num_tokens > 1:
                self._prefill(row, i, out, pools)
        self.resident.launched(pending.resident_slots)
        return pending

    def _prefill(self, row: StepRow, i: int, out: StepOutput, pools: DevicePools) -> None:
        bucket = choose_bucket(row.num_tokens, self.buckets)
        bufs = self.prefill_bufs[bucket]
        if self._work_slot != row.state_slot:
            self.flush_state()
            pools.load_work(self.ops, row.state_slot)
            self._work_slot = row.state_slot
        bufs.write(self.ops, self._prefill_values(row, bucket))
        self.programs.run(("prefill", bucket))
        if not row.sample:
            return
        if row.want_logits:
            out.logits[i] = self._read_logits(bufs, 0)
            return
        reads = self._start_reads(bufs, [(i, 0, row)])
        PendingStep(out, ops=self.ops, reads=reads).result()

    def _decode(
        self, rows: tuple[StepRow, ...], idx: list[int], out: StepOutput, from_fed: bool
    ) -> PendingStep:
        assert self.decode_bufs is not None and self.pools is not None
        bufs = self.decode_bufs
        # Fed rows take their id from step n's out_ids inside the program; every input
        # (the fed rows' placeholder ids and flags too) uploads.
        bufs.write(self.ops, self._decode_values([rows[i] for i in idx]))
        if from_fed:
            self.device_fed_decodes += 1
        self.programs.run(self._decode_key())
        # (row index, decode batch row, row); resident slots stay engine slot numbers.
        picks = [(i, self.pools.row(rows[i].state_slot), rows[i]) for i in idx if rows[i].sample]
        device = [(i, b, r) for i, b, r in picks if not r.want_logits]
        resident = (
            frozenset(r.state_slot for _, _, r in device) if self.device_resident else frozenset()
        )
        # Started before anything of the next step is enqueued: the in-order device reads this
        # replay's picks although the next replay overwrites the buffers.
        reads = self._start_reads(bufs, device) if device else None
        for i, b, r in picks:
            if r.want_logits:  # host-picked rows are not pipelined by the engine: read now
                out.logits[i] = self._read_logits(bufs, b)
        return PendingStep(out, resident_slots=resident, ops=self.ops, reads=reads)

    def _start_reads(self, bufs: InputBuffers, picks: list[tuple[int, int, StepRow]]) -> PickReads:
        """Non-blocking reads of the picked ids (and of the candidates' ids and logprobs when a
        row wants logprobs) for (row index, buffer row, row)."""
        ops = self.ops
        logprobs = any(r.top_logprobs > 0 for _, _, r in picks)
        return PickReads(
            ids=ops.read_start(bufs.out_ids),
            top_ids=ops.read_start(bufs.out_top_ids) if logprobs else None,
            top_logprobs=ops.read_start(bufs.out_top_logprobs) if logprobs else None,
            rows=tuple((i, b, r.top_logprobs) for i, b, r in picks),
        )

    def _read_logits(self, bufs: InputBuffers, b: int) -> np.ndarray:
        """Buffer row ``b``'s float32 logits [vocab], one row copied (row-major: no tile
        padding crosses to the host)."""
        ops, vocab = self.ops, self.tp.vocab
        row = ops.to_row_major(ops.slice(bufs.out_logits, [0, b, 0], [1, b + 1, vocab]))
        return ops.read_concat(row, -1).reshape(-1).astype(np.float32)

    def flush_state(self) -> None:
        """Write the GDN state a prefill left in the working buffers back to its slot (done
        before any decode step or state copy; the pools are current afterwards)."""
        if self._work_slot is not None:
            self._pools().store_work(self.ops, self._work_slot)
            self._work_slot = None

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        """Every copy on every chip, or :class:`StateCopyError` (the slots it touched lose
        their resident ids either way). Out-of-range slots raise ValueError before any copy."""
        self.flush_state()
        failure = None
        try:
            self._pools().copy_states(self.ops, ops)
        except (ValueError, AssertionError):
            raise  # a bad request or a broken device rule (the virtual device's ContractViolation)
        except Exception as exc:
            failure = f"state copies {list(ops)} failed: {exc}"
        finally:
            self.resident.forget(ops)
        if failure is not None:
            # Raised outside the handler: no chained traceback keeps the copies' temporaries
            # (slices of the pools, on the chips that ran them) alive past this call.
            raise StateCopyError(failure)

    def read_unit(self, blocks: Sequence[int], snapshot_slot: int) -> tuple[bytes, list[bytes]]:
        """``UnitIO`` (``runtime/units.py``): TILE tensors as they are, no host conversion."""
        self.flush_state()
        return self._units().read(self._pools(), blocks, snapshot_slot)

    def write_unit(
        self,
        blocks: Sequence[int],
        block_data: Sequence[bytes],
        snapshot_slot: int,
        snapshot: bytes | None,
    ) -> None:
        """``UnitIO`` (``runtime/units.py``)."""
        self.flush_state()
        self._units().write(self._pools(), blocks, block_data, snapshot_slot, snapshot)

    def _units(self) -> UnitMover:
        if self._unit_mover is None:
            self._unit_mover = UnitMover(self.ops)
        return self._unit_mover

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._unit_mover is not None:
            self._unit_mover.close()
        self.programs.release()
        self.ops.close_device()
