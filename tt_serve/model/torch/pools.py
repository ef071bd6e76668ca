"""Device pools owned by the torch backend: paged KV, GDN state slots and GDN snapshot slots.

The state pools hold one slot more than the engine numbers (``0 .. num_state_slots - 1``): the
scratch slot ``scratch_slot`` = ``num_state_slots``, where the static-shape path's padding rows
run; no engine row and no state copy ever names it.

``TT_SERVE_FAULT_RESTORE_EVERY=N`` is a test hook (``bench/cache/prefix_hit_equivalence.py``
must catch it): one snapshot restore in N halves the restored recurrent state, a defect at rate 1/N. Which
ones is a function of the snapshot's bits (its CRC mod N), so the same requests meet the defect
however they interleave.
"""

from __future__ import annotations

import logging
import os
import zlib
from dataclasses import dataclass

import torch

from tt_serve.model.interface import CopyKind, StateCopy
from tt_serve.model.spec import ModelSpec

FAULT_ENV = "TT_SERVE_FAULT_RESTORE_EVERY"
log = logging.getLogger(__name__)


@dataclass
class Pools:
    """Per attention layer K and V ``[blocks, kv_heads, block_size, head_dim]``; per GDN layer
    conv ``[slots, conv_dim, K-1]`` and recurrent ``[slots, Hv, dk, dv]`` state (fp32), and the
    same shapes again for snapshots. Lists are indexed by the layer's rank among its kind."""

    block_size: int
    num_state_slots: int  # the engine's slots; the pools hold one more (the scratch slot)
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    conv: list[torch.Tensor]
    rec: list[torch.Tensor]
    snap_conv: list[torch.Tensor]
    snap_rec: list[torch.Tensor]
    fault_every: int = 0  # the test hook: one restore in n is perturbed; 0: none

    @staticmethod
    def allocate(
        spec: ModelSpec,
        *,
        num_kv_blocks: int,
        block_size: int,
        num_state_slots: int,
        num_snapshot_slots: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> Pools:
        if num_kv_blocks < 2 or num_state_slots < 1:
            raise ValueError("need at least 2 KV blocks (block 0 is padding) and 1 state slot")
        kv_shape = (num_kv_blocks, spec.num_kv_heads, block_size, spec.head_dim)
        conv_shape = (spec.conv_dim, spec.conv_state_len)
        rec_shape = (
            spec.linear_num_value_heads,
            spec.linear_key_head_dim,
            spec.linear_value_head_dim,
        )

        def zeros(*shape: int, dt: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dt, device=device)

        f32 = torch.float32
        fault_every = int(os.environ.get(FAULT_ENV) or 0)
        if fault_every:
            log.warning(
                "%s=%d: one GDN restore in %d is perturbed", FAULT_ENV, fault_every, fault_every
            )
        n_attn, n_gdn = spec.num_attention_layers, spec.num_gdn_layers
        slots = num_state_slots + 1  # + the scratch slot
        return Pools(
            block_size=block_size,
            num_state_slots=num_state_slots,
            k=[zeros(*kv_shape, dt=dtype) for _ in range(n_attn)],
            v=[zeros(*kv_shape, dt=dtype) for _ in range(n_attn)],
            conv=[zeros(slots, *conv_shape, dt=f32) for _ in range(n_gdn)],
            rec=[zeros(slots, *rec_shape, dt=f32) for _ in range(n_gdn)],
            snap_conv=[zeros(num_snapshot_slots, *conv_shape, dt=f32) for _ in range(n_gdn)],
            snap_rec=[zeros(num_snapshot_slots, *rec_shape, dt=f32) for _ in range(n_gdn)],
            fault_every=fault_every,
        )

    @property
    def scratch_slot(self) -> int:
        """The extra slot padding rows run in; also the engine's ``num_state_slots``."""
        return self.num_state_slots

    def copy_states(self, ops: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        num_slots = self.num_state_slots
        num_snaps = self.snap_conv[0].shape[0] if self.snap_conv else 0
        for op in ops:
            if not 0 <= op.slot < num_slots:
                raise ValueError(f"{op}: state slot out of range 0..{num_slots - 1}")
            if op.kind != CopyKind.RESET and not 0 <= op.snapshot < num_snaps:
                raise ValueError(f"{op}: snapshot slot out of range 0..{num_snaps - 1}")
            faulty = False
            if op.kind == CopyKind.RESTORE and self.fault_every and self.snap_rec:
                state = self.snap_rec[0][op.snapshot].cpu().numpy().tobytes()
                faulty = zlib.crc32(state) % self.fault_every == 0
            for conv, rec, sconv, srec in zip(
                self.conv, self.rec, self.snap_conv, self.snap_rec, strict=True
            ):
                if op.kind == CopyKind.SAVE:
                    sconv[op.snapshot].copy_(conv[op.slot])
                    srec[op.snapshot].copy_(rec[op.slot])
                elif op.kind == CopyKind.RESTORE:
                    conv[op.slot].copy_(sconv[op.snapshot])
                    rec[op.slot].copy_(srec[op.snapshot])
                    if faulty:
                        rec[op.slot].mul_(0.5)
                else:
                    conv[op.slot].zero_()
                    rec[op.slot].zero_()

    def zero_slot(self, slot: int) -> None:
        """Zero one state slot in every GDN layer (keeps the scratch slot's garbage bounded)."""
        for conv, rec in zip(self.conv, self.rec, strict=True):
            conv[slot].zero_()
            rec[slot].zero_()
