"""Helpers for tests/nix: find Nix (Debian's nix-bin), run it, locate the repository files.

Without Nix the tests skip with the reason printed; with REQUIRE_NIX=1 (CI) they fail instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAKE_FLAGS = [
    "--extra-experimental-features",
    "nix-command flakes",
    "--option",
    "substituters",
    "",
]


def nix_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} not found: install Debian's nix-bin (`make nix-tools`)"
        if os.environ.get("REQUIRE_NIX"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def run(cmd: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def nix_eval_json(expr: str, **argstrs: str) -> Any:
    """`nix-instantiate --eval --strict --json -E expr` in the repository root."""
    cmd = [nix_tool("nix-instantiate"), "--eval", "--strict", "--json", "-E", expr]
    for key, value in argstrs.items():
        cmd += ["--argstr", key, value]
    result = run(cmd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def eval_module_stub(settings: dict[str, Any]) -> dict[str, Any]:
    """The module evaluated against the stand-in lib (tests/nix/eval-stub.nix)."""
    cmd = [nix_tool("nix-instantiate"), "--eval", "--strict", "--json", "tests/nix/eval-stub.nix"]
    result = run([*cmd, "--argstr", "settings", json.dumps(settings)])
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def repo_files(pattern: str = "") -> list[str]:
    """Tracked files plus untracked ones git does not ignore (what a commit would hold)."""
    cmd = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    result = run([*cmd, *([pattern] if pattern else [])])
    assert result.returncode == 0, result.stderr
    return sorted({line for line in result.stdout.splitlines() if (ROOT / line).exists()})
