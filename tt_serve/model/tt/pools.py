"""Device pools owned by the ttnn backend (mirrors ``ref/pools.py``), allocated before any trace.

Per attention layer paged K and V ``[blocks, kv_heads, block_size, head_dim]`` (TILE, block 0 is
the padding block); per GDN layer conv history ``[slots, 1, K-1, C]`` and recurrent state
``[slots, Hv, dk, dv]`` (fp32), the same shapes again for snapshots, and the per-layer working
state a prefill replay runs on. Slot and snapshot copies are device-to-device: a static slice
of the source row and ``fill_cache`` into the destination row, so pool addresses never move.
"""

from __future__ import annotations

from dataclasses import dataclass

from tt_serve.model.interface import PAD_SLOT, CopyKind, StateCopy
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.ops import ROW_MAJOR, Ops, Tensor
from tt_serve.model.tt.precision import Precision


@dataclass
class DevicePools:
    block_size: int
    num_slots: int
    num_snapshots: int
    k: list[Tensor]
    v: list[Tensor]
    conv: list[Tensor]
    rec: list[Tensor]
    snap_conv: list[Tensor]
    snap_rec: list[Tensor]
    conv_work: list[Tensor]  # [1, K-1, C] ROW_MAJOR: the causal conv op's history layout
    rec_work: list[Tensor]  # [1, Hv, dk, dv]
    zero_conv: Tensor | None
    zero_rec: Tensor | None
    conv_shape: tuple[int, int, int]  # (1, K-1, C)
    rec_shape: tuple[int, int, int]  # (Hv, dk, dv)

    @staticmethod
    def allocate(
        ops: Ops,
        spec: ModelSpec,
        precision: Precision,
        *,
        num_kv_blocks: int,
        block_size: int,
        num_state_slots: int,
        num_snapshot_slots: int,
    ) -> DevicePools:
        if num_kv_blocks < 2 or num_state_slots < 2:
            raise ValueError("need at least 2 KV blocks and 2 state slots (index 0 is padding)")
        if block_size % 32:
            raise ValueError(f"ttnn stores KV in 32x32 tiles: block_size {block_size} % 32 != 0")
        kv = (num_kv_blocks, spec.num_kv_heads, block_size, spec.head_dim)
        conv = (1, spec.conv_state_len, spec.conv_dim)
        rec = (spec.linear_num_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim)
        cdt, rdt = precision.conv_state, precision.recurrent_state
        n_attn, n_gdn, snaps = spec.num_attention_layers, spec.num_gdn_layers, num_snapshot_slots
        return DevicePools(
            block_size=block_size,
            num_slots=num_state_slots,
            num_snapshots=snaps,
            k=[ops.zeros(kv, precision.kv_cache) for _ in range(n_attn)],
            v=[ops.zeros(kv, precision.kv_cache) for _ in range(n_attn)],
            conv=[ops.zeros((num_state_slots, *conv), cdt) for _ in range(n_gdn)],
            rec=[ops.zeros((num_state_slots, *rec), rdt) for _ in range(n_gdn)],
            snap_conv=[ops.zeros((snaps, *conv), cdt) for _ in range(n_gdn)] if snaps else [],
            snap_rec=[ops.zeros((snaps, *rec), rdt) for _ in range(n_gdn)] if snaps else [],
            conv_work=[ops.zeros((1, *conv[1:]), cdt, ROW_MAJOR) for _ in range(n_gdn)],
            rec_work=[ops.zeros((1, *rec), rdt) for _ in range(n_gdn)],
            zero_conv=ops.zeros((1, *conv), cdt) if n_gdn else None,
            zero_rec=ops.zeros((1, *rec), rdt) if n_gdn else None,
            conv_shape=conv,
            rec_shape=rec,
        )

    def _row(self, ops: Ops, pool: Tensor, i: int) -> Tensor:
        shape = list(pool.shape)
        return ops.slice(pool, [i] + [0] * (len(shape) - 1), [i + 1, *shape[1:]])

    def load_work(self, ops: Ops, slot: int) -> None:
        """Slot -> the working state a prefill replay runs on."""
        _, k1, c = self.conv_shape
        for conv, rec, cw, rw in zip(
            self.conv, self.rec, self.conv_work, self.rec_work, strict=True
        ):
            ops.copy(self._row(ops, rec, slot), rw)
            row = ops.reshape(self._row(ops, conv, slot), [1, k1, c])
            ops.copy(ops.to_row_major(row), cw)

    def store_work(self, ops: Ops, slot: int) -> None:
        """Working state -> slot, in place."""
        _, k1, c = self.conv_shape
        for conv, rec, cw, rw in zip(
            self.conv, self.rec, self.conv_work, self.rec_work, strict=True
        ):
            ops.fill_slot(rec, rw, slot)
            ops.fill_slot(conv, ops.reshape(ops.to_tile(cw), [1, 1, k1, c]), slot)

    def copy_states(self, ops: Ops, copies: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        for op in copies:
            if not 0 <= op.slot < self.num_slots or op.slot == PAD_SLOT:
                raise ValueError(f"{op}: state slot out of range 1..{self.num_slots - 1}")
            if op.kind != CopyKind.RESET and not 0 <= op.snapshot < self.num_snapshots:
                raise ValueError(f"{op}: snapshot slot out of range 0..{self.num_snapshots - 1}")
        for op in copies:
            for j in range(len(self.conv)):
                if op.kind == CopyKind.SAVE:
                    ops.fill_slot(
                        self.snap_conv[j], self._row(ops, self.conv[j], op.slot), op.snapshot
                    )
                    ops.fill_slot(
                        self.snap_rec[j], self._row(ops, self.rec[j], op.slot), op.snapshot
                    )
                elif op.kind == CopyKind.RESTORE:
                    ops.fill_slot(
                        self.conv[j], self._row(ops, self.snap_conv[j], op.snapshot), op.slot
                    )
                    ops.fill_slot(
                        self.rec[j], self._row(ops, self.snap_rec[j], op.snapshot), op.slot
                    )
                else:
                    assert self.zero_conv is not None and self.zero_rec is not None
                    ops.fill_slot(self.conv[j], self.zero_conv, op.slot)
                    ops.fill_slot(self.rec[j], self.zero_rec, op.slot)
