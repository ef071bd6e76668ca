"""Device pools owned by the ttnn backend (mirrors ``torch/pools.py``), allocated before any trace.

Per attention layer paged K and V ``[blocks, kv_heads, block_size, head_dim]`` (TILE, block 0 is
the padding block); per GDN layer conv history ``[slots, 1, K-1, C]`` and recurrent state
``[slots, Hv, dk, dv]`` (fp32), ``[snapshots, ...]`` again for snapshots, and the per-layer working
state a prefill replay runs on. Engine state slot s lives in row s of the state pools (idle
decode rows are masked, so no scratch slot is needed). Slot and snapshot copies are
device-to-device: a static slice of the source row and ``fill_cache`` into the destination row,
so pool addresses never move.
"""

from __future__ import annotations

from dataclasses import dataclass

from tt_serve.model.interface import CopyKind, StateCopy
from tt_serve.model.precision import Precision
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout import ROW_MAJOR
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops, Tensor


@dataclass
class DevicePools:
    block_size: int
    num_slots: int  # the engine's num_state_slots: the rows of every state pool
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
        tp: TensorParallel | None = None,
    ) -> DevicePools:
        """On a mesh (``tp``) every pool holds the chip's heads: KV heads, conv channels and
        recurrent value heads of ``parallel.TensorParallel`` (allocated replicated with the
        per-chip shape, as tt_transformers allocates its per-device KV caches), so a slot or
        snapshot copy runs on every chip's shard at once."""
        tp = tp or TensorParallel(spec, 1)
        if num_kv_blocks < 2 or num_state_slots < 1:
            raise ValueError("need at least 2 KV blocks (block 0 is padding) and 1 state slot")
        if block_size % 32:
            raise ValueError(f"ttnn stores KV in 32x32 tiles: block_size {block_size} % 32 != 0")
        kv = (num_kv_blocks, tp.kv_heads, block_size, spec.head_dim)
        conv = (1, spec.conv_state_len, tp.conv_dim)
        rec = (tp.v_heads, spec.linear_key_head_dim, spec.linear_value_head_dim)
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

    def row(self, slot: int) -> int:
        """The pool (and decode batch) row of engine state slot ``slot``: the slot itself."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"state slot {slot} outside 0..{self.num_slots - 1}")
        return slot

    def _slice_row(self, ops: Ops, pool: Tensor, i: int) -> Tensor:
        shape = list(pool.shape)
        return ops.slice(pool, [i] + [0] * (len(shape) - 1), [i + 1, *shape[1:]])

    def load_work(self, ops: Ops, slot: int) -> None:
        """Slot -> the working state a prefill replay runs on."""
        _, k1, c = self.conv_shape
        r = self.row(slot)
        for conv, rec, cw, rw in zip(
            self.conv, self.rec, self.conv_work, self.rec_work, strict=True
        ):
            ops.copy(self._slice_row(ops, rec, r), rw)
            history = ops.reshape(self._slice_row(ops, conv, r), [1, k1, c])
            ops.copy(ops.to_row_major(history), cw)

    def store_work(self, ops: Ops, slot: int) -> None:
        """Working state -> slot, in place."""
        _, k1, c = self.conv_shape
        r = self.row(slot)
        for conv, rec, cw, rw in zip(
            self.conv, self.rec, self.conv_work, self.rec_work, strict=True
        ):
            ops.fill_row(rec, rw, r)
            ops.fill_row(conv, ops.reshape(ops.to_tile(cw), [1, 1, k1, c]), r)

    def copy_states(self, ops: Ops, copies: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        for op in copies:
            if not 0 <= op.slot < self.num_slots:
                raise ValueError(f"{op}: state slot out of range 0..{self.num_slots - 1}")
            if op.kind != CopyKind.RESET and not 0 <= op.snapshot < self.num_snapshots:
                raise ValueError(f"{op}: snapshot slot out of range 0..{self.num_snapshots - 1}")
        for op in copies:
            r, snap = self.row(op.slot), op.snapshot  # snapshots are their own pool, from 0
            for j in range(len(self.conv)):
                if op.kind == CopyKind.SAVE:
                    ops.fill_row(self.snap_conv[j], self._slice_row(ops, self.conv[j], r), snap)
                    ops.fill_row(self.snap_rec[j], self._slice_row(ops, self.rec[j], r), snap)
                elif op.kind == CopyKind.RESTORE:
                    ops.fill_row(self.conv[j], self._slice_row(ops, self.snap_conv[j], snap), r)
                    ops.fill_row(self.rec[j], self._slice_row(ops, self.snap_rec[j], snap), r)
                else:
                    assert self.zero_conv is not None and self.zero_rec is not None
                    ops.fill_row(self.conv[j], self.zero_conv, r)
                    ops.fill_row(self.rec[j], self.zero_rec, r)
