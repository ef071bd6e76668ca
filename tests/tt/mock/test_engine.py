"""Mock tier: the ttnn backend on tt-metal's own code. The real ttnn 0.81.1 opens a mock box
(no card, the stand-in compiler of scripts/mock-sfpi) and validates and allocates every op the
backend issues; nothing computes (reads are zeros), so these tests check that the programs are
accepted, not their tokens (the virtual device's tests check tokens).

* a tiny hybrid model through the engine on a P150 and an N150 (``drive_engine.py``): startup,
  two-chunk prefill, decode at batch 3, device sampling, a prefix hit with a GDN snapshot
  restore, and a KV pool small enough to evict; on the P150 the decode step is a trace captured,
  replayed and released by tt-metal (the mock trace shim), on the N150 every program is eager
  (what a mock run without the shim does);
* tt-metal refusing a trace region too small for the captured trace, in its own words;
* real sizes through ``tt-serve plan``'s mock checker: test_plan.py.

Two rules the virtual device lacked came from here: chunked SDPA's page-table stick of a multiple
of 32 bytes (tests/tt/virtual/test_limits.py) and the trace region split over the DRAM banks
(test_boards.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tt_serve.model.tt.boards import DEVICES
from tt_serve.model.tt.plan import mock
from tt_serve.model.tt.plan.cluster_desc import write_cluster_descriptor

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


def _run(
    python: Path, board: str, job: dict[str, Any], tmp: Path
) -> subprocess.CompletedProcess[str]:
    desc = write_cluster_descriptor(DEVICES[board], tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TT_METAL")}
    env.update(
        PYTHONPATH=str(ROOT),
        TT_METAL_MOCK_CLUSTER_DESC_PATH=str(desc),
        TT_METAL_CACHE=str(mock.kernel_cache_dir()),
        TT_LOGGER_LEVEL="error",
    )
    if job.get("traced") and not job.get("no_shim"):
        shim = mock.trace_shim(str(python))
        assert shim is not None, "the ttnn_python fixture checks the shim"
        env["LD_PRELOAD"] = str(shim)
    return subprocess.run(
        [str(python), str(HERE / "drive_engine.py")],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
        env=env,
        check=False,
    )


def _drive(python: Path, board: str, job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    proc = _run(python, board, job, tmp)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return dict(json.loads(lines[-1][len(MARK) :]))


@pytest.mark.parametrize(
    ("board", "eviction", "traced"), [("p150", True, True), ("n150", False, False)]
)
def test_tiny_model_through_the_engine_on_a_mock_box(
    ttnn_python: Path, tmp_path: Path, board: str, eviction: bool, traced: bool
) -> None:
    job = {"config": TINY, "eviction": eviction, "traced": traced, "trace_region": 8 << 20}
    out = _drive(ttnn_python, board, job, tmp_path)
    reqs = out["requests"]
    assert set(reqs) == {"cold", "hit", "cold-again", "hit-again", "drawn-again"}
    assert all(r["error"] is None and r["tokens"] == 6 for r in reqs.values()), reqs
    assert reqs["cold"]["cached"] == 0 and reqs["hit"]["cached"] == 256  # KV + GDN snapshot
    stats = out["stats"]
    assert stats["failed_steps"] == 0 and stats["sampled_rows_host"] == 0
    assert stats["sampled_rows_device"] == 30  # every token picked on the device, draws too
    assert stats["kv_blocks_used"] == 0  # every block back in the pool
    # ttnn calls tt-metal validated; a replayed decode step issues none
    assert out["ops"] > (2500 if traced else 5000)
    # traced: the decode step captured once and every decode step a replay of it
    assert (out["traces"], out["replays"] > 0) == ((1, True) if traced else (0, False))
    print(
        f"{board}: {out['ops']} ttnn calls validated by tt-metal, {out['traces']} trace(s) "
        f"replayed {out['replays']} times, stats {stats}"
    )


def test_tt_metal_refuses_a_trace_region_too_small(ttnn_python: Path, tmp_path: Path) -> None:
    """The captured decode trace does not fit a 512-byte region: tt-metal's own check
    (mesh_trace.cpp) stops the start, the check the eager mock runs could not make."""
    job = {"config": TINY, "traced": True, "trace_region": 512}
    proc = _run(ttnn_python, "p150", job, tmp_path)
    assert proc.returncode != 0 and MARK not in proc.stdout
    assert "Creating trace buffers of size" in proc.stderr, proc.stderr[-3000:]
    assert "only 512B is allocated for trace region" in proc.stderr


def test_without_the_shim_0_81_1_crashes_capturing_under_mock(
    ttnn_python: Path, tmp_path: Path
) -> None:
    """Why the shim exists: the same traced run without it dies in the capture (SIGSEGV: the
    capture path asks the address of the kernel-binary buffer mock mode never allocates;
    scripts/mock-trace-shim.c). If a ttnn release fixes this, the shim can go."""
    job = {"config": TINY, "traced": True, "trace_region": 8 << 20, "no_shim": True}
    proc = _run(ttnn_python, "p150", job, tmp_path)
    assert proc.returncode != 0 and MARK not in proc.stdout
    assert "Segmentation fault" in proc.stderr or proc.returncode == -11, proc.stderr[-2000:]
