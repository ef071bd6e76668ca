"""TorchBackend: the reference implementation of the Backend protocol (CPU, or CUDA).

Default: every step runs eagerly through ``StepPlan`` (any shape, any mix of rows). Opt-in
(keyword-only, off by default so CPU behaviour is unchanged): ``cuda_graphs`` runs decode rows
through per-batch-bucket programs and ``traced_prefill`` runs prefill chunks through per-length
bucket programs, both over persistent input buffers, captured as CUDA graphs after the pools are
allocated (on CPU the same programs run eagerly through the same buffers: the testable twin);
``device_resident`` keeps each slot's last greedy id on the device, where the next decode
step's ``FED_TOKEN`` rows read it. Rows no bucket holds run eagerly in the same step. ``capture_graphs=False`` runs
the bucketed programs eagerly on CUDA too: the debugging path, and the reference a graph must
equal exactly.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from tt_serve.model.dtypes import resolve_dtype
from tt_serve.model.interface import (
    FED_TOKEN,
    CopyKind,
    StateCopy,
    StepBatch,
    StepOutput,
    StepRow,
)
from tt_serve.model.ref.buckets import decode_buckets, prefill_buckets
from tt_serve.model.ref.graphs import GraphRunner
from tt_serve.model.ref.model import HybridModel
from tt_serve.model.ref.outputs import fill_logprobs
from tt_serve.model.ref.plan import StepPlan
from tt_serve.model.ref.pools import Pools
from tt_serve.model.ref.static_steps import PendingStep, StaticSteps
from tt_serve.model.spec import ModelSpec

log = logging.getLogger(__name__)
DEFAULT_PREFILL_CHUNK = 256


class TorchBackend:
    """Runs ``StepBatch``es on torch tensors; owns the KV pool and GDN state/snapshot slots.

    Greedy tokens are chosen on the device (argmax) and only the ids cross to the host; logits
    leave the device only for rows that ask for them (host sampling).
    """

    def __init__(
        self,
        spec: ModelSpec,
        weights: dict[str, torch.Tensor],
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = torch.float32,
        cuda_graphs: bool = False,
        traced_prefill: bool = False,
        device_resident: bool = False,
        max_prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        max_model_len: int | None = None,
        capture_graphs: bool = True,
    ) -> None:
        if device_resident and not cuda_graphs:
            raise ValueError("device_resident needs cuda_graphs (the bucketed decode path)")
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype)
        cast = {
            n: t if n.endswith(("A_log", "dt_bias")) else t.to(self.dtype)
            for n, t in weights.items()
        }
        self.model = HybridModel(spec, cast, self.device)
        self.pools: Pools | None = None
        self.cuda_graphs = cuda_graphs
        self.traced_prefill = traced_prefill
        self.device_resident = device_resident
        self.max_prefill_chunk = max_prefill_chunk
        self.max_model_len = max_model_len
        self.capture_graphs = capture_graphs
        self.static: StaticSteps | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: str = "float32",
        cuda_graphs: bool = False,
        traced_prefill: bool = False,
        device_resident: bool = False,
        max_prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        max_model_len: int | None = None,
        capture_graphs: bool = True,
    ) -> TorchBackend:
        """Load a checkpoint folder (config.json + safetensors) in ``dtype`` (float32 | bfloat16)."""
        from tt_serve.model.weights import load_weights

        spec = ModelSpec.from_hf_dir(path)
        tdtype = resolve_dtype(dtype)
        return cls(
            spec,
            load_weights(path, spec, dtype=tdtype),
            device=device,
            dtype=tdtype,
            cuda_graphs=cuda_graphs,
            traced_prefill=traced_prefill,
            device_resident=device_resident,
            max_prefill_chunk=max_prefill_chunk,
            max_model_len=max_model_len,
            capture_graphs=capture_graphs,
        )

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

    def _build_static(self, pools: Pools, num_kv_blocks: int, num_state_slots: int) -> StaticSteps:
        spec = self.spec
        max_len = min(
            self.max_model_len or spec.max_position_embeddings, spec.max_position_embeddings
        )
        width = min(-(-max_len // pools.block_size), num_kv_blocks - 1)
        moe = any(spec.is_moe_layer(i) for i in range(spec.num_layers))
        capture = self.capture_graphs and self.device.type == "cuda" and not moe
        if self.device.type == "cuda" and moe:
            # The MoE block picks its experts on the host (one sync): not capturable.
            log.warning("MoE model: bucketed programs run eagerly (no CUDA graph capture)")
        slot_ids = (
            torch.zeros(num_state_slots, dtype=torch.long, device=self.device)
            if self.device_resident
            else None
        )
        return StaticSteps.build(
            self.model,
            pools,
            GraphRunner(self.device, capture=capture),
            decode_buckets=decode_buckets(num_state_slots - 1) if self.cuda_graphs else (),
            prefill_buckets=prefill_buckets(self.max_prefill_chunk) if self.traced_prefill else (),
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
        eagerly before this returns. The next step may be submitted before this one is read;
        with deviceResident its ``FED_TOKEN`` rows then take this step's ids on the device."""
        self._pools()
        rows = batch.rows
        out = StepOutput(token_ids=[None] * len(rows), logprobs=[None] * len(rows))
        for r in rows:
            if r.num_tokens == 0:
                raise ValueError(f"row for seq {r.seq_id} has no tokens")
        if self.static is None:
            _no_fed_rows(rows, range(len(rows)), "this backend is not device-resident")
            self._eager(batch, list(range(len(rows))), out)
            return PendingStep(out, rows, done=True)
        multi = [i for i, r in enumerate(rows) if r.num_tokens > 1]
        _no_fed_rows(rows, multi, "only single-token decode rows can be fed on the device")
        work, rest = self.static.plan(rows)
        _no_fed_rows(rows, rest, "no bucketed program holds the row")
        if rest:
            self._eager(batch, rest, out)
        return self.static.launch(rows, work, out)

    def _eager(self, batch: StepBatch, idx: list[int], out: StepOutput) -> None:
        """Run rows ``idx`` of the batch through the plan-driven path, results into ``out``."""
        pools = self._pools()
        all_rows = batch.rows
        rows = tuple(all_rows[i] for i in idx)
        with torch.no_grad():
            plan = StepPlan.build(StepBatch(rows), pools.block_size, self.device)
            hidden = self.model.hidden_states(plan, pools)
            sampled = [j for j, r in enumerate(rows) if r.sample]
            if not sampled:
                return
            last = plan.last_tokens[torch.tensor(sampled, device=self.device)]
            logits = self.model.logits(hidden[last])  # [R, vocab] fp32
            greedy = [n for n, j in enumerate(sampled) if not rows[j].want_logits]
            host = [n for n, j in enumerate(sampled) if rows[j].want_logits]
            if host:
                host_logits = logits[torch.tensor(host, device=self.device)].cpu().numpy()
                for m, n in enumerate(host):
                    out.logits[idx[sampled[n]]] = host_logits[m]
            if greedy:
                g = logits[torch.tensor(greedy, device=self.device)]
                chosen = g.argmax(dim=-1)
                for n, tok in zip(greedy, chosen.tolist(), strict=True):
                    out.token_ids[idx[sampled[n]]] = int(tok)
                fill_logprobs(out, g, chosen, [idx[sampled[n]] for n in greedy], all_rows)

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
        if self.static is not None:
            self.static.forget({op.slot for op in ops if op.kind is not CopyKind.SAVE})


def _no_fed_rows(rows: tuple[StepRow, ...], idx: Iterable[int], why: str) -> None:
    for i in idx:
        if FED_TOKEN in rows[i].token_ids:
            raise ValueError(
                f"row for seq {rows[i].seq_id} carries the device-resident placeholder token, "
                f"but {why}"
            )
