"""TorchBackend: the reference implementation of the Backend protocol (CPU, or CUDA).

Default: every step runs eagerly through ``StepPlan`` (any shape, any mix of rows). Opt-in
(off by default so CPU behaviour is unchanged): ``cuda_graphs`` runs decode rows through
per-batch-bucket programs and ``traced_prefill`` runs prefill chunks through per-length bucket
programs (``torch/cuda``), both captured as CUDA graphs after the pools are allocated (on CPU
the same programs run eagerly through the same buffers: the testable twin); ``device_resident``
keeps each slot's last greedy id on the device for fed rows (``model/interface.py``). Rows no
bucket holds run eagerly in the same step. ``capture_graphs=False`` runs the bucketed programs
eagerly on CUDA too: the debugging path, and the reference a graph must equal exactly.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack

import torch

from tt_serve.model.dtypes import torch_dtype
from tt_serve.model.interface import (
    PAD_BLOCK,
    StateCopy,
    StepBatch,
    StepOutput,
    StepRow,
    check_rows,
)
from tt_serve.model.precision import Precision
from tt_serve.model.ref.layers import cpu_bf16
from tt_serve.model.ref.plan import StepPlan
from tt_serve.model.resident import ResidentSlots
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch import units
from tt_serve.model.torch.memory import DeviceMemory, StepMemory
from tt_serve.model.torch.model import HybridModel
from tt_serve.model.torch.outputs import fill_logprobs, pick_on_device, pick_screened, screens
from tt_serve.model.torch.pending import PendingStep
from tt_serve.model.torch.pools import Pools
from tt_serve.model.tt.layout.table import checkpoint_dtypes

if TYPE_CHECKING:
    from tt_serve.config.serve_config import ServeConfig
    from tt_serve.model.torch.cuda.programs import GraphPrograms
    from tt_serve.model.torch.cuda.steps import StaticSteps

log = logging.getLogger(__name__)
DEFAULT_PREFILL_CHUNK = 256


class TorchOptions(TypedDict, total=False):
    """The torch backend's options, all optional (defaults in brackets)."""

    device: str | torch.device  # ["cpu"]
    dtype: str | torch.dtype  # [float32] or bfloat16
    cuda_graphs: bool  # [False] decode rows through the bucketed decode programs
    traced_prefill: bool  # [False] prefill chunks through the bucketed prefill programs
    device_resident: bool  # [False] greedy ids stay on the device for fed rows (cuda_graphs)
    max_prefill_chunk: int  # [DEFAULT_PREFILL_CHUNK] the largest prefill bucket
    max_model_len: int | None  # [None: the model's own] sizes the programs' block tables
    capture_graphs: bool  # [True] capture on CUDA (False: run the bucketed programs eagerly)
    screen_lm_head: bool  # [True] greedy / top-k picks through the int8 screen (CPU)
    precision: str | None  # [None] a weight profile: the card's stored values (CardStorage)


class TorchBackend:
    """Runs ``StepBatch``es on torch tensors; owns the KV pool and GDN state/snapshot slots.

    Tokens are picked on the device (argmax, or a ``RowSampling`` draw: ``torch/sampling.py``)
    and only the ids cross to the host; logits leave the device only for rows that ask for them
    (host sampling). ``host_bytes`` counts what crossed (ids, logprobs, logits).
    """

    max_device_top_k = 0  # any top-k, and rows without one, are drawn on the device

    def __init__(
        self,
        spec: ModelSpec,
        weights: dict[str, torch.Tensor],
        **options: Unpack[TorchOptions],
    ) -> None:
        self.cuda_graphs = options.get("cuda_graphs", False)
        self.traced_prefill = options.get("traced_prefill", False)
        self.device_resident = options.get("device_resident", False)
        if self.device_resident and not self.cuda_graphs:
            raise ValueError("device_resident needs cuda_graphs (the bucketed decode path)")
        self.spec = spec
        self.device = torch.device(options.get("device", "cpu"))
        self.dtype = torch_dtype(options.get("dtype", torch.float32))
        if self.dtype == torch.bfloat16 and self.device.type == "cpu" and not cpu_bf16():
            # Without AVX512-BF16 / AMX, torch's bf16 matmuls fall off oneDNN onto a scalar
            # path: the demo model's LM head takes 100 ms a token in bf16 against 10 in fp32.
            log.warning(
                "this CPU has no native bfloat16 matmul (AVX512-BF16 or AMX): --dtype bfloat16 "
                "runs about 10x slower than float32 here; use --dtype float32"
            )
        cast = {
            n: t if n.endswith(("A_log", "dt_bias")) else t.to(self.dtype)
            for n, t in weights.items()
        }
        profile = options.get("precision")
        self.model = HybridModel(
            spec,
            cast,
            self.device,
            screen=options.get("screen_lm_head", True),
            dtypes=None if profile is None else checkpoint_dtypes(spec, Precision.named(profile)),
        )
        self.pools: Pools | None = None
        self.max_prefill_chunk = options.get("max_prefill_chunk", DEFAULT_PREFILL_CHUNK)
        self.max_model_len = options.get("max_model_len")
        self.capture_graphs = options.get("capture_graphs", True)
        self.static: StaticSteps | None = None
        self.resident = ResidentSlots(self.device_resident)
        self.host_bytes = 0  # device -> host bytes of step results (ids, logprobs, logits)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, spec: ModelSpec | None = None, **options: Unpack[TorchOptions]
    ) -> TorchBackend:
        """Load a checkpoint folder (config.json + safetensors) in ``options["dtype"]``;
        ``spec`` is read from its config.json unless the caller already has it."""
        from tt_serve.model.weights import load_weights

        spec = spec or ModelSpec.from_hf_dir(path)
        options["dtype"] = torch_dtype(options.get("dtype", torch.float32))
        return cls(spec, load_weights(path, spec, dtype=options["dtype"]), **options)

    @classmethod
    def from_config(cls, cfg: ServeConfig, spec: ModelSpec, *, max_model_len: int) -> TorchBackend:
        """The backend ``cfg`` describes (the one mapping of config to torch options).

        CUDA graphs run only on a CUDA device, when traced prefill or device residency asks
        for them (both on by default there: ``ServeConfig.resolved_*``); device residency
        rides on the graphed decode path."""
        if cfg.model is None:
            raise ValueError("TorchBackend.from_config needs cfg.model (a checkpoint folder)")
        traced, resident = cfg.resolved_traced_prefill, cfg.resolved_device_resident
        graphs = torch.device(cfg.device).type == "cuda" and (traced or resident)
        return cls.from_pretrained(
            cfg.model,
            spec=spec,
            device=cfg.device,
            dtype=cfg.resolved_dtype,
            cuda_graphs=graphs,
            traced_prefill=graphs and traced,
            device_resident=graphs and resident,
            max_prefill_chunk=cfg.prefill_chunk,
            max_model_len=max_model_len,
            precision=None if cfg.precision == "auto" else cfg.precision,
        )

    def profile_step_memory(
        self, *, rows: int, tokens: int, block_size: int, memory: DeviceMemory
    ) -> StepMemory:
        """Bytes the device needs beyond the weights and pools to run steps: measured on a
        throwaway pool just big enough, freed again (called before ``allocate``;
        ``torch/launch.py`` sizes the real pool from it).

        ``eager``: one step of ``rows`` prefill rows sharing ``tokens`` run eagerly
        (activations, the LM head's logits for every row). ``graphs``: the largest decode
        bucket and the largest prefill bucket run once through their programs at the graphs'
        real table width (all-padding tables: the pool stays tiny, the gathers full size),
        which is what the captured graphs' shared memory pool holds."""
        if self.pools is not None:
            raise RuntimeError("profile_step_memory() runs before allocate()")
        rows = max(1, min(rows, tokens))
        lengths = [tokens // rows + (1 if i < tokens % rows else 0) for i in range(rows)]
        spans = [-(-n // block_size) for n in lengths]
        width = max(spans)
        first = list(itertools.accumulate([1, *spans]))  # block 0 is the padding block
        batch = StepBatch(
            tuple(
                StepRow(
                    seq_id=i,
                    token_ids=tuple(j % self.spec.vocab_size for j in range(n)),
                    start_pos=0,
                    block_table=tuple(range(first[i], first[i] + spans[i]))
                    + (PAD_BLOCK,) * (width - spans[i]),
                    state_slot=i,
                    sample=True,
                )
                for i, n in enumerate(lengths)
            )
        )
        host_bytes = self.host_bytes
        self.pools = Pools.allocate(
            self.spec,
            num_kv_blocks=first[-1],
            block_size=block_size,
            num_state_slots=rows,
            num_snapshot_slots=0,
            dtype=self.dtype,
            device=self.device,
        )
        try:
            memory.reset_peak()
            before = memory.allocated()
            self._eager(batch, list(range(rows)), StepOutput([None] * rows, [None] * rows))
            eager = max(0, memory.peak() - before)
            graphs = 0
            if self.cuda_graphs or self.traced_prefill:
                from tt_serve.model.torch.cuda.programs import GraphPrograms

                static = self._build_static(
                    self.pools,
                    first[-1],
                    rows,
                    programs=GraphPrograms(self.device, capture=False),
                    width=self._graph_width(block_size),
                    largest_only=True,
                )
                memory.reset_peak()
                before = memory.allocated()
                for key in static.programs.keys:
                    static.programs.run(key)
                graphs = max(0, memory.peak() - before)
            return StepMemory(eager, graphs)
        finally:
            self.pools = None
            self.host_bytes = host_bytes
            memory.release_cached()

    def allocate(
        self,
        *,
        num_kv_blocks: int,
        block_size: int,
        num_state_slots: int,
        num_snapshot_slots: int,
    ) -> None:
        if self.static is not None:
            raise RuntimeError("allocate() may run once with graphs: they hold the pool addresses")
        self.pools = Pools.allocate(
            self.spec,
            num_kv_blocks=num_kv_blocks,
            block_size=block_size,
            num_state_slots=num_state_slots,
            num_snapshot_slots=num_snapshot_slots,
            dtype=self.dtype,
            device=self.device,
        )
        if self.cuda_graphs or self.traced_prefill:
            self.static = self._build_static(self.pools, num_kv_blocks, num_state_slots)

    def _graph_width(self, block_size: int, num_kv_blocks: int | None = None) -> int:
        from tt_serve.model.torch.cuda.inputs import graph_width

        spec = self.spec
        max_len = min(
            self.max_model_len or spec.max_position_embeddings, spec.max_position_embeddings
        )
        return graph_width(max_len, block_size, num_kv_blocks)

    def _build_static(
        self,
        pools: Pools,
        num_kv_blocks: int,
        num_state_slots: int,
        *,
        programs: GraphPrograms | None = None,
        width: int | None = None,
        largest_only: bool = False,
    ) -> StaticSteps:
        """The bucketed programs over ``pools``: captured on CUDA unless ``programs`` says
        otherwise; ``width``: the tables' (default: ``_graph_width``); ``largest_only``: just
        the largest decode and prefill buckets (the memory profile)."""
        # The graph path builds on this package, so it is imported only when enabled.
        from tt_serve.config import GDN_CHUNK
        from tt_serve.model.buckets import prefill_buckets
        from tt_serve.model.torch.cuda.inputs import decode_buckets
        from tt_serve.model.torch.cuda.programs import GraphPrograms
        from tt_serve.model.torch.cuda.steps import StaticSteps

        spec = self.spec
        if width is None:
            width = self._graph_width(pools.block_size, num_kv_blocks)
        moe = any(spec.is_moe_layer(i) for i in range(spec.num_layers))
        capture = self.capture_graphs and self.device.type == "cuda" and not moe
        if self.device.type == "cuda" and moe and programs is None:
            # The MoE block picks its experts on the host (one sync): not capturable.
            log.warning("MoE model: bucketed programs run eagerly (no CUDA graph capture)")
        slot_ids = (  # every slot's last greedy id, the scratch slot's included
            torch.zeros(num_state_slots + 1, dtype=torch.long, device=self.device)
            if self.device_resident
            else None
        )
        dec = decode_buckets(num_state_slots) if self.cuda_graphs else ()
        pre = (
            prefill_buckets(self.max_prefill_chunk, GDN_CHUNK, unit="the GDN chunk")
            if self.traced_prefill
            else ()
        )
        if largest_only:
            dec, pre = dec[-1:], pre[-1:]
        return StaticSteps.build(
            self.model,
            pools,
            programs or GraphPrograms(self.device, capture=capture),
            decode_buckets=dec,
            prefill_buckets=pre,
            width=width,
            conv_state_len=spec.conv_state_len,
            slot_ids=slot_ids,
        )

    def _pools(self) -> Pools:
        if self.pools is None:
            raise RuntimeError("TorchBackend.allocate() must be called before execute()")
        return self.pools

    def execute(self, batch: StepBatch) -> StepOutput:
        return self.submit(batch).result()

    def submit(self, batch: StepBatch) -> PendingStep:
        """Launch a step; the greedy ids are read (blocking) only by ``result()``.

        Rows the bucketed programs hold run there (asynchronously on CUDA); the rest run
        eagerly before this returns. Raises ValueError, before any device work, for an empty
        row or a fed row this backend cannot feed (``check_rows``, ``ResidentSlots``)."""
        self._pools()
        rows = batch.rows
        out = StepOutput(token_ids=[None] * len(rows), logprobs=[None] * len(rows))
        check_rows(rows, max_device_top_k=self.max_device_top_k)
        self.resident.check(rows)
        if self.static is None:
            self._eager(batch, list(range(len(rows))), out)
            return PendingStep(out, rows, done=True)
        work, rest = self.static.assign(rows)
        for i in rest:
            if rows[i].fed:
                raise ValueError(
                    f"fed row for seq {rows[i].seq_id}, but no bucketed program holds the row"
                )
        if rest:
            self._eager(batch, rest, out)
        pending = self.static.launch(rows, work, out)
        self.host_bytes += pending.host_bytes
        pending.resident_slots = self.resident.launched(pending.resident_slots)
        return pending

    def _eager(self, batch: StepBatch, idx: list[int], out: StepOutput) -> None:
        """Run rows ``idx`` of the batch through the plan-driven path, results into ``out``."""
        pools = self._pools()
        all_rows = batch.rows
        rows = tuple(all_rows[i] for i in idx)
        with torch.no_grad():
            plan = StepPlan.build(StepBatch(rows), pools.block_size, self.device)
            sampled = [j for j, r in enumerate(rows) if r.sample]
            ends = list(itertools.accumulate(r.num_tokens for r in rows))
            # Only the sampled rows' last tokens leave the stack (``run_layers``' keep).
            last = self.model.hidden_states(plan, pools, [ends[j] - 1 for j in sampled])
            if not sampled:
                return
            head = self.model.lm_head.screened
            vocab = self.spec.vocab_size
            quick = (
                []
                if head is None
                else [n for n, j in enumerate(sampled) if screens(rows[j], vocab)]
            )
            if head is not None and quick:
                part = last if len(quick) == len(sampled) else last[quick]
                ids = pick_screened(head, part, [rows[sampled[n]] for n in quick])
                if ids is not None:
                    for n, tok in zip(quick, ids.tolist(), strict=True):
                        out.token_ids[idx[sampled[n]]] = int(tok)
                    self.host_bytes += ids.numel() * ids.element_size()
                    rest = sorted(set(range(len(sampled))) - set(quick))
                    if not rest:
                        return
                    last, sampled = last[rest], [sampled[n] for n in rest]
            self._full_head(last, [idx[j] for j in sampled], all_rows, out)

    def _full_head(
        self, last: torch.Tensor, at: list[int], all_rows: tuple[StepRow, ...], out: StepOutput
    ) -> None:
        """Rows ``at`` of the batch (hidden states ``last``) through the full fp32 LM head:
        host logits, device picks, logprobs."""
        logits = self.model.logits(last)  # [R, vocab] fp32
        picked = [n for n, i in enumerate(at) if not all_rows[i].want_logits]
        host = [n for n, i in enumerate(at) if all_rows[i].want_logits]
        if host:
            host_logits = logits[torch.tensor(host, device=self.device)].cpu().numpy()
            self.host_bytes += host_logits.nbytes
            for m, n in enumerate(host):
                out.logits[at[n]] = host_logits[m]
        if picked:
            g = logits
            if len(picked) < len(at):
                g = logits[torch.tensor(picked, device=self.device)]
            chosen = pick_on_device(g, [all_rows[at[n]] for n in picked])
            for n, tok in zip(picked, chosen.tolist(), strict=True):
                out.token_ids[at[n]] = int(tok)
            self.host_bytes += chosen.numel() * chosen.element_size()
            self.host_bytes += fill_logprobs(out, g, chosen, [at[n] for n in picked], all_rows)

    def execute_all_logits(self, batch: StepBatch) -> list[torch.Tensor]:
        """Run a step and return every row's logits at every position (fp32, on the host).

        For tests and debugging: same state updates as ``execute``, no sampling, always eager.
        """
        pools = self._pools()
        with torch.no_grad():
            plan = StepPlan.build(batch, pools.block_size, self.device)
            logits = self.model.logits(self.model.hidden_states(plan, pools)).cpu()
        offsets = [0]
        for r in batch.rows:
            offsets.append(offsets[-1] + r.num_tokens)
        return [logits[a:b] for a, b in itertools.pairwise(offsets)]

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        with torch.no_grad():
            self._pools().copy_states(ops)
        self.resident.forget(ops)

    def read_unit(self, blocks: Sequence[int], snapshot_slot: int) -> tuple[bytes, list[bytes]]:
        """``UnitIO`` (``torch/units.py``)."""
        return units.read_unit(self._pools(), blocks, snapshot_slot)

    def write_unit(
        self,
        blocks: Sequence[int],
        block_data: Sequence[bytes],
        snapshot_slot: int,
        snapshot: bytes | None,
    ) -> None:
        """``UnitIO`` (``torch/units.py``)."""
        units.write_unit(self._pools(), blocks, block_data, snapshot_slot, snapshot)

    def unit_nbytes(self) -> tuple[int, int]:
        """(bytes of one block's KV, bytes of one snapshot): the planner's unit size."""
        pools = self._pools()
        return units.block_nbytes(pools), units.snapshot_nbytes(pools)

    def close(self) -> None:
        """Nothing to release: the pools and graphs go with the object."""
