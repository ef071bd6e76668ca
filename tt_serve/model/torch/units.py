"""Resume-point units between the torch pools and host bytes (the tiers: ``cache/tiers.py``).

A unit is the KV of some blocks (every attention layer) and one GDN snapshot slot (every GDN
layer). The encoding is the same on CPU and CUDA, but the disk tier keeps their units apart (the
device kind is in its fingerprint, ``engine/cache_fingerprint.py``): their kernels compute other
bits, and a restored state must be the one a cold run on this device reaches. The encoding:

* a block: for each attention layer in order, K then V of that block
  (``[kv_heads, block_size, head_dim]`` in the pool's dtype), raw bytes;
* a snapshot: for each GDN layer in order, conv ``[conv_dim, K-1]`` then recurrent
  ``[Hv, dk, dv]`` state, fp32 raw bytes.

The bytes are the pool's bits, so a restored unit is the saved state exactly. On CUDA the host
side is pinned memory and the copies are non-blocking: a write is ordered on the stream before
the step that reads it and the host does not wait; a read waits for its own copy only (the
bytes are handed out at once; one gather and one copy per unit).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tt_serve.model.torch.pools import Pools


def _kv_layers(pools: Pools) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for k, v in zip(pools.k, pools.v, strict=True):
        out += [k, v]
    return out


def _snap_layers(pools: Pools) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for c, r in zip(pools.snap_conv, pools.snap_rec, strict=True):
        out += [c, r]
    return out


def block_nbytes(pools: Pools) -> int:
    """Bytes of one block's KV across every attention layer."""
    return sum(t[0].numel() * t.element_size() for t in _kv_layers(pools))


def snapshot_nbytes(pools: Pools) -> int:
    """Bytes of one snapshot across every GDN layer."""
    return sum(t[0].numel() * t.element_size() for t in _snap_layers(pools))


def _to_host(x: torch.Tensor) -> torch.Tensor:
    """``x`` (flat uint8) on the host; from CUDA through pinned memory, non-blocking."""
    if x.device.type != "cuda":
        return x
    host = torch.empty(x.shape, dtype=torch.uint8, pin_memory=True)
    host.copy_(x, non_blocking=True)
    torch.cuda.current_stream(x.device).synchronize()
    return host


def _raw(t: torch.Tensor) -> bytes:
    """A contiguous CPU tensor's bytes, copied by numpy: torch's own copies run on its
    intra-op thread pool, which on a busy CPU waits for the threads the step just used (a
    torch.cat of a unit measured 14 ms there against 0.1 ms alone)."""
    return t.view(torch.uint8).numpy().tobytes()


def read_unit(pools: Pools, blocks: Sequence[int], slot: int) -> tuple[bytes, list[bytes]]:
    """The snapshot in ``slot`` and the KV of ``blocks`` as bytes (module docstring)."""
    if pools.snap_rec and pools.snap_rec[0].device.type == "cpu":
        snapshot = b"".join(_raw(t[slot]) for t in _snap_layers(pools))
        layers = _kv_layers(pools)
        return snapshot, [b"".join(_raw(t[b]) for t in layers) for b in blocks]
    with torch.no_grad():
        snap = torch.cat([t[slot].reshape(-1).view(torch.uint8) for t in _snap_layers(pools)])
        parts = [snap]
        out: list[bytes] = []
        if blocks:
            layers = _kv_layers(pools)
            idx = torch.tensor(list(blocks), dtype=torch.long, device=layers[0].device)
            per = [t.index_select(0, idx).reshape(len(blocks), -1) for t in layers]
            kv = torch.cat([p.view(torch.uint8) for p in per], dim=1)  # [n, block bytes]
            parts.append(kv.reshape(-1))
        flat = _to_host(torch.cat(parts)).numpy()
        n_snap = snap.numel()
        snapshot = flat[:n_snap].tobytes()
        if blocks:
            size = (len(flat) - n_snap) // len(blocks)
            out = [
                flat[n_snap + i * size : n_snap + (i + 1) * size].tobytes()
                for i in range(len(blocks))
            ]
    return snapshot, out


def write_unit(
    pools: Pools,
    blocks: Sequence[int],
    block_data: Sequence[bytes],
    slot: int,
    snapshot: bytes | None,
) -> None:
    """Write ``block_data`` into ``blocks`` and ``snapshot`` (if any) into snapshot ``slot``.
    ValueError before any write when a payload does not have this pool's size."""
    per_block = block_nbytes(pools)
    if len(blocks) != len(block_data):
        raise ValueError(f"{len(block_data)} block payloads for {len(blocks)} blocks")
    bad = [len(d) for d in block_data if len(d) != per_block]
    if bad:
        raise ValueError(f"a block payload has {bad[0]} bytes, this pool's blocks {per_block}")
    if snapshot is not None and len(snapshot) != snapshot_nbytes(pools):
        raise ValueError(
            f"a snapshot payload has {len(snapshot)} bytes, this pool's {snapshot_nbytes(pools)}"
        )
    layers = _kv_layers(pools)
    device = layers[0].device if layers else pools.snap_rec[0].device
    if device.type == "cpu":  # numpy copies into the pools' memory (see ``_raw``)
        for b, data in zip(blocks, block_data, strict=True):
            _fill(layers, b, data)
        if snapshot is not None:
            _fill(_snap_layers(pools), slot, snapshot)
        return
    with torch.no_grad():
        if blocks:
            raw = _from_host(b"".join(block_data), device).reshape(len(blocks), per_block)
            idx = torch.tensor(list(blocks), dtype=torch.long, device=device)
            off = 0
            for t in layers:
                n = t[0].numel() * t.element_size()
                part = raw[:, off : off + n].contiguous().view(t.dtype)
                t.index_copy_(0, idx, part.reshape(len(blocks), *t.shape[1:]))
                off += n
        if snapshot is not None:
            raw = _from_host(snapshot, device)
            off = 0
            for t in _snap_layers(pools):
                n = t[0].numel() * t.element_size()
                t[slot].copy_(raw[off : off + n].view(t.dtype).reshape(t.shape[1:]))
                off += n


def _fill(layers: list[torch.Tensor], row: int, data: bytes) -> None:
    """Row ``row`` of each of ``layers`` in turn from consecutive slices of ``data``."""
    off = 0
    for t in layers:
        dst = t[row].view(torch.uint8).numpy()
        dst[...] = np.frombuffer(data, dtype=np.uint8, count=dst.size, offset=off).reshape(
            dst.shape
        )
        off += dst.size


def _from_host(data: bytes, device: torch.device) -> torch.Tensor:
    """``data`` as a flat uint8 tensor on ``device`` (CUDA: staged in pinned memory)."""
    host = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
