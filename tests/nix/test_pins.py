"""scripts/check-pins: pins are well formed and used, patches are listed with headers.

The real download check (pip --require-hashes against PyPI) is opt-in because the ttnn wheel
is ~100 MB: set TT_SERVE_VERIFY_PINS=1.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.nix.nixtools import ROOT, run

SCRIPT = ROOT / "scripts" / "check-pins"


def check(root: Path, *extra: str) -> tuple[int, str]:
    result = run([sys.executable, str(SCRIPT), "--root", str(root), *extra])
    return result.returncode, result.stdout + result.stderr


def scratch_copy(tmp_path: Path) -> Path:
    for part in ("flake.nix", "nix", "modules", "patches", "hosts"):
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, tmp_path / part)
        else:
            shutil.copy2(src, tmp_path / part)
    return tmp_path


def test_repository_pins_pass() -> None:
    code, out = check(ROOT)
    assert code == 0, out


def test_malformed_hash_is_refused(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path)
    pins = json.loads((root / "nix/pins.json").read_text())
    pins["ttnn"]["hash"] = "sha256-tooshort="
    (root / "nix/pins.json").write_text(json.dumps(pins))
    code, out = check(root)
    assert code == 1 and "ttnn: hash must be SRI" in out


def test_unused_pin_and_inline_hash_are_refused(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path)
    pins = json.loads((root / "nix/pins.json").read_text())
    pins["orphan"] = dict(pins["ttnn"])
    (root / "nix/pins.json").write_text(json.dumps(pins))
    inline = 'hash = "sha256-' + "A" * 43 + '=";'
    (root / "modules/extra.nix").write_text("{ src = { " + inline + " }; }\n")
    code, out = check(root)
    assert code == 1
    assert "orphan: pinned but not used" in out
    assert "modules/extra.nix:1: inline hash" in out


def test_unlisted_or_headerless_patch_is_refused(tmp_path: Path) -> None:
    root = scratch_copy(tmp_path)
    (root / "patches/0001-x.patch").write_text("--- a/x\n+++ b/x\n")
    code, out = check(root)
    assert code == 1 and "0001-x.patch is not listed" in out
    with (root / "patches/series").open("a") as fh:
        fh.write("0001-x.patch\n")
    code, out = check(root)
    assert code == 1 and "lacks a 'Why:' line" in out


@pytest.mark.skipif(
    not os.environ.get("TT_SERVE_VERIFY_PINS"),
    reason="downloads ~100 MB from PyPI; set TT_SERVE_VERIFY_PINS=1",
)
def test_pypi_pins_verify_for_real() -> None:
    code, out = check(ROOT, "--verify-pypi")
    assert code == 0, out
