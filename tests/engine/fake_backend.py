"""A torch-free backend for engine tests whose output depends on *both* the paged KV and the
GDN-like state, so a wrong block, a wrong restored snapshot or a skipped reset changes tokens.

Per token at position p: the token is written into KV block ``table[p // bs]`` at ``p % bs``
and the slot's state absorbs it (a chained hash). The sampled token mixes the state with a
digest of every KV entry in [0, end) read back through the block table.

``PipelinedFakeBackend`` adds ``submit``: the "device" runs a step when it is submitted (in
order, as real devices do) and keeps each slot's last device-picked id, which fed rows read;
the host sees the ids only through ``result()``, which must be called in submission order.
Every rule of the pipelining contract in ``model/interface`` is asserted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numpy as np

from tt_serve.engine.sampler import draw
from tt_serve.model.interface import (
    PAD_BLOCK,
    CopyKind,
    StateCopy,
    StepBatch,
    StepOutput,
)


def _h(*parts: int) -> int:
    b = b"".join(int(p).to_bytes(8, "little", signed=False) for p in parts)
    return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")


class FakeBackend:
    def __init__(self, vocab: int = 1000, fail_on: set[int] | None = None) -> None:
        self.vocab = vocab
        self.fail_on = fail_on or set()
        self.calls = 0
        self.copies: list[StateCopy] = []
        self.batches: list[StepBatch] = []

    def allocate(
        self, *, num_kv_blocks: int, block_size: int, num_state_slots: int, num_snapshot_slots: int
    ) -> None:
        self.bs = block_size
        self.kv = np.full((num_kv_blocks, block_size), -1, dtype=np.int64)
        self.num_state_slots = num_state_slots
        self.state = np.zeros(num_state_slots, dtype=np.uint64)
        self.snap = np.zeros(num_snapshot_slots, dtype=np.uint64)

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        for op in ops:
            self.copies.append(op)
            assert 0 <= op.slot < self.num_state_slots, f"state slot {op.slot} out of range"
            if op.kind is CopyKind.SAVE:
                self.snap[op.snapshot] = self.state[op.slot]
            elif op.kind is CopyKind.RESTORE:
                self.state[op.slot] = self.snap[op.snapshot]
            else:
                self.state[op.slot] = 0

    def _logits(self, mix: int) -> np.ndarray:
        rng = np.random.default_rng(mix % (2**63))
        return rng.standard_normal(self.vocab).astype(np.float32) * 3.0

    def execute(self, batch: StepBatch) -> StepOutput:
        self.calls += 1
        self.batches.append(batch)
        if self.calls in self.fail_on:
            raise RuntimeError(f"injected failure on execute #{self.calls}")
        out = StepOutput(token_ids=[], logprobs=[])
        for i, row in enumerate(batch.rows):
            assert 0 <= row.state_slot < self.num_state_slots, "state slot out of range"
            assert not row.fed, "a fed row reached a backend that is not device-resident"
            st = int(self.state[row.state_slot])
            for k, tok in enumerate(row.token_ids):
                p = row.start_pos + k
                blk = row.block_table[p // self.bs]
                assert blk != PAD_BLOCK, f"write to the padding block at position {p}"
                self.kv[blk, p % self.bs] = tok
                st = _h(st, tok)
            self.state[row.state_slot] = st
            if not row.sample:
                out.token_ids.append(None)
                out.logprobs.append(None)
                continue
            end = row.end_pos
            kvsum = 0
            for p in range(end):
                v = int(self.kv[row.block_table[p // self.bs], p % self.bs])
                assert v >= 0, f"read of unwritten KV at position {p}"
                kvsum = _h(kvsum, v, p)
            logits = self._logits(_h(st, kvsum))
            if row.want_logits:
                out.token_ids.append(None)
                out.logits[i] = logits
                out.logprobs.append(None)
            else:
                tok = int(np.argmax(logits)) if row.sampling is None else draw(logits, row.sampling)
                out.token_ids.append(tok)
                if row.top_logprobs:
                    x = logits.astype(np.float64)
                    lp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
                    top = np.argsort(-lp)[: row.top_logprobs]
                    d = {int(t): float(lp[t]) for t in top}
                    d[tok] = float(lp[tok])
                    out.logprobs.append(d)
                else:
                    out.logprobs.append(None)
        return out

    def close(self) -> None:
        self.closed = True


@dataclass
class FakePending:
    number: int
    output: StepOutput
    error: Exception | None
    owner: PipelinedFakeBackend
    resident_slots: frozenset[int] = field(default_factory=frozenset)
    read: bool = False

    def result(self) -> StepOutput:
        if not self.read:
            unread = self.owner.unread
            assert unread and unread[0] == self.number, "results read out of submission order"
            unread.pop(0)
            self.read = True
        if self.error is not None:
            raise self.error
        return self.output


class PipelinedFakeBackend(FakeBackend):
    device_resident = True

    def __init__(
        self,
        vocab: int = 1000,
        fail_on: set[int] | None = None,
        fail_read_on: set[int] | None = None,
    ) -> None:
        super().__init__(vocab, fail_on)
        self.fail_read_on = fail_read_on or set()
        self.dev_ids: dict[int, int] = {}  # slot -> the last device-picked id, "on the device"
        self.resident: frozenset[int] = frozenset()
        self.submitted = 0
        self.unread: list[int] = []  # submitted, not yet read, in order
        self.max_in_flight = 0
        self.fed_rows = 0

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        super().copy_states(ops)
        touched = {op.slot for op in ops if op.kind is not CopyKind.SAVE}
        self.resident = self.resident - touched

    def execute(self, batch: StepBatch) -> StepOutput:
        return self.submit(batch).result()

    def submit(self, batch: StepBatch) -> FakePending:
        self.submitted += 1
        rows = []
        for row in batch.rows:
            if row.fed:
                assert row.state_slot in self.resident, (
                    f"fed row for slot {row.state_slot}, not resident after the last step"
                )
                row = replace(row, token_ids=(self.dev_ids[row.state_slot],), fed=False)
                self.fed_rows += 1
            rows.append(row)
        try:
            out = super().execute(StepBatch(tuple(rows)))
        except Exception:
            self.resident = frozenset()
            raise
        self.unread.append(self.submitted)
        self.max_in_flight = max(self.max_in_flight, len(self.unread))
        resident = set()
        for row, tok in zip(rows, out.token_ids, strict=True):
            if tok is not None:
                self.dev_ids[row.state_slot] = tok
                resident.add(row.state_slot)
        self.resident = frozenset(resident)
        err = None
        if self.submitted in self.fail_read_on:
            err = RuntimeError(f"injected read failure on step #{self.submitted}")
        return FakePending(self.submitted, out, err, self, self.resident)
