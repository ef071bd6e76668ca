"""The CUDA check script's CPU dry run: every check passes on the tiny model, the ledger line is
written, and the driver needs none of safetensors, transformers and httpx (the GPU machine lacks
them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import sys
sys.modules["safetensors"] = None  # importing either now fails: the driver must not need them
sys.modules["transformers"] = None
sys.modules["httpx"] = None
from bench.gpu.check import main
sys.argv = ["check", "--device", "cpu", "--tiny", "--ledger", sys.argv[1]]
raise SystemExit(main())
"""


def _dry_run(driver: str, ledger: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """Run a device script's CPU dry run in a fresh interpreter; it must exit 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(out)}
    proc = subprocess.run(
        [sys.executable, "-c", driver, str(ledger)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_check_dry_run(tmp_path: Path) -> None:
    ledger = tmp_path / "runs" / "gpu-check.jsonl"
    proc = _dry_run(DRIVER, ledger, tmp_path / "out")
    for name in (
        "graph_equals_buffered",
        "warm_equals_cold",
        "device_resident_fed",
        "pipelined_equals_sync",
    ):
        assert f"PASS {name}" in proc.stdout
    (line,) = ledger.read_text().splitlines()
    assert (tmp_path / "out" / "gpu-check.jsonl").read_text().splitlines() == [line]
    rec = json.loads(line)
    assert rec["graph_vs_eager_identical"] and rec["distinct_tokens"] > 5
    assert rec["ttft_cold_ms"] > 0 and rec["decode_ms_graph_b8"] > 0
    assert rec["pipelined_steps"] > 0 and rec["engine_decode_tok_s_sync"] > 0
    assert rec["git"]["source_sha256"] and rec["machine"]["cores"] and rec["flags"]["tiny"]


SIDE_BY_SIDE = """
import sys
sys.modules["httpx"] = None  # the HF arm needs transformers (and its safetensors), not a server
from bench.gpu.side_by_side import main
sys.argv = ["side_by_side", "--device", "cpu", "--tiny", "--ledger", sys.argv[1]]
raise SystemExit(main())
"""


def test_side_by_side_dry_run(tmp_path: Path) -> None:
    """The GPU side-by-side's CPU twin: every figure is measured (both arms, the bandwidth
    limit, kernels per step, the agents' workload) and the agents' turn 2 is warm == cold and
    resumes everything turn 1 left."""
    ledger = tmp_path / "runs" / "gpu-side-by-side.jsonl"
    proc = _dry_run(SIDE_BY_SIDE, ledger, tmp_path / "out")
    assert "PASS turn2_warm_equals_cold" in proc.stdout
    assert "PASS turn2_resumes_its_history" in proc.stdout
    (line,) = ledger.read_text().splitlines()
    assert (tmp_path / "out" / "gpu-side-by-side.jsonl").read_text().splitlines() == [line]
    rec = json.loads(line)
    for b in (1, 8):  # the tiny run's batch tops out at 16
        assert rec[f"ours_decode_ms_b{b}"] > 0
    assert rec["hf_decode_ms_b1"] > 0 and rec["hf_prefill_ms"] > 0 and rec["ours_prefill_ms"] > 0
    assert rec["ours_kernels_per_decode_step_b1"] > 10 and rec["decode_limit_ms_b1"] > 0
    agents = rec["agents"]
    assert agents["first_burst_s_cache_on"] > 0 and agents["turn2_cached_tokens"] > 0
