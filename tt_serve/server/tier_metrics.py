"""Prometheus metrics of the prefix cache's host and disk tiers (``cache/tiers.py``), read from
the engine's last published ``EngineStats`` at scrape time. Nothing is exported when no tier
is configured."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tt_serve.engine.engine import EngineStats

P = "tt_serve:"


class TierCollector(Collector):
    """Hits and bytes per tier, restores and their latency, write-backs, disk errors."""

    def __init__(self, gauges: Callable[[], EngineStats | None]) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        s = self._gauges()
        t = s.tiers if s is not None else None
        if t is None:
            return
        hits = CounterMetricFamily(
            f"{P}cache_tier_hits",
            "Requests resumed from a unit restored from a tier.",
            labels=["tier"],
        )
        tokens = CounterMetricFamily(
            f"{P}cache_tier_hit_tokens", "Prompt tokens those restores spared.", labels=["tier"]
        )
        used = GaugeMetricFamily(f"{P}cache_tier_bytes", "Bytes a tier holds.", labels=["tier"])
        budget = GaugeMetricFamily(
            f"{P}cache_tier_budget_bytes", "Bytes a tier may hold.", labels=["tier"]
        )
        units = GaugeMetricFamily(
            f"{P}cache_tier_units",
            "Resume-point units (snapshot + its KV) a tier holds.",
            labels=["tier"],
        )
        evictions = CounterMetricFamily(
            f"{P}cache_tier_evictions", "Units a tier evicted for room.", labels=["tier"]
        )
        for name, h, ht, b, bb, u, e in (
            ("host", t.host_hits, t.host_hit_tokens, t.host_bytes, t.host_budget_bytes,
             t.host_units, t.host_evictions),
            ("disk", t.disk_hits, t.disk_hit_tokens, t.disk_bytes, t.disk_budget_bytes,
             t.disk_units, t.disk_evictions),
        ):  # fmt: skip
            hits.add_metric([name], h)
            tokens.add_metric([name], ht)
            used.add_metric([name], b)
            budget.add_metric([name], bb)
            units.add_metric([name], u)
            evictions.add_metric([name], e)
        yield from (hits, tokens, used, budget, units, evictions)
        yield CounterMetricFamily(
            f"{P}cache_tier_restores", "Units restored to the device.", value=t.restores
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_restore_seconds",
            "Seconds spent restoring units (fetch from the tier + device write), summed.",
            value=t.restore_seconds,
        )
        yield GaugeMetricFamily(
            f"{P}cache_tier_restore_seconds_max",
            "The slowest restore so far.",
            value=t.restore_seconds_max,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_restore_bytes",
            "Bytes written to the device by restores.",
            value=t.restore_bytes,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_writethrough_seconds",
            "Engine-thread seconds spent reading units out of the device for the tiers.",
            value=t.writethrough_seconds,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_units_stored",
            "Units written through from the device.",
            value=t.units_stored,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_writebacks_queued",
            "Disk write-backs queued.",
            value=t.writebacks_queued,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_writebacks_dropped",
            "Disk write-backs dropped because the queue was full (the unit stays on the host).",
            value=t.writebacks_dropped,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_writebacks_skipped",
            "Units the disk write-back policy kept off the disk (diskWriteback resume).",
            value=t.writebacks_skipped,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_disk_written_bytes",
            "Bytes this server wrote to the disk tier (unit and block files).",
            value=t.disk_bytes_written,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_disk_reads_ahead",
            "Disk units the reader thread read for a waiting request.",
            value=t.disk_reads_ahead,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_disk_read_wait_seconds",
            "Seconds requests waited for their disk units, from queueing the read to taking it.",
            value=t.disk_read_wait_seconds,
        )
        yield GaugeMetricFamily(
            f"{P}cache_tier_disk_read_ahead_bytes",
            "Bytes of disk units read or being read, not yet taken (bounded by diskReadAheadMb).",
            value=t.disk_read_ahead_bytes,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_disk_reads_dropped",
            "Disk units read ahead that no request took (it ended meanwhile).",
            value=t.disk_reads_dropped,
        )
        yield GaugeMetricFamily(
            f"{P}cache_tier_writebacks_pending",
            "Disk write-backs not yet written.",
            value=t.writebacks_pending,
        )
        yield GaugeMetricFamily(
            f"{P}cache_tier_writebacks_pending_bytes",
            "Bytes of disk write-backs not yet written (bounded; past it they are dropped).",
            value=t.writebacks_pending_bytes,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_disk_errors",
            "Disk tier I/O errors (the first write error turns the disk tier off).",
            value=t.disk_errors,
        )
        yield CounterMetricFamily(
            f"{P}cache_tier_disk_corrupt",
            "Disk tier files that failed their checks on read (a miss; the file is removed).",
            value=t.disk_corrupt,
        )
        yield GaugeMetricFamily(
            f"{P}cache_tier_disk_enabled", "1 while the disk tier is on.", value=int(t.disk_enabled)
        )
