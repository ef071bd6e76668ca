"""The mock tier's ttnn interpreter: the Python 3.12 venv with ttnn 0.81.1, the stand-in
compiler and the trace shim (scripts/setup-ttnn-venv); without them the tests skip with the
reason printed, unless REQUIRE_TTNN=1 (CI) makes that a failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tt.mock.test_boards import PYTHON, VENV, _sfpi_compiler
from tt_serve.model.tt.plan import mock


@pytest.fixture(scope="session")
def ttnn_python() -> Path:
    reason = ""
    if not PYTHON.exists():
        reason = f"no ttnn venv at {VENV} (run scripts/setup-ttnn-venv)"
    elif not _sfpi_compiler():
        reason = "no SFPI compiler or stand-in in the ttnn venv (run scripts/setup-ttnn-venv)"
    elif mock.trace_shim(str(PYTHON)) is None:
        reason = (
            "no mock trace shim in the ttnn venv (run scripts/setup-ttnn-venv with a C compiler)"
        )
    if reason:
        if os.environ.get("REQUIRE_TTNN") == "1":
            pytest.fail(reason + "; REQUIRE_TTNN=1")
        print(f"SKIP tt mock engine: {reason}")
        pytest.skip(reason)
    return PYTHON
