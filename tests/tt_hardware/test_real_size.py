"""Real-size checks on a Tenstorrent card (skipped, with the reason printed, where none opens).

One GDN and one gated attention layer at full Qwen3.5-9B dimensions (hidden 4096, intermediate
12288, vocabulary 248320: the LM head runs in column chunks), random context-sensitive weights,
built as ``tt-serve --backend ttnn`` builds the backend (``launch.launch``: the
configured trace region, precision, prefill chunk 2048 with every bucket traced). The checks
are ``tests/tt_hardware/real_size.py``'s, which ``tests/tt/runtime/test_real_size_fake.py``
also runs on the numeric contract fake in ``make test``; ``reviews/ttnn-backend.md`` §5 lists
what each one would have caught.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import tiny_models as tm
from tests.tt_hardware import real_size as rs
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime import weight_cache

pytestmark = pytest.mark.tt_hardware


@pytest.fixture(scope="module")
def size(tmp_path_factory: pytest.TempPathFactory, tt_device_id: int) -> rs.RealSize:
    path = tm.make_real_dims(tmp_path_factory.mktemp("real_size") / "ckpt", seed=0)
    return rs.RealSize(
        path=path,
        bar=rs.DEVICE_BAR,
        decode_steps=128,
        batch_steps=8,
        prefill_chunk=2048,
        kv_blocks=160,
        max_model_len=4096,
        device_id=tt_device_id,
    )


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real_size_weights")


@pytest.fixture
def ops(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ops]:
    """The real ttnn, device not yet open (each check opens and closes it through the backend);
    converted weights are cached in the test's tmp, not the user's cache folder."""
    monkeypatch.setenv(weight_cache.CACHE_ENV, str(cache_dir))
    yield Ops.load()


@pytest.mark.parametrize("max_batch", [16, 32])
def test_capture_and_batch_decode(size: rs.RealSize, ops: Ops, max_batch: int) -> None:
    rs.check_capture_and_batch_decode(ops, size, max_batch)


def test_teacher_forced_layers(size: rs.RealSize, ops: Ops) -> None:
    rs.check_teacher_forced_layers(ops, size, 16)


def test_teacher_forced_logits(size: rs.RealSize, ops: Ops) -> None:
    rs.check_teacher_forced_logits(ops, size, 16)


def test_snapshot_copies(size: rs.RealSize, ops: Ops) -> None:
    rs.check_snapshot_copies(ops, size, 32)


def test_paused_slot(size: rs.RealSize, ops: Ops) -> None:
    rs.check_paused_slot(ops, size, 16)


def test_sampled_decode(size: rs.RealSize, ops: Ops) -> None:
    rs.check_sampled_decode(ops, size, 32)
