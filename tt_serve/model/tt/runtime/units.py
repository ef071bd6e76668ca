"""Resume-point units between the ttnn pools and host bytes (the tiers: ``cache/tiers.py``).

Mirrors ``torch/units.py``. A block's KV and a snapshot are moved as device tensors in their own
layout and dtype: a static slice of the pool row is read to the host as it is (TILE layout,
bfloat8_b still packed) and serialized by ``ttnn.dump_tensor``; a restore loads that tensor
onto the device (``load_tensor``, distributed over a mesh as it was read) and ``fill_cache``s
it into the row, as a snapshot restore does. No tilize, untilize or typecast on either path,
so a restored unit is the saved bits exactly, whatever the precision profile.

Encoding: a payload is a sequence of length-prefixed (``<Q``) dumps; a block holds K then V of
every attention layer in order, a snapshot conv then recurrent state of every GDN layer.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tt_serve.model.tt.ops import Ops, Tensor
from tt_serve.model.tt.runtime.pools import DevicePools


def _kv_layers(pools: DevicePools) -> list[Tensor]:
    out: list[Tensor] = []
    for k, v in zip(pools.k, pools.v, strict=True):
        out += [k, v]
    return out


def _snap_layers(pools: DevicePools) -> list[Tensor]:
    out: list[Tensor] = []
    for c, r in zip(pools.snap_conv, pools.snap_rec, strict=True):
        out += [c, r]
    return out


def _row(ops: Ops, pool: Tensor, i: int) -> Tensor:
    shape = list(pool.shape)
    return ops.slice(pool, [i] + [0] * (len(shape) - 1), [i + 1, *shape[1:]])


def _pack(parts: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(p)) + p for p in parts)


def _unpack(data: bytes, count: int) -> list[bytes]:
    out, off = [], 0
    while off < len(data):
        if off + 8 > len(data):
            raise ValueError("a unit payload ends inside a length prefix")
        (n,) = struct.unpack_from("<Q", data, off)
        out.append(data[off + 8 : off + 8 + n])
        off += 8 + n
    if off != len(data) or len(out) != count:
        raise ValueError(f"a unit payload holds {len(out)} tensors, this pool's {count}")
    return out


class UnitMover:
    """Reads and writes units of one backend's pools through a private scratch folder."""

    def __init__(self, ops: Ops) -> None:
        self._ops = ops
        self._dir = Path(tempfile.mkdtemp(prefix="tt-serve-units-"))
        self._n = 0

    def _scratch(self) -> Path:
        self._n += 1
        return self._dir / f"{os.getpid()}-{self._n}.tensorbin"

    def _dump(self, t: Tensor) -> bytes:
        return self._ops.tensor_bytes(t, self._scratch())

    def read(
        self, pools: DevicePools, blocks: Sequence[int], slot: int
    ) -> tuple[bytes, list[bytes]]:
        """The snapshot in ``slot`` and the KV of each of ``blocks`` as bytes."""
        if not 0 <= slot < pools.num_snapshots:
            raise ValueError(f"snapshot slot {slot} outside 0..{pools.num_snapshots - 1}")
        snapshot = _pack([self._dump(_row(self._ops, t, slot)) for t in _snap_layers(pools)])
        layers = _kv_layers(pools)
        out = [_pack([self._dump(_row(self._ops, t, b)) for t in layers]) for b in blocks]
        return snapshot, out

    def write(
        self,
        pools: DevicePools,
        blocks: Sequence[int],
        block_data: Sequence[bytes],
        slot: int,
        snapshot: bytes | None,
    ) -> None:
        """Write the payloads into ``blocks`` and snapshot ``slot``; ValueError for a payload
        that does not frame as this pool's tensors, before any write."""
        if len(blocks) != len(block_data):
            raise ValueError(f"{len(block_data)} block payloads for {len(blocks)} blocks")
        layers, snaps = _kv_layers(pools), _snap_layers(pools)
        parsed = [_unpack(d, len(layers)) for d in block_data]
        snap_parts = _unpack(snapshot, len(snaps)) if snapshot is not None else None
        if snap_parts is not None and not 0 <= slot < pools.num_snapshots:
            raise ValueError(f"snapshot slot {slot} outside 0..{pools.num_snapshots - 1}")
        for b, parts in zip(blocks, parsed, strict=True):
            for pool, part in zip(layers, parts, strict=True):
                self._fill(pool, part, b)
        if snap_parts is not None:
            for pool, part in zip(snaps, snap_parts, strict=True):
                self._fill(pool, part, slot)

    def _fill(self, pool: Tensor, data: bytes, row: int) -> None:
        t = self._ops.tensor_from_bytes(data, self._scratch())
        try:
            self._ops.fill_row(pool, t, row)
        finally:
            self._ops.deallocate(t)

    def close(self) -> None:
        for p in self._dir.glob("*"):
            p.unlink(missing_ok=True)
        self._dir.rmdir()
