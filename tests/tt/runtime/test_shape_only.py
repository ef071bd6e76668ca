"""Shape-only mode of the contract fake: real-size Qwen3.5-9B on the P150 description.

Backend startup (every pool, every trace), prefill chunks, decode steps and one snapshot
save/restore/reset run with every rule of virtual/rules_*.py / virtual/dram.py enforced, without data and
without weights (a folder holding only config.json)."""

from __future__ import annotations

import numpy as np
import pytest

from tt_serve.model.published import write_published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import device_spec
from tt_serve.model.tt.layout.host import is_shape_only, shape_only_weights
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.plan import planner
from tt_serve.model.tt.virtual.device import VirtualTTNN


@pytest.fixture(scope="module")
def spec9b(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return ModelSpec.from_hf_dir(
        write_published_config("qwen3.5-9b", tmp_path_factory.mktemp("q9"))
    )


def test_shape_only_tensors_hold_no_data() -> None:
    fake = VirtualTTNN(shape_only=True)
    big = fake.zeros([8192, 248320], fake.bfloat16, fake.TILE_LAYOUT, device=object())
    assert big.buffer.data.is_meta and fake.dram.used_per_bank > 0
    host = fake.from_device(big)
    out = host.to_numpy()
    assert out.shape == (8192, 248320) and not out.any()


def test_shape_only_weights_own_no_memory(spec9b: ModelSpec) -> None:
    w = shape_only_weights(spec9b)
    assert w["lm_head.weight"].shape == (248320, 4096)
    assert w["layers.0.linear_attn.conv1d.weight"].shape == (8192, 4)
    assert all(is_shape_only(a) for a in w.values() if a.size > 1)
    assert sum(a.nbytes for a in w.values()) > 3.5e10  # 8.95 B params as float32 views
    assert sum(np.asarray(a).base.nbytes for a in w.values() if a.base is not None) < 1 << 20


@pytest.mark.slow
@pytest.mark.parametrize(("batch", "traced_prefill"), [(1, False), (16, True), (32, False)])
def test_qwen35_9b_on_p150(spec9b: ModelSpec, batch: int, traced_prefill: bool) -> None:
    """Startup + 2 prefill chunks + 8 decode steps + save/restore/reset at max_batch ``batch``,
    bfloat16 weights, a fixed KV pool (sizing from DRAM is test_plan's); the decode trace always,
    the prefill bucket traces (64..256) too at batch 16."""
    board = device_spec("p150")
    req = TTOptions(max_batch_size=batch, kv_blocks=1024, traced_prefill=traced_prefill)
    p = planner.plan(spec9b, board, req)
    assert p.ok, f"[{p.limit_rule}] {p.limit_message}"
    assert 17.9e9 < sum(p.weights.values()) < 18.1e9  # 8.954 B params x 2 B, tile padding
    assert p.kv_tokens == 1023 * 64
    assert p.trace_needed <= p.trace_configured
    assert p.traces == (4 if traced_prefill else 1)
    assert p.dram_left > 0
