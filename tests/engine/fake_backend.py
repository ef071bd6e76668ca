"""A torch-free backend for engine tests whose output depends on *both* the paged KV and the
GDN-like state, so a wrong block, a wrong restored snapshot or a skipped reset changes tokens.

Per token at position p: the token is written into KV block ``table[p // bs]`` at ``p % bs``
and the slot's state absorbs it (a chained hash). The sampled token mixes the state with a
digest of every KV entry in [0, end) read back through the block table.
"""

from __future__ import annotations

import hashlib

import numpy as np

from tt_serve.model.interface import (
    PAD_BLOCK,
    PAD_SLOT,
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
        self.state = np.zeros(num_state_slots, dtype=np.uint64)
        self.snap = np.zeros(num_snapshot_slots, dtype=np.uint64)

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        for op in ops:
            self.copies.append(op)
            assert op.slot != PAD_SLOT, "a request was given the padding state slot"
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
            assert row.state_slot != PAD_SLOT
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
                tok = int(np.argmax(logits))
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
