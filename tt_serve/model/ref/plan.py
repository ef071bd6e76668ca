"""StepPlan: a StepBatch turned into device index tensors once per step, shared by all layers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tt_serve.model.interface import StepBatch, blocks_needed, check_rows


def as_index(offsets: Sequence[int], device: torch.device) -> torch.Tensor | slice:
    """Batch offsets as an index of the token dimension: a slice (the layers then take views,
    not gathered copies) when they are contiguous, else a long tensor."""
    start = offsets[0] if offsets else 0
    if list(offsets) == list(range(start, start + len(offsets))):
        return slice(start, start + len(offsets))
    return torch.tensor(list(offsets), dtype=torch.long, device=device)


@dataclass(frozen=True)
class RowSpan:
    """A multi-token row (prefill chunk): its tokens are ``[offset, offset + n)`` of the batch."""

    offset: int
    n: int
    start_pos: int
    slot: int
    block_table: torch.Tensor  # [blocks covering end_pos] long


@dataclass(frozen=True)
class StepPlan:
    token_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    kv_blocks: torch.Tensor  # [T] physical block each token's K/V is written to
    kv_offsets: torch.Tensor  # [T] offset inside that block
    spans: tuple[RowSpan, ...]  # rows with more than one token, run one by one
    # [B] batch offsets of single-token rows, run together: a slice when they are contiguous
    # (every decode-only step), so the layers take views rather than gathered copies
    dec_tokens: torch.Tensor | slice
    dec_slots: torch.Tensor  # [B] their GDN state slots
    dec_tables: torch.Tensor  # [B, W] their block tables, cut to the longest row's blocks
    dec_lens: torch.Tensor  # [B] their end positions (attention length)
    last_tokens: torch.Tensor | slice  # [R] batch offset of every row's last token (ditto)
    # [3, R] long on the CPU: every row's batch offset, token count and GDN state slot, the
    # C kernel's one view of the step (native_layers.c's tt_gdn); None in a plan made by hand (the
    # CUDA graph path's), whose GDN layers run the torch kernels
    seqs: torch.Tensor | None = None

    @staticmethod
    def build(batch: StepBatch, block_size: int, device: torch.device) -> StepPlan:
        ids: list[int] = []
        pos: list[int] = []
        blocks: list[int] = []
        spans: list[RowSpan] = []
        dec_tok: list[int] = []
        dec_slot: list[int] = []
        dec_tab: list[tuple[int, ...]] = []
        dec_len: list[int] = []
        last: list[int] = []
        seqs: list[tuple[int, int, int]] = []
        check_rows(batch.rows)
        for row in batch.rows:
            off, n = len(ids), row.num_tokens
            need = blocks_needed(row, block_size)
            ids.extend(row.token_ids)
            p = range(row.start_pos, row.end_pos)
            pos.extend(p)
            blocks.extend(row.block_table[i // block_size] for i in p)
            last.append(off + n - 1)
            seqs.append((off, n, row.state_slot))
            if n == 1:
                dec_tok.append(off)
                dec_slot.append(row.state_slot)
                dec_tab.append(row.block_table[:need])
                dec_len.append(row.end_pos)
            else:
                table = torch.tensor(row.block_table[:need], dtype=torch.long, device=device)
                spans.append(RowSpan(off, n, row.start_pos, row.state_slot, table))
        width = max((len(t) for t in dec_tab), default=0)
        padded = [list(t) + [0] * (width - len(t)) for t in dec_tab]

        def lt(v: list[int]) -> torch.Tensor:
            return torch.tensor(v, dtype=torch.long, device=device)

        return StepPlan(
            token_ids=lt(ids),
            positions=lt(pos),
            kv_blocks=lt(blocks),
            kv_offsets=lt([q % block_size for q in pos]),
            spans=tuple(spans),
            dec_tokens=as_index(dec_tok, device),
            dec_slots=lt(dec_slot),
            dec_tables=torch.tensor(padded, dtype=torch.long, device=device).reshape(
                len(dec_tab), width
            ),
            dec_lens=lt(dec_len),
            last_tokens=as_index(last, device),
            seqs=torch.tensor(seqs, dtype=torch.long).reshape(-1, 3).T.contiguous(),
        )

    @property
    def num_decode(self) -> int:
        return int(self.dec_slots.shape[0])
