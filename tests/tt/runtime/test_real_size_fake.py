"""The real-size hardware checks (``tests/tt_hardware/real_size.py``) on the numeric contract
fake, so that ``make test`` runs them at Qwen3.5-9B head counts, head dims, hidden size and GDN
state rows ([rows, 32, 128, 128] fp32), with every device rule of ``virtual/rules_*.py`` checked at those
shapes.

Shrunk for CI (2 cores), only where no device rule looks: vocabulary 4096 (the card: 248320, an
LM head in column chunks), MLP intermediate 1024 (12288), 16 teacher-forced steps (128), the
largest prefill bucket 256 (2048) and a 48-block KV pool. The fake computes in fp32, so results
must also meet the fp32 reordering bounds of ``tests/numerics.py``, not only the card's PCC bar.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import tiny_models as tm
from tests.tt_hardware import real_size as rs
from tt_serve.model.published import published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime import weight_cache
from tt_serve.model.tt.virtual.device import P150, WORMHOLE, VirtualTTNN

pytestmark = pytest.mark.slow

CHIPS = {"p150": P150, "wormhole": WORMHOLE}
# What the fake run keeps at the 9B's values: everything a device rule or a state row depends on.
LAYER_DIMS = (
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "partial_rotary_factor",
    "rope_theta",
    "conv_kernel",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
)


@pytest.fixture(scope="module")
def size(tmp_path_factory: pytest.TempPathFactory) -> rs.RealSize:
    path = tm.make_real_dims(
        tmp_path_factory.mktemp("real_size") / "ckpt", seed=0, vocab=4096, intermediate=1024
    )
    return rs.RealSize(
        path=path,
        bar=rs.FP32_BAR,
        decode_steps=16,
        batch_steps=3,
        prefill_chunk=256,
        kv_blocks=48,
        max_model_len=1024,
    )


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real_size_weights")


@pytest.fixture(autouse=True)
def _weight_cache(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # from_config caches converted weights in the default folder: keep it in the test's tmp.
    monkeypatch.setenv(weight_cache.CACHE_ENV, str(cache_dir))
    yield


def test_checkpoint_has_the_9b_layer_dims(size: rs.RealSize) -> None:
    real = ModelSpec.from_config(published_config("qwen3.5-9b"))
    spec = size.spec
    assert {d: getattr(spec, d) for d in LAYER_DIMS} == {d: getattr(real, d) for d in LAYER_DIMS}
    assert spec.layer_types == ("linear_attention", "full_attention")
    assert spec.conv_dim == real.conv_dim == 8192


def fake_ops(chip: ChipSpec = P150) -> Ops:
    # The harness's fake: paged SDPA decode must get a program config (review finding 5).
    return Ops(VirtualTTNN(chip=chip, require_sdpa_program_config=True))


@pytest.mark.parametrize(("max_batch", "chip"), [(16, "p150"), (32, "wormhole")])
def test_capture_and_batch_decode(size: rs.RealSize, max_batch: int, chip: str) -> None:
    rs.check_capture_and_batch_decode(fake_ops(CHIPS[chip]), size, max_batch)


def test_teacher_forced_layers(size: rs.RealSize) -> None:
    rs.check_teacher_forced_layers(fake_ops(), size, 16)


def test_teacher_forced_logits(size: rs.RealSize) -> None:
    rs.check_teacher_forced_logits(fake_ops(), size, 16)


def test_snapshot_copies(size: rs.RealSize) -> None:
    rs.check_snapshot_copies(fake_ops(), size, 32)


def test_paused_slot(size: rs.RealSize) -> None:
    rs.check_paused_slot(fake_ops(), size, 16)


def test_sampled_decode(size: rs.RealSize) -> None:
    rs.check_sampled_decode(fake_ops(WORMHOLE), size, 32)
