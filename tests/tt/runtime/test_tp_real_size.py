"""Shape-only tensor parallel at real size (``VirtualMeshTTNN(shape_only=True)`` through the
planner): startup (every pool, every trace on the mesh), two prefill chunks, decode steps
(greedy, device-sampled, host-sampled) and a snapshot save/restore/reset of Qwen3.6-27B on a
4 x P150 box, on a Galaxy (8 x 4) and a T3K opened as 2 x 4, and Qwen3.6-35B-A3B on 4 x P150
and a T3K (1 x 8 and 2 x 4), every rule checked per chip on the per-chip shapes and the DRAM charged per chip."""

from __future__ import annotations

import pytest

from tt_serve.model.published import write_published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import device_spec
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.plan import planner

pytestmark = pytest.mark.slow


def _spec(name: str, tmp: pytest.TempPathFactory) -> ModelSpec:
    return ModelSpec.from_hf_dir(write_published_config(name, tmp.mktemp(name)))


@pytest.fixture(scope="module")
def spec27(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return _spec("qwen3.6-27b", tmp_path_factory)


@pytest.fixture(scope="module")
def spec35(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    return _spec("qwen3.6-35b-a3b", tmp_path_factory)


@pytest.mark.parametrize(("batch", "region_mib"), [(1, 128), (32, 256)])
def test_qwen36_27b_on_p150x4(spec27: ModelSpec, batch: int, region_mib: int) -> None:
    board = device_spec("p150x4")
    req = TTOptions(max_batch_size=batch, kv_blocks=512, trace_region_size=region_mib << 20)
    p = planner.plan(spec27, board, req)
    assert p.ok, f"[{p.limit_rule}] {p.limit_message}"
    assert p.chips == 4 and p.trace_needed <= p.trace_configured
    # bf16 per chip: a quarter of the 26.9 B split parameters plus the replicated 248320 x 5120
    # embedding (2.54 GB); one chip holds 54 GB of weights in all, which no P150 fits.
    weights = sum(p.weights.values())
    assert 15.0e9 < weights < 15.8e9
    assert p.weights["embed"] > 2.5e9 and p.weights["lm_head"] < 0.7e9  # vocab-sharded head
    assert p.dram_peak < device_spec("p150x4").chip.dram_bytes and p.dram_left > 0
    # 4 KV heads -> 1 per chip: 16 attention layers x K and V x 511 blocks x 64 x 256 x 2 B
    assert p.kv_bytes == 16 * 2 * 512 * 64 * 256 * 2
    assert p.readback["greedy"] == 4 * batch  # one replica of the picked ids


def test_qwen36_27b_does_not_fit_one_p150_but_the_smallest_mesh_does(spec27: ModelSpec) -> None:
    board = device_spec("p150")
    req = TTOptions(max_batch_size=1, kv_blocks=64, trace_region_size=128 << 20)
    assert not planner.plan(spec27, board, req).ok
    best = planner.smallest_mesh(spec27, req, ["p150", "p150x4"])
    assert best is not None and best.device == "p150x4" and best.ok


@pytest.mark.parametrize(("device", "precision"), [("p150x4", "bfloat16"), ("t3k", "mixed")])
def test_qwen36_35b_a3b_tensor_parallel(spec35: ModelSpec, device: str, precision: str) -> None:
    """Whole experts per chip (256 / N, the sparse path); on the T3K's 12 GB Wormhole chips
    with bfp8 weights (16 heads / 2 KV heads: KV replicated over 4 chips each)."""
    board = device_spec(device)
    req = TTOptions(
        precision=precision,
        max_batch_size=1,
        kv_blocks=256,
        trace_region_size=96 << 20,
    )
    p = planner.plan(spec35, board, req)
    assert p.ok, f"[{p.limit_rule}] {p.limit_message}"
    dev = device_spec(device)
    assert p.chips == dev.num_chips and p.dram_peak < dev.chip.dram_bytes
    assert p.trace_needed <= p.trace_configured
    # 40 layers x 256 / N experts x 3 x 2048 x 512 parameters per chip, in the profile's tiles
    # (the DRAM budget rounds each tensor up to whole pages per bank: 13 KB a layer on WH)
    tile = {"bfloat16": 2048, "mixed": 1088}[precision]
    experts = 40 * 256 // dev.num_chips * 3 * 2048 * 512 // 1024 * tile
    assert abs(p.weights["experts"] - experts) < 1e-3 * experts


@pytest.mark.parametrize(("device", "mesh"), [("galaxy", None), ("t3k", (2, 4))])
def test_qwen36_27b_on_a_2d_mesh(spec27: ModelSpec, device: str, mesh: tuple[int, int]) -> None:
    """Galaxy 8 x 4 (its own mesh) and T3K opened as 2 x 4: startup, prefill, decode and a
    snapshot save / restore / reset, every rule per chip, both axes' collectives."""
    board = device_spec(device)
    req = TTOptions(max_batch_size=1, kv_blocks=64, trace_region_size=96 << 20, mesh=mesh)
    p = planner.plan(spec27, board, req)
    assert p.ok, f"[{p.limit_rule}] {p.limit_message}"
    rows, cols = mesh or device_spec(device).mesh
    assert p.chips == rows * cols and p.dram_peak < device_spec(device).chip.dram_bytes
    # 1 KV head per column (4 KV heads over 4 columns), replicated over the rows; Wormhole's 12
    # banks round each pool up to whole pages per bank (under 1%).
    kv = 16 * 2 * 64 * 64 * 256 * 2
    assert kv <= p.kv_bytes < 1.01 * kv
    split = sum(b for g, b in p.weights.items() if g != "embed")
    assert p.weights["embed"] > 2.5e9  # the replicated embedding
    assert 24.9e9 * 2 / (rows * cols) < split < 26.9e9 * 2 / (rows * cols) * 1.05
    assert any("cluster_axis 0" in n for n in p.notes)


def test_a_split_that_does_not_divide_is_the_plan_verdict(spec35: ModelSpec) -> None:
    """Qwen3.6-35B-A3B on Galaxy (8 x 4): 256 experts are 8 per chip, but the 512-wide shared
    expert is not a whole tile on each of 32 chips; the plan names the count."""
    p = planner.plan(spec35, device_spec("galaxy"), TTOptions(kv_blocks=64))
    assert not p.ok and p.limit_rule == "tp.split"
    assert "shared expert intermediate 512 % (32 x 32)" in (p.limit_message or "")


def test_qwen36_35b_a3b_on_t3k_2x4(spec35: ModelSpec) -> None:
    """T3K opened as 2 x 4, bfp8: 32 whole experts per chip over all eight chips, heads over
    the four columns; startup, prefill, decode and a snapshot save / restore / reset."""
    board = device_spec("t3k")
    req = TTOptions(
        mesh=(2, 4),
        precision="mixed",
        max_batch_size=1,
        kv_blocks=256,
        trace_region_size=96 << 20,
    )
    p = planner.plan(spec35, board, req)
    assert p.ok, f"[{p.limit_rule}] {p.limit_message}"
    assert p.chips == 8 and p.dram_peak < device_spec("t3k").chip.dram_bytes
    experts = 40 * 256 // 8 * 3 * 2048 * 512 // 1024 * 1088  # bfp8 tiles, 32 experts a chip
    assert abs(p.weights["experts"] - experts) < 1e-3 * experts
    assert any("cluster_axis 0" in n for n in p.notes)
