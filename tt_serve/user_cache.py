"""Where tt-serve keeps what it makes on first use (the demo model, compiled kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME`` (or ``~/.cache``)/tt-serve."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tt-serve"
