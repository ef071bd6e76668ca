"""The disk tier's folder name: a changed checkpoint, backend, device kind or mesh, dtype,
precision or cut grid looks elsewhere; the same start finds the same folder."""

from __future__ import annotations

from pathlib import Path

from tt_serve.config.serve_config import ServeConfig
from tt_serve.engine.cache_fingerprint import checkpoint_fingerprint


def _checkpoint(root: Path, weights: bytes) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"model_type": "qwen3_5_text"}')
    (root / "model.safetensors").write_bytes(weights)
    return root


def test_fingerprint_follows_everything_that_decides_the_bits(tmp_path: Path) -> None:
    weights = bytes(range(256)) * 4096  # 1 MiB
    a = _checkpoint(tmp_path / "a", weights)
    cfg = ServeConfig(model=str(a))
    fp = checkpoint_fingerprint(cfg, "id")
    assert len(fp) == 16 and fp == checkpoint_fingerprint(cfg, "id")
    tuned = bytearray(weights)
    tuned[0] ^= 1  # a fine-tune of the same shapes (the first sample covers byte 0)
    b = _checkpoint(tmp_path / "b", bytes(tuned))
    others = [
        checkpoint_fingerprint(ServeConfig(model=str(b)), "id"),
        checkpoint_fingerprint(cfg, "other-id"),
        checkpoint_fingerprint(ServeConfig(model=str(a), dtype="bfloat16"), "id"),
        checkpoint_fingerprint(ServeConfig(model=str(a), backend="ttnn", precision="mixed"), "id"),
        checkpoint_fingerprint(ServeConfig(model=str(a), prefill_chunk=512), "id"),
        checkpoint_fingerprint(ServeConfig(model=str(a), block_size=32), "id"),
        checkpoint_fingerprint(ServeConfig(model=str(a), device="cuda", dtype="float32"), "id"),
        checkpoint_fingerprint(
            ServeConfig(model=str(a), backend="ttnn", device_ids=(0, 1), precision="auto"), "id"
        ),
    ]
    # the device index is not the device kind: cuda:0 and cuda:1 share a folder
    same = ServeConfig(model=str(a), device="cuda:1", dtype="float32")
    assert checkpoint_fingerprint(same, "id") == others[-2]
    assert len({fp, *others}) == 1 + len(others)
