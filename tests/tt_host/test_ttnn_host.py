"""Host tier: the real ttnn==0.81.1 wheel, in its own Python 3.12 venv (no device).

Each test runs a small script with ``.venv-ttnn/bin/python`` in a subprocess (several ttnn entry
points abort the process instead of raising) and asserts on its JSON output. Without the venv
the tests skip with the reason printed, unless ``REQUIRE_TTNN=1`` (CI) makes that a failure.
Build the venv with ``scripts/setup-ttnn-venv``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.tt_host.ops_calls import extract
from tt_serve.model.tt.probe import NoDeviceError, probe_devices, require_device

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("TTNN_VENV", ROOT / ".venv-ttnn"))
PYTHON = VENV / "bin" / "python"
MARKER = "TTNN_PROBE_RESULT "
MOCK_CLUSTER = """\
arch: {0: wormhole_b0}
chips: {0: [0,0,0,0]}
ethernet_connections: []
chips_with_mmio: [{0: 0}]
harvesting: {0: {noc_translation: true, harvest_mask: 32}}
boards: [[{board_id: 72059269369839682}, {board_type: n150}, {chips: [0]}]]
"""


@pytest.fixture(scope="module")
def ttnn_python() -> Path:
    if not PYTHON.exists():
        reason = f"no ttnn venv at {VENV} (run scripts/setup-ttnn-venv)"
        if os.environ.get("REQUIRE_TTNN") == "1":
            pytest.fail(reason + "; REQUIRE_TTNN=1")
        print(f"SKIP tt_host: {reason}")
        pytest.skip(reason)
    return PYTHON


def _run(python: Path, script: str, stdin: str, tmp: Path, *, mock: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TT_METAL")}
    env["PYTHONPATH"] = str(ROOT)
    if mock:
        desc = tmp / "cluster.yaml"
        desc.write_text(MOCK_CLUSTER)
        env["TT_METAL_MOCK_CLUSTER_DESC_PATH"] = str(desc)
    proc = subprocess.run(
        [str(python), str(HERE / script)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp,  # mock mode writes ./generated/
        env=env,
        check=False,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    # ttnn logs to stdout too: the result is the line with the marker.
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    assert lines, f"{script} printed no result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    out: dict[str, object] = json.loads(lines[-1][len(MARKER) :])
    return out


def test_every_ttnn_call_in_ops_matches_the_real_signature(
    ttnn_python: Path, tmp_path: Path
) -> None:
    calls, attrs = extract()
    assert len(calls) > 30 and "transformer.chunk_gated_delta_rule" in {c.path for c in calls}
    req = {
        "calls": [[c.path, c.positional, list(c.keywords), c.where] for c in calls],
        "attrs": attrs,
    }
    out = _run(ttnn_python, "probe_signatures.py", json.dumps(req), tmp_path, mock=False)
    assert out["problems"] == [], "\n".join(out["problems"])  # type: ignore[arg-type]
    assert out["checked"] == len(calls) + len(attrs)


def test_signature_check_is_not_blind(ttnn_python: Path, tmp_path: Path) -> None:
    """The old argmax(use_multicore=...) keyword and a made-up op must both be reported."""
    req = {
        "calls": [["argmax", 1, ["dim", "use_multicore"], 1], ["transformer.no_such_op", 1, [], 2]],
        "attrs": ["no_such_dtype"],
    }
    out = _run(ttnn_python, "probe_signatures.py", json.dumps(req), tmp_path, mock=False)
    assert len(out["problems"]) == 3, out  # type: ignore[arg-type]


def test_host_tensors_match_numpy_under_mock_cluster(ttnn_python: Path, tmp_path: Path) -> None:
    out = _run(ttnn_python, "probe_layouts.py", "", tmp_path, mock=True)
    checks = out["checks"]
    assert isinstance(checks, list) and len(checks) > 40
    bad = [c for c in checks if not c["ok"]]
    assert not bad, bad


def test_require_device_fails_fast_with_real_ttnn_and_no_chips(ttnn_python: Path) -> None:
    with pytest.raises(NoDeviceError):
        n = probe_devices(str(ttnn_python), timeout_s=120)
        if n == 0:
            raise NoDeviceError("0 devices")
    with pytest.raises(SystemExit, match="ttnn"):
        require_device((0,), python=str(ttnn_python))
