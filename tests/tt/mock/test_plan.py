"""Mock tier at real sizes: ``tt-serve plan``'s mock checker (``plan/mock.py``) runs the
planner's startup, pools and workload on the real ttnn 0.81.1 against a mock box, shape-only
(weights allocated without data), the decode step a trace tt-metal captures, replays and
releases (the mock trace shim). The virtual device's verdict and tt-metal's must agree.

* Qwen3.5-9B on a P150 at batch 1, 16 and 32 (bfloat16 weights, the KV pool the planner sizes):
  fits on both; on an N150 in bfloat16 neither fits, and tt-metal's allocator says so in its
  own words (``bank_manager.cpp:514``);
* tensor parallel with the CCLs under mock: Qwen3.5-9B on an N300 (1x2, mixed precision),
  Qwen3.6-27B on a T3K (1x8) and Qwen3.5-2B on a T3K as a 2x4 mesh. Wormhole meshes open with tensix dispatch under mock
  (``startup._mock_dispatch``: 0.81.1's mock validates work units against 8x7 under ethernet
  dispatch while reporting 8x8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tt_serve.model.published import published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import device_spec
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.plan import mock, planner
from tt_serve.model.tt.plan.report import mock_options

pytestmark = pytest.mark.slow


def _published(name: str) -> tuple[dict[str, Any], ModelSpec]:
    config = dict(published_config(name))
    return config, ModelSpec.from_config(config, model_id=name)


@pytest.mark.parametrize("batch", [16, 32])  # the ttnn default and the most it serves
def test_qwen35_9b_starts_on_a_mock_p150(ttnn_python: Path, batch: int) -> None:
    """Real size, shape-only: weights (18 GB bf16), KV pool, states and snapshots allocated by
    tt-metal's allocator, the workload's prefill, decode, sampling and snapshot copies
    validated; the virtual device's plan and tt-metal agree that it fits."""
    config, spec = _published("qwen3.5-9b")
    board = device_spec("p150")
    req = TTOptions(max_batch_size=batch)
    p = planner.plan(spec, board, req)
    assert p.ok
    v = mock.check(config, board.name, mock_options(req, p), p.kv_blocks, python=str(ttnn_python))
    assert v.ok, v.message
    assert v.checker == "tt-metal 0.81.1 on a mock p150" and v.dram_banks == 8
    assert not v.eager and v.traces == 1  # the decode step, captured and replayed as on a card
    assert 0 < v.l1_peak <= v.l1_bank_bytes  # the decode trace's compile run and a prefill chunk
    assert v.dram_after["startup"] * 8 > 17.9e9  # the weights, in the real banks
    assert v.dram_after["workload"] <= v.dram_bank_bytes
    # KV sized by the real allocator: after the workload it takes a few more blocks (the plan
    # keeps a margin), but not a tenth of the pool more (the plan wastes little).
    assert v.kv_blocks == p.kv_blocks and 0 <= v.kv_blocks_more < p.kv_blocks // 10
    print(
        f"batch {batch}: {v.ops} ttnn calls in {v.seconds} s, DRAM per bank {v.dram_after}, "
        f"KV {v.kv_blocks} + {v.kv_blocks_more} blocks the allocator still took"
    )


def test_qwen35_9b_bf16_on_a_mock_n150_is_refused_by_tt_metal(ttnn_python: Path) -> None:
    config, spec = _published("qwen3.5-9b")
    board = device_spec("n150")
    req = TTOptions(max_batch_size=1, precision="bfloat16")
    p = planner.plan(spec, board, req)
    assert not p.ok and p.limit_rule == "dram.capacity"
    v = mock.check(config, board.name, mock_options(req, p), 64, python=str(ttnn_python))
    assert not v.ok and v.where == "bank_manager.cpp:514" and v.phase == "startup"
    assert "Out of Memory: Not enough space to allocate" in v.message


@pytest.mark.parametrize(
    ("model", "device", "precision", "batch", "mesh"),
    [
        ("qwen3.5-9b", "n300", "mixed", 16, None),
        ("qwen3.6-27b", "t3k", "bfloat16", 1, None),
        ("qwen3.5-2b", "t3k", "mixed", 1, (2, 4)),  # both axes' collectives
    ],
)
def test_tensor_parallel_starts_on_a_mock_mesh(
    ttnn_python: Path,
    model: str,
    device: str,
    precision: str,
    batch: int,
    mesh: tuple[int, int] | None,
) -> None:
    """Weights split over the chips, the all-gathers and reductions of every layer run by
    tt-metal's CCLs on the mock fabric (and captured in the decode trace), per-chip DRAM from
    the real allocator."""
    config, spec = _published(model)
    board = device_spec(device)
    req = TTOptions(max_batch_size=batch, precision=precision, mesh=mesh)
    p = planner.plan(spec, board, req)
    assert p.ok and p.chips > 1
    v = mock.check(config, board.name, mock_options(req, p), p.kv_blocks, python=str(ttnn_python))
    assert v.ok, v.message
    assert not v.eager and v.traces == 1
    assert v.dram_banks == 12  # Wormhole: per chip
    assert v.dram_after["workload"] <= v.dram_bank_bytes
    print(f"{model} on {device}: {v.ops} ttnn calls in {v.seconds} s, DRAM per bank {v.dram_after}")
