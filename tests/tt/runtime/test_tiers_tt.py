"""The host and disk tiers on the ttnn backend (virtual device): a unit read out of the device
pools as TILE tensors (block floats still packed) and restored into other blocks and another
snapshot slot gives the cache-off run's tokens and logprobs bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.tt import harness as h
from tests.tt.runtime.test_warm_cold import PARAMS, SUFFIX, mismatch
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model.spec import ModelSpec


def _engine(path: Path, mesh: int = 0, **tiers: Any) -> Engine:
    """The harness engine's shape with a pool too small to keep a conversation across three
    others (48 blocks of 64 tokens, 2 snapshot slots) and the given tiers."""
    spec = ModelSpec.from_hf_dir(path)
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_batch=4, chunk=h.CHUNK, block_size=h.BLOCK, mixed_steps=False
        ),
        num_kv_blocks=48,
        num_snapshot_slots=2,
        max_model_len=1024,
        vocab_size=spec.vocab_size,
        **tiers,
    )
    backend = h.mesh_backend(path, mesh) if mesh else h.tt_backend(path)
    return Engine(backend, config)


def test_tier_restore_equals_cold_bitwise(dense_dir: Path, tmp_path: Path) -> None:
    head = h.prompt(400, 11)
    hit = head[:384] + h.prompt(SUFFIX, 12)
    others = [h.prompt(400, 20 + i) for i in range(3)]
    spec = ModelSpec.from_hf_dir(dense_dir)
    (cold,) = h.outputs(
        h.engine(h.tt_backend(dense_dir), spec, prefix_caching=False), [hit], PARAMS
    )
    for tiers in (
        {"host_cache_bytes": 64 << 20},
        {
            "disk_cache_dir": str(tmp_path),
            "disk_cache_bytes": 64 << 20,
            "cache_fingerprint": b"x" * 16,
        },
    ):
        eng = _engine(dense_dir, **tiers)
        h.outputs(eng, [head, *others], PARAMS)  # the device pool turns over
        assert eng.scheduler.cache.match(hit) == 0
        t = eng.scheduler.cache.tiers
        assert t is not None
        t.flush()
        (warm,) = h.outputs(eng, [hit], PARAMS)
        assert warm.cached_tokens == 384, tiers
        assert mismatch(warm, cold, atol=0) is None, tiers
        st = t.stats
        assert st.host_hits + st.disk_hits == 1 and st.restore_bytes > 0
        eng.scheduler.cache.check_invariants()
        eng.close()


def test_tier_restore_on_a_mesh_equals_cold_bitwise(dense_dir: Path) -> None:
    """Tensor parallel over a 1 x 2 mesh: a unit holds every chip's shard of each pool row (a
    dump keeps the mesh distribution) and restores them bit for bit."""
    head = h.prompt(400, 31)
    hit = head[:384] + h.prompt(SUFFIX, 32)
    others = [h.prompt(400, 40 + i) for i in range(3)]
    (cold,) = h.outputs(_engine(dense_dir, mesh=2), [hit], PARAMS)
    eng = _engine(dense_dir, mesh=2, host_cache_bytes=64 << 20)
    h.outputs(eng, [head, *others], PARAMS)
    assert eng.scheduler.cache.match(hit) == 0
    (warm,) = h.outputs(eng, [hit], PARAMS)
    assert warm.cached_tokens == 384 and cold.cached_tokens == 0
    assert mismatch(warm, cold, atol=0) is None
    eng.close()
