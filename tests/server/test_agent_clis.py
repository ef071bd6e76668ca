"""Codex CLI and Claude Code, installed from npm (pinned), each complete a non-interactive prompt
against a local server (``scripts/agent-clis``): ``codex exec`` over the Responses API and
``claude -p`` over the Messages API exit 0 with the model's text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("npm") is None, reason="npm is not installed (the CLIs come from npm)"
)
def test_codex_and_claude_code_complete_a_prompt(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
    }
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts/agent-clis"), "--json", "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    summary = json.loads(p.stdout)
    results = {r["cli"]: r for r in summary["results"]}
    assert set(results) == {"codex", "claude"}
    for r in results.values():
        assert r["rc"] == 0 and r["ok"] and r["text"], r
