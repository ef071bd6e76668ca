"""Helpers that drive a TorchBackend the way the engine does (block tables, slots, chunks)."""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from tt_serve.model.interface import PAD_BLOCK, StepBatch, StepRow
from tt_serve.model.torch.backend import TorchBackend

BLOCK = 16
WIDTH = 48  # block-table width: 768 positions


def backend(path: Path, *, blocks: int = 6 * WIDTH + 1, slots: int = 8) -> TorchBackend:
    be = TorchBackend.from_pretrained(path)
    be.allocate(num_kv_blocks=blocks, block_size=BLOCK, num_state_slots=slots, num_snapshot_slots=4)
    return be


def table(seq: int) -> tuple[int, ...]:
    """A distinct, non-contiguous block table per sequence index (reversed to catch mix-ups)."""
    first = 1 + seq * WIDTH
    return tuple(reversed(range(first, first + WIDTH)))


def row(
    seq: int,
    ids: list[int],
    start: int,
    *,
    slot: int | None = None,
    sample: bool = True,
    **kw: object,
) -> StepRow:
    return StepRow(
        seq_id=seq,
        token_ids=tuple(ids),
        start_pos=start,
        block_table=table(seq),
        state_slot=seq + 1 if slot is None else slot,
        sample=sample,
        **kw,  # type: ignore[arg-type]
    )


def pad_row(seq_id: int = -1) -> StepRow:
    return StepRow(seq_id, (0,), 0, (PAD_BLOCK,) * WIDTH, 0, sample=True)


def prefill_logits(
    be: TorchBackend, seq: int, ids: list[int], splits: list[int], *, slot: int | None = None
) -> torch.Tensor:
    """Prefill ``ids`` in chunks cut at ``splits``; return logits at every position."""
    cuts = [0, *splits, len(ids)]
    parts = [
        be.execute_all_logits(StepBatch((row(seq, ids[a:b], a, slot=slot),)))[0]
        for a, b in itertools.pairwise(cuts)
    ]
    return torch.cat(parts)


def greedy_continue(
    be: TorchBackend, seq: int, ids: list[int], first: int, n: int, *, slot: int | None = None
) -> list[int]:
    """Decode ``n`` greedy tokens after a prefilled prompt whose next token is ``first``."""
    out = [first]
    while len(out) < n:
        pos = len(ids) + len(out) - 1
        res = be.execute(StepBatch((row(seq, [out[-1]], pos, slot=slot),)))
        tok = res.token_ids[0]
        assert tok is not None
        out.append(tok)
    return out


def prompt(n: int, seed: int, vocab: int = 4096) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()
