"""``--json`` commands print only their JSON on stdout: what anything else writes to file
descriptor 1 meanwhile (a C++ library's log lines, as tt-metal's) goes to stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tt_serve import cli


def test_json_stdout_moves_other_writes_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    with cli.json_stdout(to_exit=False):
        os.write(1, b"2026-12-07 | info | Device | Opening user mode device driver\n")
        print(json.dumps({"ok": True}))
    out, err = capfd.readouterr()
    assert json.loads(out) == {"ok": True}
    assert "Opening user mode device driver" in err
    print("after")  # descriptor 1 is back
    assert capfd.readouterr().out == "after\n"


def test_json_stdout_to_exit_covers_writes_after_the_command() -> None:
    """A process that exits after the command keeps descriptor 1 on stderr: what its
    destructors log at exit does not follow the JSON."""
    code = (
        "import atexit, json, os\n"
        "from tt_serve import cli\n"
        "atexit.register(lambda: os.write(1, b'closing devices\\n'))\n"
        "with cli.json_stdout(to_exit=True):\n"
        "    print(json.dumps({'n': 1}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"n": 1} and "closing devices" in p.stderr
