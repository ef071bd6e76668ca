"""What a ledger line is tied to: git commit, dirty flag, a hash of the server sources, the
machine, and the server's /metrics counters.

Everything here only reads (``git rev-parse``, ``git status --porcelain``, files, HTTP GET).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIR = "tt_serve"
LEDGERS = "bench/runs"  # what the benches append to: not a change to what they measure


def _git(*args: str, root: Path = REPO_ROOT) -> str | None:
    try:
        res = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def source_hash(root: Path = REPO_ROOT, folder: str = SOURCE_DIR) -> str:
    """sha256 over the relative path and bytes of every file under ``folder`` (sorted), caches
    and compiled files excluded: the same sources give the same hash on any machine."""
    h = hashlib.sha256()
    base = root / folder
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def git_info(root: Path = REPO_ROOT) -> dict[str, Any]:
    """Commit, dirty flag and the source hash. Dirty: any tracked change or untracked file
    outside the ledgers (a sweep's second run is not dirty because its first one appended a
    line)."""
    status = _git("status", "--porcelain", "--", ".", f":(exclude){LEDGERS}", root=root)
    return {
        "commit": _git("rev-parse", "HEAD", root=root),
        "dirty": None if status is None else bool(status),
        "source_sha256": source_hash(root),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS")


def machine_info() -> dict[str, Any]:
    """CPU model, cores (total and usable), load average at the time, OS, Python, and the
    thread-count environment the arms inherit."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "loadavg": load,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "thread_env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ},
    }


def process_cpu_seconds(pid: int | None) -> float | None:
    """user + system CPU seconds of a process (all its threads), from /proc; None elsewhere.

    On a shared, noisy machine this is steadier than wall time: it counts the work the server
    did, not the time it waited for a core."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    # Fields after "(comm)": state is index 0, so utime (field 14) and stime (15) are 11 and 12.
    return (int(fields[11]) + int(fields[12])) / ticks


def steal_seconds() -> float | None:
    """Machine-wide CPU steal time so far (a VM's neighbours taking the cores), from /proc/stat."""
    try:
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(cpu[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {"name{labels}": value}; comments and NaN-free lines only."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            continue
    return out


def scrape(url: str, timeout: float = 30.0) -> dict[str, float]:
    """GET ``url``/metrics, parsed."""
    import httpx  # here, not at the top: the CUDA check imports this module without httpx

    resp = httpx.get(f"{url}/metrics", timeout=timeout)
    resp.raise_for_status()
    return parse_metrics(resp.text)


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after - before for every counter-like series (``_total``, ``_count``, ``_sum``)."""
    keys = [k for k in after if k.split("{")[0].endswith(("_total", "_count", "_sum"))]
    return {k: after[k] - before.get(k, 0.0) for k in sorted(keys)}


def hit_rate(deltas: dict[str, float], prefix: str = "tt_serve:") -> float | None:
    """Prefix-cache hit rate in tokens from counter deltas; None (N/A) with no queries."""
    queries = deltas.get(f"{prefix}prefix_cache_queries_total", 0.0)
    if queries <= 0:
        return None
    return deltas.get(f"{prefix}prefix_cache_hits_total", 0.0) / queries


def arguments(a: argparse.Namespace, *drop: str) -> dict[str, Any]:
    """A bench's command-line arguments as its ledger line's parameters: all but the ledger's
    own path and ``drop``."""
    return {k: v for k, v in vars(a).items() if k not in ("ledger", *drop)}


def append_ledger(path: Path, bench: str, **fields: Any) -> dict[str, Any]:
    """Append one ledger line to ``path``: ``bench``, a timestamp, git and machine provenance,
    then ``fields``. Returns the line."""
    import json
    import time

    line = {"bench": bench, "timestamp": time.time(), "git": git_info(), "machine": machine_info()}
    line |= fields
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(line) + "\n")
    return line
