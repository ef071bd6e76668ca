"""Finding and opening a Tenstorrent device, and failing fast when there is none.

Probing runs in a subprocess: without chips, several ttnn entry points abort the whole process
(TT_FATAL) instead of raising, and a server must print a clear message rather than die mid-import.
"""

from __future__ import annotations

import subprocess
import sys

PROBE_TIMEOUT_S = 120
_PROBE = "import ttnn, sys\nn = ttnn.GetNumAvailableDevices()\nprint('TT_DEVICES', n)\n"


class NoDeviceError(RuntimeError):
    """ttnn is missing or no Tenstorrent device can be opened."""


def probe_devices(python: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> int:
    """Number of Tenstorrent devices ttnn sees, asked in a subprocess; raises NoDeviceError."""
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise NoDeviceError(
            f"probing for Tenstorrent devices timed out after {timeout_s}s"
        ) from exc
    for line in proc.stdout.splitlines():
        if line.startswith("TT_DEVICES "):
            return int(line.split()[1])
    err = (proc.stderr or proc.stdout).strip().splitlines()
    tail = err[-1] if err else f"exit status {proc.returncode}"
    if "No module named 'ttnn'" in (proc.stderr or ""):
        raise NoDeviceError(
            "the ttnn backend needs the ttnn package (ttnn==0.81.1, Python 3.10 or 3.12), "
            "which is not installed in this Python"
        )
    raise NoDeviceError(f"no Tenstorrent device could be opened ({tail})")


def require_device(device_ids: tuple[int, ...], *, python: str | None = None) -> None:
    """Exit with a clear message unless ttnn imports and every requested device exists."""
    try:
        n = probe_devices(python)
    except NoDeviceError as exc:
        raise SystemExit(f"tt-serve: --backend ttnn: {exc}") from None
    if n <= 0:
        raise SystemExit("tt-serve: --backend ttnn: no Tenstorrent device found (ttnn sees 0)")
    missing = [i for i in device_ids if i >= n]
    if missing:
        raise SystemExit(
            f"tt-serve: --backend ttnn: device ids {missing} requested, ttnn sees {n} device(s)"
        )
