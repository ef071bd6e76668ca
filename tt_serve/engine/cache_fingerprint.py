"""The fingerprint that names a disk tier's folder (``cache/disk_store.py``).

The disk tier's folder is named by a fingerprint of everything that decides a unit's bits: the
checkpoint (config.json and, per weight file, its name, size and 64 KiB samples at 16 spread
offsets: a fine-tune of the same shapes changes them), the backend and its device kind (CPU and
CUDA kernels give other bits; on ttnn the mesh, which decides each chip's shard), the compute
dtype, the ttnn precision profile, the block size and the prefill chunk (the cut grid), and
tt-serve's version (kernels change between releases). A changed checkpoint, profile, device or
release therefore looks in another folder and never restores an old state. Reading the samples
costs a few milliseconds of I/O at start, not a pass over the weights.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

from tt_serve.config.serve_config import ServeConfig

_SAMPLES, _SAMPLE_BYTES = 16, 64 << 10


def _release() -> str:
    """The installed tt-serve's version ("" from a bare source tree)."""
    try:
        return importlib.metadata.version("tt-serve")
    except importlib.metadata.PackageNotFoundError:
        return ""


def checkpoint_fingerprint(cfg: ServeConfig, model_id: str) -> bytes:
    """16 bytes naming the checkpoint, backend, device kind or mesh, release, dtype, precision
    and cut grid (docstring)."""
    h = hashlib.blake2b(digest_size=16)
    from tt_serve.config.serve_config import mesh_shape

    ttnn = cfg.backend == "ttnn"
    parts = (
        model_id,
        cfg.backend,
        "x".join(map(str, mesh_shape(cfg))) if ttnn else cfg.device.split(":")[0],
        _release(),
        cfg.resolved_dtype,
        cfg.resolved_precision if ttnn or cfg.precision != "auto" else "",
        str(cfg.block_size),
        str(cfg.prefill_chunk),
        cfg.resume_points,
    )
    h.update("\0".join(parts).encode())
    root = Path(cfg.model) if cfg.model else None
    if root is not None and root.is_dir():
        config = root / "config.json"
        if config.exists():
            h.update(config.read_bytes())
        for f in sorted(root.glob("*.safetensors")):
            size = f.stat().st_size
            h.update(f"{f.name}:{size};".encode())
            with f.open("rb") as fh:
                for i in range(_SAMPLES):
                    fh.seek(size * i // _SAMPLES)
                    h.update(fh.read(_SAMPLE_BYTES))
    return h.digest()
