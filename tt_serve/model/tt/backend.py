"""TTBackend: the Backend protocol on a Tenstorrent device through ttnn (mirrors ``ref/backend``).

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
a MeshDevice and the programs run SPMD on every chip (``parallel.py`` splits every layer, heads
over the columns and widths over the rows too, ``ccl.py`` reduces per ``cluster_axis``); pools,
working state and snapshots are sharded by heads over the columns and replicated over the rows. Picks, candidates and fed ids are replicated on every chip (the
final pick runs on the gathered candidates on each chip), so chip 0's copy is what is read and
what a fed row's next decode takes, as tt-metal reads ``get_device_tensors(tok)[0]``; logits
stay vocabulary-sharded and are read with a concat composer. A state copy runs on every chip;
one that fails on any chip raises :class:`StateCopyError` for the whole call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

import numpy as np

from tt_serve.model.buckets import choose_bucket
from tt_serve.model.interface import StateCopy, StepBatch, StepOutput, StepRow
from tt_serve.model.resident import ResidentSlots
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.buffers import InputBuffers
from tt_serve.model.tt.devices import (
    DeviceSpec,
    box_for_mesh,
    single_chip_for_arch,
    single_chip_for_grid,
)
from tt_serve.model.tt.inputs import (
    DecodeValues,
    PrefillValues,
    decode_values,
    make_buckets,
    prefill_values,
)
from tt_serve.model.tt.model import TTModel
from tt_serve.model.tt.moe import MoeDispatch
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.parallel import TensorParallel
from tt_serve.model.tt.pending import PendingStep, PickReads
from tt_serve.model.tt.pools import DevicePools
from tt_serve.model.tt.precision import Precision
from tt_serve.model.tt.programs import Programs
from tt_serve.model.tt.sampling import CANDIDATES
from tt_serve.model.tt.weights import default_cache_dir, load_device_weights, to_numpy

if TYPE_CHECKING:
    import torch

    from tt_serve.config import ServeConfig

DEFAULT_L1_SMALL = 32768
DEFAULT_PREFILL_CHUNK = 2048
DEFAULT_CCL_LINKS = 1  # tt_transformers get_num_links: 1 on N300/T3K, 2 on P150x4 (both work)


class StateCopyError(RuntimeError):
    """A snapshot save/restore/reset failed on the device (on a mesh: on some chip, the others
    may have run theirs). The slot's state is undefined; the engine fails the step's requests,
    which frees their slots, blocks and snapshots, and a slot is reset or restored before reuse."""


class TTOptions(TypedDict, total=False):
    """The ttnn backend's options, all optional (defaults in brackets)."""

    precision: Precision  # [Precision()] the weight profile (``Precision.named``)
    traced_decode: bool  # [True] replay the captured decode trace (False: eager, for debugging)
    traced_prefill: bool  # [True] replay captured prefill traces (False: run them eagerly)
    device_resident: bool  # [False] picked ids stay on the device for fed rows
    max_prefill_chunk: int  # [DEFAULT_PREFILL_CHUNK] the largest prefill bucket
    max_model_len: int | None  # [None: the model's own] sizes the traces' page tables
    # [DEFAULT_CCL_LINKS] Ethernet links each collective uses on a mesh: one count, or
    # (axis 0, axis 1) as tt_transformers' get_num_links gives Galaxy (4, 3)
    ccl_links: int | tuple[int, int]
    weight_cache_dir: Path | None  # [None: no cache; from_pretrained uses the default dir]
    moe_dispatch: MoeDispatch  # ["sparse"] only the routed experts; "dense": all (the reference)


class TTBackend:
    """Tokens are picked on the device (argmax or a draw); logits leave it only for rows that
    ask."""

    # Draws of top_k in 1..32 happen on the device (tt-metal's models sample after a topk with
    # k <= 32); the engine picks other sampling rows on the host.
    max_device_top_k = CANDIDATES

    def __init__(
        self,
        spec: ModelSpec,
        weights: dict[str, torch.Tensor] | Callable[[], dict[str, np.ndarray]],
        *,
        ops: Ops,
        **options: Unpack[TTOptions],
    ) -> None:
        self.spec, self.ops = spec, ops
        self.precision = options.get("precision") or Precision()
        self.device_resident = options.get("device_resident", False)
        self.max_prefill_chunk = options.get("max_prefill_chunk", DEFAULT_PREFILL_CHUNK)
        self.max_model_len = options.get("max_model_len")
        source = weights if callable(weights) else (lambda: to_numpy(weights))
        cache_dir = options.get("weight_cache_dir")
        # Before any weight is converted: a split that does not divide fails here.
        self.tp = TensorParallel.for_mesh(spec, ops.mesh) if ops.mesh else TensorParallel(spec, 1)
        moe = options.get("moe_dispatch", "sparse")
        dev_w = load_device_weights(ops, spec, self.precision, source, cache_dir, self.tp, moe)
        links = options.get("ccl_links", DEFAULT_CCL_LINKS)
        self.model = TTModel(ops, spec, dev_w, self.precision, self.tp, links, moe_dispatch=moe)
        self.programs = Programs(ops)
        # Decode is always traced on a device (an eager step dispatches ~1.5-2k ops from the
        # host); prefill tracing is the ``--traced-prefill`` choice.
        self.traced_decode = options.get("traced_decode", True)
        self.traced_prefill = options.get("traced_prefill", True)
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
        self._closed = False

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        trace_region_size: int,
        spec: ModelSpec | None = None,
        device_ids: tuple[int, ...] = (0,),
        mesh: tuple[int, int] | None = None,
        ops: Ops | None = None,
        **options: Unpack[TTOptions],
    ) -> TTBackend:
        """Open the device with a ``trace_region_size``-byte trace region, convert (or load
        cached) weights for a checkpoint folder; ``spec`` is read from its config.json unless
        the caller already has it, ``ops`` is the real ttnn unless given. ``mesh`` (rows, cols):
        a MeshDevice over ``device_ids`` (None: one device, or (1, len(device_ids))), rows x
        cols in row-major order of the ids."""
        from tt_serve.model.weights import load_weights

        model_spec = spec or ModelSpec.from_hf_dir(path)
        shape = mesh or (1, len(device_ids))
        if shape[0] * shape[1] != len(device_ids):
            raise ValueError(
                f"mesh {shape[0]} x {shape[1]} needs {shape[0] * shape[1]} device ids; got "
                f"{device_ids}"
            )
        if shape != (1, 1):
            TensorParallel.for_mesh(model_spec, shape)  # before the device opens
        ops = ops or Ops.load()
        if shape == (1, 1):
            ops.open_device(
                device_ids[0], trace_region_size=trace_region_size, l1_small_size=DEFAULT_L1_SMALL
            )
        else:
            ops.open_mesh(
                shape,
                trace_region_size=trace_region_size,
                l1_small_size=DEFAULT_L1_SMALL,
                device_ids=device_ids,
            )
        options["weight_cache_dir"] = options.get("weight_cache_dir") or default_cache_dir()
        return cls(model_spec, lambda: to_numpy(load_weights(path, model_spec)), ops=ops, **options)

    @classmethod
    def from_config(
        cls, cfg: ServeConfig, spec: ModelSpec, *, max_model_len: int, ops: Ops | None = None
    ) -> TTBackend:
        """The backend ``cfg`` describes (the one mapping of config to ttnn options). A
        ``trace_region_size`` of 0 is sized, before the device opens, from the traces this
        configuration captures on the shape-only model of a chip of the device's arch (on a
        mesh: of the same mesh of such chips, each chip's region); the mesh is
        ``config.mesh_shape(cfg)``."""
        if cfg.model is None:
            raise ValueError("TTBackend.from_config needs cfg.model (a checkpoint folder)")
        from tt_serve.config import mesh_shape

        mesh = mesh_shape(cfg)  # config.py owns "ROWSxCOLS" / 1 x len(device_ids)
        ops = ops or Ops.load()
        # The links tt_transformers' get_num_links gives the box (2 on P150x4 / P300, 4 and 3 on
        # a Galaxy's axes); a mesh no description opens as keeps DEFAULT_CCL_LINKS.
        box = box_for_mesh(ops.arch_name(), mesh) if mesh != (1, 1) else None
        links = box.links_on(mesh) if box is not None else DEFAULT_CCL_LINKS
        region = cfg.trace_region_size
        if region == 0:
            from tt_serve.model.tt.planner import PlanRequest, trace_region_for

            chip = single_chip_for_arch(ops.arch_name())
            plan_cfg = dataclasses.replace(cfg, max_model_len=max_model_len)
            req = PlanRequest.from_config(plan_cfg, chip.name)
            if mesh != (1, 1):
                req = dataclasses.replace(req, mesh=mesh)
            region = trace_region_for(spec, req)
        return cls.from_pretrained(
            cfg.model,
            trace_region_size=region,
            ops=ops,
            spec=spec,
            device_ids=cfg.device_ids,
            mesh=mesh,
            precision=Precision.named(cfg.resolved_precision),
            traced_prefill=cfg.traced_prefill,
            device_resident=cfg.device_resident,
            max_prefill_chunk=cfg.prefill_chunk,
            max_model_len=max_model_len,
            ccl_links=links,
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
            tp=self.tp,
        )
        limit = spec.max_position_embeddings
        per_seq = -(-min(self.max_model_len or limit, limit) // block_size)
        self.width = min(num_kv_blocks, per_seq)
        self.buckets = make_buckets(block_size, self.max_prefill_chunk)
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
        cannot feed, or a draw this backend does not make on the device."""
        pools = self._pools()
        rows = batch.rows
        for row in rows:
            if row.num_tokens == 0:
                raise ValueError(f"row for seq {row.seq_id} has no tokens")
            if row.sampling is not None and not 1 <= row.sampling.top_k <= CANDIDATES:
                raise ValueError(
                    f"row for seq {row.seq_id}: device draws need 1 <= top_k <= "
                    f"{CANDIDATES} (got {row.sampling.top_k}); pick it on the host"
                )
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
            raise  # a bad request or a broken device rule (the fake's ContractViolation)
        except Exception as exc:
            failure = f"state copies {list(ops)} failed: {exc}"
        finally:
            self.resident.forget(ops)
        if failure is not None:
            # Raised outside the handler: no chained traceback keeps the copies' temporaries
            # (slices of the pools, on the chips that ran them) alive past this call.
            raise StateCopyError(failure)

    def device_description(self) -> DeviceSpec:
        """The opened device: the one-chip description matching its worker grid (the planner
        sizes the pools with it), and on a mesh the whole mesh (its shape, hence its chips)."""
        grid = self.ops.device.compute_with_storage_grid_size()
        chip = single_chip_for_grid(int(grid.x), int(grid.y))
        if self.ops.mesh is None or self.ops.mesh == (1, 1):
            return chip
        rows, cols = self.ops.mesh
        return dataclasses.replace(
            chip,
            mesh=(rows, cols),
            description=f"{rows} x {cols} mesh of {rows * cols} {chip.name} chips",
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.programs.release()
        self.ops.close_device()
