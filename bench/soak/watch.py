"""The server process over time: RSS, open file descriptors and threads (``/proc/<pid>``) and the
bytes of the disk tier's folder, sampled about once a second; and the least-squares slope of a
series after warm-up, which a leak makes grow without bound while a clean server stays flat.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SERIES = ("rss_mib", "fds", "threads", "disk_mib")


@dataclass
class Sample:
    t: float
    """Seconds since the watch started."""
    rss_mib: float
    fds: int
    threads: int
    disk_mib: float


def folder_bytes(folder: Path | None) -> int:
    """Bytes of the files under ``folder``; files that vanish while it is walked (the tier
    evicting) are skipped."""
    if folder is None:
        return 0
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def sample(pid: int, disk: Path | None, t: float) -> Sample | None:
    """One reading of ``pid``; None once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields:  # exiting: a zombie has no memory left to report
        return None
    rss_kib = int(fields["VmRSS"].split()[0])
    threads = int(fields["Threads"])
    return Sample(t, rss_kib / 1024, fds, threads, folder_bytes(disk) / (1 << 20))


@dataclass
class Watch:
    """Samples ``pid`` every ``period_s`` in a thread, from ``start()`` to ``stop()``."""

    pid: int
    disk: Path | None = None
    period_s: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="soak-watch", daemon=True)
        self._thread.start()

    def now(self) -> float:
        """Seconds since ``start()`` (the samples' clock)."""
        return time.monotonic() - self._t0

    def _run(self) -> None:
        while not self._stop.is_set():
            s = sample(self.pid, self.disk, self.now())
            if s is None:
                return
            self.samples.append(s)
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def slope(ts: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``ts`` (units of y per unit of t); None with fewer
    than two distinct times."""
    n = len(ts)
    if n < 2:
        return None
    mt, my = sum(ts) / n, sum(ys) / n
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return None
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var


def per_minute(samples: list[Sample], name: str, since: float, until: float) -> float | None:
    """Slope of series ``name`` per minute over the samples in [``since``, ``until``]."""
    window = [s for s in samples if since <= s.t <= until]
    fit = slope([s.t for s in window], [float(getattr(s, name)) for s in window])
    return None if fit is None else fit * 60.0
