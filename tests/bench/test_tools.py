"""Unit tests of the bench tools: workloads, metric definitions, ledger checks, report, plot."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.cache.report import ratios
from bench.common.provenance import counter_deltas, git_info, hit_rate, parse_metrics, source_hash
from bench.load.generator import RequestRecord, _one, run_async, summarize
from bench.load.ledger import check_line, differing_flag, flag_settings
from bench.load.plot import plot
from bench.load.workloads import WorkloadSpec, build, prompt_sha256


def _lens(spec: WorkloadSpec) -> list[list[int]]:
    """Request lengths per session, with answers of max_tokens ids re-sent as an agent does."""
    out = []
    for s in build(spec):
        convo: list[int] = []
        lens = []
        for t in s.turns:
            convo = (convo if t.resend else []) + list(t.ids)
            lens.append(len(convo))
            convo += [0] * spec.max_tokens
        out.append(lens)
    return out


def test_workloads_are_deterministic_and_sized() -> None:
    spec = WorkloadSpec.parse("agents:agents=3,turns=3,head=100,new=10,max_tokens=5,seed=7")
    assert build(spec) == build(spec)
    assert build(spec) != build(WorkloadSpec.parse("agents:agents=3,turns=3,head=100,seed=8"))
    sessions = build(spec)
    heads = {s.turns[0].ids[:100] for s in sessions}
    assert len(heads) == 1  # one shared head
    assert len({s.turns[0].ids for s in sessions}) == 3  # distinct first turns
    assert _lens(spec) == [[110, 125, 140]] * 3
    # nohead: the same request lengths, no shared head, nothing repeated.
    nohead = WorkloadSpec.parse("nohead:agents=3,turns=3,head=100,new=10,max_tokens=5,seed=7")
    assert _lens(nohead) == _lens(spec)
    firsts = [t.ids[:16] for s in build(nohead) for t in s.turns]
    assert len(set(firsts)) == len(firsts)
    sp = build(WorkloadSpec.parse("shared-prefix:groups=2,per_group=3,head=64,suffix=8"))
    assert len(sp) == 6 and len({s.turns[0].ids[:64] for s in sp}) == 2
    rnd = build(WorkloadSpec.parse("random:num=20,min_len=5,max_len=9,vocab=4096"))
    assert all(5 <= len(s.turns[0].ids) <= 9 for s in rnd)
    assert all(2048 <= t < 4096 for s in rnd for t in s.turns[0].ids)


@pytest.mark.parametrize("bad", ["nope", "agents:agents=0", "agents:colour=3", "random:num"])
def test_bad_workload_specs(bad: str) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec.parse(bad)


def test_prompt_hash_is_of_the_ids() -> None:
    assert prompt_sha256([1, 2]) != prompt_sha256([2, 1])
    assert len(prompt_sha256([1])) == 64


def test_metric_definitions_follow_vllm() -> None:
    a = RequestRecord(0, 0, 100, "h", ttft=0.5, e2el=2.5, output_tokens=5, itl=[0.5] * 4)
    a.tpot = (a.e2el - a.ttft) / (a.output_tokens - 1)  # type: ignore[operator]
    b = RequestRecord(1, 0, 50, "h", ttft=1.0, e2el=1.0, output_tokens=1)
    failed = RequestRecord(2, 0, 70, "h", error="HTTP 500")
    m = summarize([a, b, failed], makespan=4.0)["metrics"]
    assert (m["completed"], m["failed"]) == (2, 1)
    assert m["tpot_s"]["mean"] == pytest.approx(0.5)  # one-token requests have no TPOT
    assert m["ttft_s"]["p50"] == pytest.approx(0.75)
    assert m["itl_s"]["p99"] == pytest.approx(0.5)
    assert m["total_input_tokens"] == 150  # the failed request's prompt does not count
    assert m["output_throughput"] == pytest.approx(6 / 4.0)
    assert summarize([], 1.0)["metrics"]["ttft_s"]["p90"] is None


def test_failures_are_kept_never_retried() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    spec = WorkloadSpec.parse("agents:agents=2,turns=3,head=8,new=2,max_tokens=2")
    res = asyncio.run(run_async(f"http://127.0.0.1:{port}", spec, timeout=5))
    assert res["metrics"]["completed"] == 0 and res["metrics"]["failed"] == 6
    later = [r for r in res["requests"] if r["turn"] > 0]
    assert all("earlier turn" in r["error"] for r in later)


def test_flags_must_differ_by_exactly_one() -> None:
    common = ["--kv-blocks", "64", "--log-level", "warning"]
    assert differing_flag([*common, "--prefix-caching"], [*common, "--no-prefix-caching"]) == (
        "prefix-caching"
    )
    assert differing_flag(["--prefill-chunk", "256"], ["--prefill-chunk=512"]) == "prefill-chunk"
    with pytest.raises(ValueError):
        differing_flag(common, common)
    with pytest.raises(ValueError):
        differing_flag(["--prefill-chunk", "256", "--x"], ["--prefill-chunk", "512"])
    assert flag_settings(["--no-x", "--y", "3"]) == {"x": "false", "y": "3"}


def test_counters_and_hit_rate() -> None:
    before = parse_metrics(
        "# HELP x\ntt_serve:prefix_cache_queries_total 10.0\ntt_serve:prefix_cache_hits_total 4\n"
        'tt_serve:request_success_total{finished_reason="length"} 1.0\ntt_serve:num_running 3\n'
    )
    after = dict(before, **{"tt_serve:prefix_cache_queries_total": 30.0})
    after["tt_serve:prefix_cache_hits_total"] = 14.0
    d = counter_deltas(before, after)
    assert "tt_serve:num_running" not in d
    assert hit_rate(d) == pytest.approx(0.5)
    assert hit_rate(counter_deltas(before, before)) is None  # N/A: no queries


def test_source_hash_tracks_content(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    h = source_hash(tmp_path, "pkg")
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    assert source_hash(tmp_path, "pkg") != h


def test_a_ledger_line_does_not_make_the_next_run_dirty(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "tt_serve").mkdir()
    (tmp_path / "tt_serve" / "a.py").write_text("x = 1\n")
    (tmp_path / "bench" / "runs").mkdir(parents=True)
    ledger = tmp_path / "bench" / "runs" / "x.jsonl"
    ledger.write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    assert git_info(tmp_path)["dirty"] is False
    with ledger.open("a") as f:  # the first run of a sweep appended its line
        f.write("{}\n")
    (tmp_path / "bench" / "runs" / "new.jsonl").write_text("{}\n")
    assert git_info(tmp_path)["dirty"] is False
    (tmp_path / "tt_serve" / "a.py").write_text("x = 2\n")
    assert git_info(tmp_path)["dirty"] is True


def _phase(makespan: float, ttfts: list[float], cached: list[int], cpu: float) -> dict[str, Any]:
    reqs = [
        {"prompt_len": 4160, "cached_tokens": c, "ttft": t, "error": None}
        for t, c in zip(ttfts, cached, strict=True)
    ]
    metrics = {
        "makespan_s": makespan,
        "completed": len(reqs),
        "failed": 0,
        **{k: {"p50": ttfts[0]} for k in ("ttft_s", "tpot_s", "itl_s", "e2el_s")},
    }
    return {
        "metrics": metrics,
        "server": {},
        "hit_rate": 0.5 if any(cached) else None,
        "server_cpu_s": cpu,
        "noise": {},
        "prompt_sha256": ["h"] * len(reqs),
        "requests": reqs,
        "errors": [],
    }


def _line(r: int) -> dict[str, Any]:
    on = {
        "prefix4k": _phase(11.0, [10.0, 0.15, 0.15], [0, 4096, 4096], 5.0),
        "agents": _phase(10.0, [1.0], [0], 10.0),
        "nohead": _phase(102.0, [1.0], [0], 100.0),
    }
    off = {
        "prefix4k": _phase(30.0, [10.0, 10.0, 10.0], [0, 0, 0], 30.0),
        "agents": _phase(100.0, [1.0], [0], 100.0),
        "nohead": _phase(100.0, [1.0], [0], 100.0),
    }
    return {
        "version": {"ledger": 1},
        "name": "t",
        "round": r,
        "timestamp": "x",
        "order": ["A", "B"] if r % 2 else ["B", "A"],
        "git": {"commit": None, "dirty": None, "source_sha256": "0"},
        "machine": {"cpu_model": "cpu", "cores": 2},
        "arms": {"A": {"label": "on", "flags": []}, "B": {"label": "off", "flags": []}},
        "differing_flag": "prefix-caching",
        "phases": {key: {} for key in on},
        "results": {"A": on, "B": off},
    }


def test_report_ratios_and_schema_check() -> None:
    lines = [_line(1), _line(2)]
    assert all(check_line(x) == [] for x in lines)
    broken = json.loads(json.dumps(lines[0]))
    del broken["results"]["B"]["agents"]["hit_rate"], broken["git"]
    assert check_line(broken) == ["missing key git"]
    broken["git"] = lines[0]["git"]
    assert check_line(broken) == ["results.B.agents.hit_rate missing"]
    rows = {r["phase"] + r["target"]: r for r in ratios(lines)}
    assert rows["prefix4k<= 0.05"]["median"] == pytest.approx(0.015)
    assert rows["prefix4k>= 0.8"]["median"] == pytest.approx((64 / 0.15) / (4160 / 10.0))
    assert rows["agents<= 0.15"]["median"] == pytest.approx(0.1)
    assert rows["agents<= 0.15"]["cpu_median"] == pytest.approx(0.1)
    assert rows["nohead<= 1.03"]["median"] == pytest.approx(1.02)
    assert all(r["met"] for r in rows.values())


@pytest.mark.slow
def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = plot([_line(1), _line(2)], tmp_path / "charts" / "t.png", title="t")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_step_policy_runs_both_policies_and_writes_a_line(tmp_path: Path) -> None:
    from bench.scheduling import step_policy
    from tests import tiny_models as tm

    model = tm.make_dense(tmp_path / "dense", seed=0)
    ledger = tmp_path / "sp.jsonl"
    argv = ["--model", str(model), "--requests", "3", "--prompt", "40", "--output", "3"]
    assert step_policy.main([*argv, "--rounds", "2", "--ledger", str(ledger)]) == 0
    (line,) = [json.loads(t) for t in ledger.read_text().splitlines()]
    assert set(line["rounds"]) == {"mixed", "prefill_first"}
    assert all(len(v) == 2 for v in line["rounds"].values())
    for res in line["medians"].values():
        assert res["max_ttft_s"] > 0 and res["output_tok_s"] > 0


def test_gdn_kernel_bench_writes_both_arms(tmp_path: Path) -> None:
    from bench.kernels import gdn
    from tt_serve.model.ref.gdn import fused_kernels

    if fused_kernels() is None:
        pytest.skip("no C compiler")
    ledger = tmp_path / "gdn.jsonl"
    args = ["--shapes", "decode_b1", "span_64", "--calls", "1", "--rounds", "1"]
    assert gdn.main([*args, "--ledger", str(ledger)]) == 0
    (line,) = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert set(line["results_ms"]) == {"decode_b1", "span_64"}
    for r in line["results_ms"].values():
        assert r["fused_c"] > 0 and r["torch_ops"] > 0 and r["speedup"] > 0


def test_streams_are_read_to_the_end_so_the_connection_is_reused() -> None:
    """``bench.load.generator._one`` reads past ``[DONE]``: two requests in a row share one
    connection (a response left unread closes it, and every TTFT would pay a reconnect)."""
    from bench.cache.warm_path import _answer

    connections = 0

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _answer(reader, writer)

    recs = asyncio.run(_requests_in_a_row(counted, 2))
    assert all(r.error is None and r.ttft is not None and r.output_tokens == 1 for r in recs)
    assert connections == 1


async def _requests_in_a_row(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]], n: int
) -> list[RequestRecord]:
    """``n`` streaming requests one after another, through one client, to a loopback server
    that runs ``handler`` per connection."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    recs = [RequestRecord(0, i, 3, "") for i in range(n)]
    async with server, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for rec in recs:
            await _one(client, rec, {"prompt": [1, 2, 3], "stream": True}, 0.0)
    return recs


@pytest.mark.slow
def test_warm_path_splits_a_warm_ttft(tiny_model: Path, tmp_path: Path) -> None:
    from bench.cache import warm_path

    ledger = tmp_path / "wp.jsonl"
    argv = [
        "--model", str(tiny_model), "--threads", "1", "--head", "128", "--suffix", "8",
        "--heads", "1", "--requests", "2", "--rounds", "2", "--ledger", str(ledger),
        "--log-dir", str(tmp_path / "logs"),
        "--tt-args", "--kv-blocks 64 --block-size 16 --prefill-chunk 64",
    ]  # fmt: skip
    assert warm_path.main(argv) == 0
    (line,) = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert [r["order"] for r in line["rounds"]] == [
        ["client", "engine", "http"],
        ["http", "engine", "client"],
    ]
    for r in line["rounds"]:
        assert r["http"]["warm_cached_tokens"] > 0  # a real hit
        for part in ("http", "engine"):
            assert r[part]["warm_ms"] > 0 and r[part]["cold_ms"] > 0
        assert r["client"]["warm_ms"] > 0
    s = line["summary"]
    parts = s["client"]["warm_ms"] + s["engine"]["warm_ms"] + s["server_ms"]
    assert s["http"]["warm_ms"] == pytest.approx(parts)  # medians of two rounds: means
    assert line["params"]["tt_args"].startswith("--kv-blocks")


def test_a_request_on_a_dropped_kept_alive_connection_is_sent_once_more() -> None:
    """A server that drops a kept-alive connection as the next request arrives (read, never
    answered): the request goes out once more on a new connection instead of failing."""
    from bench.cache.warm_path import _answer

    connections = 0

    async def one_per_connection(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal connections
        connections += 1
        first = await reader.readuntil(b"\r\n\r\n")
        size = int(first.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        body = await reader.readexactly(size)
        replay = asyncio.StreamReader()
        replay.feed_data(first + body)
        replay.feed_eof()
        await _answer(replay, _Unclosed(writer))  # the first request is answered ...
        await reader.readuntil(b"\r\n\r\n")  # ... the second is read, and the connection dropped
        writer.close()

    recs = asyncio.run(_requests_in_a_row(one_per_connection, 3))
    assert [r.error for r in recs] == [None, None, None]
    assert all(r.ttft is not None and r.output_tokens == 1 for r in recs)
    assert connections == 3


class _Unclosed:
    """A stream writer whose close() is left to its owner."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        pass
