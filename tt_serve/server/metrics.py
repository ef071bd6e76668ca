"""Prometheus metrics with vLLM-like names under ``tt_serve:``.

Engine-side numbers (prefix-cache queries and hits in tokens, computed tokens, running / waiting
requests, KV and snapshot usage, failed steps, where rows were sampled) are read from the
engine's last published ``EngineStats`` at scrape time; per-request numbers (latencies, token
counters, finish reasons) are recorded by the server as outputs arrive.
Each app gets its own registry, so several servers can live in one process (tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tt_serve.engine.engine import EngineStats
from tt_serve.sequence import RequestOutput
from tt_serve.server.tier_metrics import TierCollector

P = "tt_serve:"
_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
_ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
)

_TOKEN_BUCKETS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class _EngineCollector(Collector):
    def __init__(self, gauges: Callable[[], EngineStats | None]) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        s = self._gauges() or EngineStats()
        yield CounterMetricFamily(
            f"{P}prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            value=s.prefix_queries,
        )
        yield CounterMetricFamily(
            f"{P}prefix_cache_hits",
            "Prompt tokens served from the prefix cache.",
            value=s.prefix_hits,
        )
        yield CounterMetricFamily(
            f"{P}prefill_tokens_computed",
            "Prompt tokens actually computed by the backend.",
            value=s.prefill_tokens_computed,
        )
        yield CounterMetricFamily(
            f"{P}decode_tokens_computed",
            "Decode tokens computed by the backend.",
            value=s.decode_tokens_computed,
        )
        sampled = CounterMetricFamily(
            f"{P}sampled_rows",
            "Batch rows whose next token was picked on the device (argmax or a device draw) or "
            "on the host (from the logits).",
            labels=["where"],
        )
        sampled.add_metric(["device"], s.sampled_rows_device)
        sampled.add_metric(["host"], s.sampled_rows_host)
        yield sampled
        yield CounterMetricFamily(
            f"{P}failed_steps",
            "Engine steps whose backend call raised (their requests failed).",
            value=s.failed_steps,
        )
        yield CounterMetricFamily(
            f"{P}pipelined_decode_steps",
            "Decode steps submitted before the previous step's ids were read (deviceResident).",
            value=s.pipelined_decode_steps,
        )
        yield GaugeMetricFamily(
            f"{P}num_requests_running", "Requests in the running batch.", value=s.num_running
        )
        yield GaugeMetricFamily(
            f"{P}num_requests_waiting", "Requests waiting for admission.", value=s.num_waiting
        )
        usage = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
        yield GaugeMetricFamily(
            f"{P}kv_cache_usage_perc",
            "Fraction of KV blocks held by requests (1 = full).",
            value=usage,
        )
        yield GaugeMetricFamily(
            f"{P}kv_cache_blocks_used",
            "KV blocks held by running requests.",
            value=s.kv_blocks_used,
        )
        yield GaugeMetricFamily(
            f"{P}snapshot_slots_used",
            "GDN snapshot slots holding a snapshot.",
            value=s.snapshot_slots_used,
        )
        yield GaugeMetricFamily(
            f"{P}snapshot_slots_total",
            "GDN snapshot slots allocated.",
            value=s.snapshot_slots_total,
        )
        yield GaugeMetricFamily(
            f"{P}snapshots_held",
            "GDN snapshots published in the prefix cache (hits can resume there).",
            value=s.snapshots_held,
        )
        yield GaugeMetricFamily(
            f"{P}snapshots_per_conversation_peak",
            "Most GDN snapshots one request's path has held (bounded by "
            "--snapshots-per-conversation).",
            value=s.snapshots_per_conversation_peak,
        )
        resumes = CounterMetricFamily(
            f"{P}prefix_cache_resumes",
            "Requests that resumed from a snapshot, by the kind of point: a chat message start, "
            "the last grid point before a prompt end, or a prefill-chunk multiple.",
            labels=["kind"],
        )
        resumes.add_metric(["message"], s.resumes_message)
        resumes.add_metric(["prompt_end"], s.resumes_prompt_end)
        resumes.add_metric(["chunk"], s.resumes_chunk)
        yield resumes


class Metrics:
    def __init__(self, gauges: Callable[[], EngineStats | None]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(_EngineCollector(gauges))
        r.register(TierCollector(gauges))
        self.ttft = Histogram(
            f"{P}time_to_first_token_seconds",
            "Time to first token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            f"{P}inter_token_latency_seconds",
            "Time between output tokens.",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            f"{P}e2e_request_latency_seconds",
            "End-to-end request latency.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue = Histogram(
            f"{P}request_queue_time_seconds",
            "Time spent waiting.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            f"{P}prompt_tokens", "Prompt tokens of finished requests.", registry=r
        )
        self.generation_tokens = Counter(f"{P}generation_tokens", "Generated tokens.", registry=r)
        self.recomputed = Histogram(
            f"{P}prompt_tokens_recomputed",
            "Prompt tokens a finished request computed (its prompt less the prefix-cache hit).",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.api_requests = Counter(
            f"{P}api_requests",
            "Generation and token-counting requests received, per API (chat, completions, "
            "responses, messages, count_tokens, tokenize, detokenize).",
            ["api"],
            registry=r,
        )
        self.finished = Counter(
            f"{P}request_success",
            "Finished requests by finish reason.",
            ["finished_reason"],
            registry=r,
        )

    def observe(self, out: RequestOutput, last_token_time: dict[str, float]) -> None:
        """One output as it reaches its client: the inter-token latency (``last_token_time``
        keeps each request's last token time) and, at the end, the request's totals."""
        if out.new_token_ids:
            t = time.monotonic()
            prev = last_token_time.get(out.request_id)
            if prev is not None:
                self.itl.observe(max(t - prev, 0.0))
            last_token_time[out.request_id] = t
        if out.finished:
            self._finished(out)

    def _finished(self, out: RequestOutput) -> None:
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        self.recomputed.observe(len(out.prompt_token_ids) - out.cached_tokens)
        self.generation_tokens.inc(len(out.token_ids))
        self.finished.labels(finished_reason=out.finish_reason or "abort").inc()
        if out.first_token_time is not None:
            self.ttft.observe(max(out.first_token_time - out.arrival_time, 0.0))
        if out.finished_time is not None:
            self.e2e.observe(max(out.finished_time - out.arrival_time, 0.0))
        if out.first_scheduled_time is not None:
            self.queue.observe(max(out.first_scheduled_time - out.arrival_time, 0.0))
