"""TTBackend: the Backend protocol on a Tenstorrent device through ttnn (mirrors ``ref/backend``).

``allocate`` creates every pool and persistent buffer, then warms and captures one prefill trace
per bucket and one decode trace, before any request runs: a prefix hit (a warm tail of any
length) therefore always finds a captured bucket and never falls back to an eager path.
``execute`` runs the step's single-token rows as one batched decode replay (row = state slot) and
each multi-token row as one prefill replay, reads the device-argmax ids (uint32) and, only for
rows that ask, the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tt_serve.engine.sampler import top_logprobs
from tt_serve.model.interface import StateCopy, StepBatch, StepOutput, StepRow
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.buffers import InputBuffers
from tt_serve.model.tt.device import parse_device_ids
from tt_serve.model.tt.model import TTModel
from tt_serve.model.tt.ops import Ops
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
        self._fed: dict[int, int] = {}  # slot -> id the last decode replay left on the device
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
            ops, idle_dec, act=act, rows=num_state_slots, vocab=vocab
        )
        self.decode_bufs.write(ops, idle_dec)
        dec = self.decode_bufs
        self.programs.add(("decode", num_state_slots), partial(self.model.decode, dec, pools))
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
            num_slots=self.pools.num_slots,
            width=self.width,
            head_dim=s.head_dim,
            rotary_dim=s.rotary_dim,
            theta=s.rope_theta,
            num_v_heads=s.linear_num_value_heads,
        )

    def _pools(self) -> DevicePools:
        if self.pools is None:
            raise RuntimeError("TTBackend.allocate() must be called before execute()")
        return self.pools

    # ---- steps ----------------------------------------------------------------------------
    def execute(self, batch: StepBatch) -> StepOutput:
        pools = self._pools()
        rows = batch.rows
        out = StepOutput(token_ids=[None] * len(rows), logprobs=[None] * len(rows))
        decode = [i for i, r in enumerate(rows) if r.num_tokens == 1]
        if decode:
            self._decode(rows, decode, out)
        for i, row in enumerate(rows):
            if row.num_tokens == 0:
                raise ValueError(f"row for seq {row.seq_id} has no tokens")
            if row.num_tokens > 1:
                self._prefill(row, i, out, pools)
        return out

    def _prefill(self, row: StepRow, i: int, out: StepOutput, pools: DevicePools) -> None:
        bucket = choose_bucket(row.num_tokens, self.buckets)
        bufs = self.prefill_bufs[bucket]
        pools.load_work(self.ops, row.state_slot)
        bufs.write(self.ops, self._prefill_values(row, bucket))
        self.programs.run(("prefill", bucket))
        pools.store_work(self.ops, row.state_slot)
        if row.sample:
            self._collect(bufs, [(i, 0, row)], out)

    def _decode(self, rows: tuple[StepRow, ...], idx: list[int], out: StepOutput) -> None:
        assert self.decode_bufs is not None and self.pools is not None
        bufs, dec_rows = self.decode_bufs, [rows[i] for i in idx]
        values = self._decode_values(dec_rows)
        # deviceResident: when every row continues from the id the last decode replay produced,
        # step n's output buffer feeds step n+1 on the device and only positions/tables upload.
        fed = self.device_resident and all(
            self._fed.get(r.state_slot) == r.token_ids[0] for r in dec_rows
        )
        if fed:
            self.ops.copy(bufs.out_ids, bufs.ids)
            self.device_fed_decodes += 1
        bufs.write(self.ops, values, skip=("ids",) if fed else ())
        self.programs.run(("decode", self.pools.num_slots))
        picks = [(i, rows[i].state_slot, rows[i]) for i in idx if rows[i].sample]
        ids = self._collect(bufs, picks, out)
        self._fed = (
            {r.state_slot: int(ids[r.state_slot]) for _, _, r in picks if not r.want_logits}
            if ids is not None
            else {}
        )

    def _collect(
        self, bufs: InputBuffers, picks: list[tuple[int, int, StepRow]], out: StepOutput
    ) -> np.ndarray | None:
        """Read ids (and logits only if a row needs them) for (row index, buffer row, row)."""
        if not picks:
            return None
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
        return ids

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        self._pools().copy_states(self.ops, ops)
        self._fed = {}

    def close(self) -> None:
        self.programs.release()
        self.ops.close_device()
