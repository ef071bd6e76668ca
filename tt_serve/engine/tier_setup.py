"""The prefix cache's host and disk tiers from the configuration (``cache/tiers.py``).

The disk tier's folder is named by a fingerprint of everything that decides a unit's bits: the
checkpoint (config.json and, per weight file, its name, size and 64 KiB samples at 16 spread
offsets: a fine-tune of the same shapes changes them), the backend, the compute dtype, the ttnn
precision profile, the block size and the prefill chunk (the cut grid). A changed checkpoint or
profile therefore looks in another folder and never restores an old state. Reading the samples
costs a few milliseconds of I/O at start, not a pass over the weights.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from tt_serve.cache.disk_store import DiskStore, DiskStoreError
from tt_serve.cache.host_tier import HostTier
from tt_serve.cache.tiers import Tiers
from tt_serve.config.serve_config import ServeConfig

log = logging.getLogger(__name__)

GIB = 1 << 30
_SAMPLES, _SAMPLE_BYTES = 16, 64 << 10


def checkpoint_fingerprint(cfg: ServeConfig, model_id: str) -> bytes:
    """16 bytes naming the checkpoint, backend, dtype, precision and cut grid (docstring)."""
    h = hashlib.blake2b(digest_size=16)
    parts = (
        model_id,
        cfg.backend,
        cfg.resolved_dtype,
        cfg.resolved_precision if cfg.backend == "ttnn" else "",
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


def build_tiers(cfg: ServeConfig, model_id: str) -> Tiers | None:
    """The tiers ``cfg`` asks for, or None. A disk folder that cannot be used is a startup
    error (ValueError naming it), never a silent cold start."""
    if not cfg.prefix_caching or (cfg.host_cache_gb <= 0 and cfg.disk_cache_dir is None):
        return None
    host = HostTier(int(cfg.host_cache_gb * GIB), cfg.block_size) if cfg.host_cache_gb > 0 else None
    disk = None
    if cfg.disk_cache_dir is not None:
        fp = checkpoint_fingerprint(cfg, model_id)
        try:
            disk = DiskStore.open(cfg.disk_cache_dir, fp, int(cfg.disk_cache_gb * GIB))
        except DiskStoreError as exc:
            raise ValueError(f"--disk-cache-dir: {exc}") from exc
        log.info(
            "disk tier: %s (%d units, %.2f of %.2f GiB)",
            cfg.disk_cache_dir,
            disk.num_units,
            disk.used_bytes / GIB,
            cfg.disk_cache_gb,
        )
    if host is not None:
        log.info("host tier: %.2f GiB", cfg.host_cache_gb)
    return Tiers(host, disk)
