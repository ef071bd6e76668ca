"""``tt-serve check-numerics``: in the main venv it says it needs the ttnn venv; in the ttnn venv
(slow) it runs Qwen3.5-0.8B's first 4 layers at published dimensions with golden math and
passes its own derived bounds (``golden/check.py``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from tt_serve import cli

ROOT = Path(__file__).resolve().parents[3]
PYTHON = Path(os.environ.get("TTNN_VENV", ROOT / ".venv-ttnn")) / "bin" / "python"


@pytest.mark.skipif(importlib.util.find_spec("ttnn") is not None, reason="this Python has ttnn")
def test_the_main_venv_says_it_needs_the_ttnn_venv(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-numerics", "--layers", "4"]) == 2
    err = capsys.readouterr().err
    assert "needs the ttnn venv" in err and "scripts/setup-ttnn-venv" in err
    assert ".venv-ttnn/bin/python -m tt_serve.cli check-numerics --layers 4" in err


def test_help_is_answered_in_either_venv(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["check-numerics", "--help"])
    assert exc.value.code == 0 and "--precision" in capsys.readouterr().out


@pytest.mark.slow
def test_qwen35_08b_four_layers_with_golden_math(tmp_path: Path) -> None:
    if not PYTHON.exists():
        if os.environ.get("REQUIRE_TTNN") == "1":
            pytest.fail(f"no ttnn venv at {PYTHON.parent.parent}; REQUIRE_TTNN=1")
        pytest.skip("no ttnn venv (run scripts/setup-ttnn-venv)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TT_METAL")}
    env["PYTHONPATH"], env["OMP_NUM_THREADS"] = str(ROOT), "1"
    args = ["check-numerics", "--model", "qwen3.5-0.8b", "--layers", "4", "--json"]
    proc = subprocess.run(
        [str(PYTHON), "-m", "tt_serve.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    # stdout is the JSON alone: tt-metal's log lines (it opens mock devices) go to stderr, the
    # ones its destructors write at exit too.
    assert proc.stdout.strip(), proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    e = out["end_to_end"]
    assert proc.returncode == 0 and out["ok"], (e, [r for r in out["ops"] if not r["ok"]])
    assert e["max_logit_diff"] <= e["tolerance"] and e["greedy_equal"] and e["sampled_equal"]
    assert len(out["no_golden"]) == 4 and out["formats"]["block_float_tensors"] > 0
