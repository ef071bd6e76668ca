"""Mock tier: the ttnn backend on tt-metal's own code. The real ttnn 0.81.1 opens a mock box
(no card, the stand-in compiler of scripts/mock-sfpi) and validates and allocates every op the
backend issues; nothing computes (reads are zeros), so these tests check that the programs are
accepted, not their tokens (the virtual device's tests check tokens).

* a tiny hybrid model through the engine on a P150 and an N150 (``drive_engine.py``): startup,
  two-chunk prefill, decode at batch 3, device sampling, a prefix hit with a GDN snapshot
  restore, and a KV pool small enough to evict;
* ``tt-serve plan``'s mock checker (``plan/mock.py``): Qwen3.5-9B at real size, shape-only, on a
  P150 at batch 1, 16 and 32 (bfloat16 weights, KV pool as the planner sizes it); on an N150
  bf16 it does not fit, and tt-metal's allocator says so in its own words.

Two rules the virtual device lacked came from here: chunked SDPA's page-table stick of a multiple
of 32 bytes (tests/tt/contract/test_limits.py) and the trace region split over the DRAM banks
(test_boards.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.tt.mock.test_boards import PYTHON, VENV, _sfpi_compiler
from tt_serve.model.published import published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.contract.boards import DEVICES
from tt_serve.model.tt.contract.cluster_desc import write_cluster_descriptor
from tt_serve.model.tt.plan import mock, planner

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
MARK = "MOCK_ENGINE "

# A tiny Qwen3.5 (3 GDN layers + 1 attention layer), the shapes of the engine tests' models.
TINY = {
    "model_type": "qwen3_5_text",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "vocab_size": 4096,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e7,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def ttnn_python() -> Path:
    reason = ""
    if not PYTHON.exists():
        reason = f"no ttnn venv at {VENV} (run scripts/setup-ttnn-venv)"
    elif not _sfpi_compiler():
        reason = "no SFPI compiler or stand-in in the ttnn venv (run scripts/setup-ttnn-venv)"
    if reason:
        if os.environ.get("REQUIRE_TTNN") == "1":
            pytest.fail(reason + "; REQUIRE_TTNN=1")
        print(f"SKIP tt mock engine: {reason}")
        pytest.skip(reason)
    return PYTHON


def _drive(python: Path, board: str, job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    desc = write_cluster_descriptor(DEVICES[board], tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TT_METAL")}
    env.update(
        PYTHONPATH=str(ROOT),
        TT_METAL_MOCK_CLUSTER_DESC_PATH=str(desc),
        TT_METAL_CACHE=str(mock.kernel_cache_dir()),
        TT_LOGGER_LEVEL="error",
    )
    proc = subprocess.run(
        [str(python), str(HERE / "drive_engine.py")],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
        env=env,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return dict(json.loads(lines[-1][len(MARK) :]))


@pytest.mark.parametrize(("board", "eviction"), [("p150", True), ("n150", False)])
def test_tiny_model_through_the_engine_on_a_mock_box(
    ttnn_python: Path, tmp_path: Path, board: str, eviction: bool
) -> None:
    out = _drive(ttnn_python, board, {"config": TINY, "eviction": eviction}, tmp_path)
    reqs = out["requests"]
    assert set(reqs) == {"cold", "hit", "cold-again", "hit-again", "drawn-again"}
    assert all(r["error"] is None and r["tokens"] == 6 for r in reqs.values()), reqs
    assert reqs["cold"]["cached"] == 0 and reqs["hit"]["cached"] == 256  # KV + GDN snapshot
    stats = out["stats"]
    assert stats["failed_steps"] == 0 and stats["sampled_rows_host"] == 0
    assert stats["sampled_rows_device"] == 30  # every token picked on the device, draws too
    assert stats["kv_blocks_used"] == 0  # every block back in the pool
    assert out["ops"] > 5000  # ttnn calls tt-metal validated
    print(f"{board}: {out['ops']} ttnn calls validated by tt-metal, stats {stats}")


def _published(name: str) -> tuple[dict[str, Any], ModelSpec]:
    config = dict(published_config(name))
    return config, ModelSpec.from_config(config, model_id=name)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 16, 32])
def test_qwen35_9b_starts_on_a_mock_p150(ttnn_python: Path, batch: int) -> None:
    """Real size, shape-only: weights (18 GB bf16), KV pool, states and snapshots allocated by
    tt-metal's allocator, the workload's prefill, decode, sampling and snapshot copies
    validated; the virtual device's plan and tt-metal agree that it fits."""
    config, spec = _published("qwen3.5-9b")
    req = planner.PlanRequest(device="p150", max_batch_size=batch)
    p = planner.plan(spec, req)
    assert p.ok
    from tt_serve.model.tt.plan.report import mock_request

    v = mock.check(config, mock_request(req, p), p.kv_blocks, python=str(ttnn_python))
    assert v.ok, v.message
    assert v.checker == "tt-metal 0.81.1 on a mock p150" and v.dram_banks == 8
    assert v.dram_after["startup"] * 8 > 17.9e9  # the weights, in the real banks
    assert v.dram_after["workload"] <= v.dram_bank_bytes
    print(f"batch {batch}: {v.ops} ttnn calls in {v.seconds} s, DRAM per bank {v.dram_after}")


@pytest.mark.slow
def test_qwen35_9b_bf16_on_a_mock_n150_is_refused_by_tt_metal(ttnn_python: Path) -> None:
    config, spec = _published("qwen3.5-9b")
    req = planner.PlanRequest(device="n150", max_batch_size=1, precision="bfloat16")
    p = planner.plan(spec, req)
    assert not p.ok and p.limit_rule == "dram.capacity"
    from tt_serve.model.tt.plan.report import mock_request

    v = mock.check(config, mock_request(req, p), 64, python=str(ttnn_python))
    assert not v.ok and v.where == "bank_manager.cpp:514" and v.phase == "startup"
    assert "Out of Memory: Not enough space to allocate" in v.message
