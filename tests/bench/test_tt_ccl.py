"""bench/kernels/tt_ccl.py without a device: the --fake dry run checks every collective's
numerics on the fake mesh and writes no ledger; a wrong collective fails it; no device exits 2
saying why."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.kernels import tt_ccl
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.probe import NoDeviceError

# One small message per collective (hidden 4 chips x 2 tiles), few iterations: the dry run
# checks numerics and device rules, not speed.
SMALL = ["--hidden", "256", "--rows", "32", "--iters", "2", "--rounds", "1", "--warmup", "1"]
SMALL += ["--trace-ops", "2"]


def test_fake_dry_run_is_exact_and_writes_no_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ccl.jsonl"
    assert tt_ccl.main(["--fake", "--chips", "4", *SMALL, "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert tt_ccl.FAKE_NOTE in out
    assert out.count("exact") == len(tt_ccl.COLLECTIVES)
    assert "[1, 1, 32, 64]" in out  # the gather's input is a quarter of the width per chip
    assert not ledger.exists()


def test_fake_dry_run_fails_on_a_wrong_reduction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reduce-scatter that doubles its sum must be caught, in eager and traced runs."""
    original = Ops.reduce_scatter

    def doubled(self: Ops, x: Any, dim: int, **kw: Any) -> Any:
        return self.mul(original(self, x, dim, **kw), 2.0)

    monkeypatch.setattr(Ops, "reduce_scatter", doubled)
    argv = ["--fake", "--chips", "2", *SMALL, "--collectives", "reduce_scatter,all_gather"]
    assert tt_ccl.main([*argv, "--ledger", str(tmp_path / "l.jsonl")]) == 1
    captured = capsys.readouterr()
    assert "MISMATCH {'eager'" in captured.out and "'trace'" in captured.out
    assert "differs from numpy" in captured.err


def test_bandwidth_conventions() -> None:
    """nccl-tests: busbw = algbw x (N-1)/N (gather, scatter), x 2(N-1)/N (all-reduce)."""
    assert tt_ccl.bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert tt_ccl.bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert tt_ccl.bus_factor("all_reduce", 4) == pytest.approx(2 * 3 / 4)
    assert tt_ccl.Case("all_gather", 32, 4096).size_bytes == 32 * 4096 * 2


@pytest.mark.parametrize(
    ("probe", "needle"),
    [
        (NoDeviceError("no Tenstorrent device could be opened (TT_FATAL)"), "could be opened"),
        (1, "a 1 x 1 mesh needs 2 Tenstorrent chips; ttnn sees 1"),
    ],
)
def test_no_device_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    probe: Any,
    needle: str,
) -> None:
    def fake_probe(*a: Any, **k: Any) -> int:
        if isinstance(probe, Exception):
            raise probe
        return int(probe)

    monkeypatch.setattr(tt_ccl, "probe_devices", fake_probe)
    ledger = tmp_path / "ccl.jsonl"
    assert tt_ccl.main(["--ledger", str(ledger)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench.kernels.tt_ccl: ") and needle in err[0]
    assert not ledger.exists()


@pytest.mark.skipif(
    importlib.util.find_spec("ttnn") is not None, reason="ttnn is installed: a device may exist"
)
def test_no_ttnn_process_exits_2() -> None:
    """The real path end to end: this Python has no ttnn, so the probe says so."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.kernels.tt_ccl"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ttnn package" in lines[0] and "--fake" in lines[0]
