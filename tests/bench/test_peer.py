"""bench/peer: argument parsing, the ratio orientation, medians over rounds, the greedy cross-check,
the table, llama-server's command line and probe parsing (no llama.cpp needed: a fake binary and
a mock transport), and the whole harness against a second tt-serve standing in for the peer."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.peer import harness, summary
from bench.peer.measures import LoadSample, Shape, Sizes, load_between
from bench.peer.servers import LlamaServerSide, Slots, TtServeSide

LLAMA = ["--llama-server", "llama-server", "--gguf", "m.gguf"]


# -- arguments -----------------------------------------------------------------------------------


def test_defaults_are_the_issue_sizes() -> None:
    a = harness.parse_args(LLAMA)
    assert (a.threads, a.rounds, a.ledger) == (2, 4, "bench/runs/peer.jsonl")
    assert a.measures == ["prefix", "prefill", "decode", "c8", "c32", "sampled"]
    s = harness.sizes_of(a)
    assert (s.prefix_head, s.prefix_suffix, s.prefill, s.decode_tokens) == (4096, 64, 2048, 128)
    assert (s.c8, s.c32, s.sampled) == (Shape(8, 512, 128), Shape(32, 256, 64), Shape(8, 64, 96))
    assert s.crosscheck_tokens == 16 and s.top_k == 5 and s.long == ()


def test_long_lengths_add_the_long_measure() -> None:
    a = harness.parse_args([*LLAMA, "--measures", "decode", "--long", "2048,8192,30000"])
    assert a.measures == ["decode", "long"]
    assert harness.sizes_of(a).long == (2048, 8192, 30000)


@pytest.mark.parametrize(
    "argv",
    [
        [],  # llama-server and gguf are required for the real peer
        ["--llama-server", "x"],
        [*LLAMA, "--measures", "decode,bogus"],
        [*LLAMA, "--c8", "8x512"],
        [*LLAMA, "--c8", "0x512+128"],
        [*LLAMA, "--measures", "long"],  # long needs lengths
        [*LLAMA, "--long", "2048,-1"],
        [*LLAMA, "--rounds", "0"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        harness.parse_args(argv)


def test_stand_in_peer_needs_no_llama_paths() -> None:
    a = harness.parse_args(["--peer-kind", "tt-serve"])
    assert a.peer_kind == "tt-serve" and a.llama_server is None


def test_shape_round_trips() -> None:
    assert Shape.parse("32x256+64") == Shape(32, 256, 64)
    assert str(Shape(8, 64, 96)) == "8x64+96"


def test_groups_and_order() -> None:
    assert harness.groups_for(["decode"]) == [("single", ["crosscheck", "decode"])]
    groups = harness.groups_for(["c32", "sampled", "prefix"])
    assert groups == [
        ("single", ["crosscheck", "prefix"]),
        ("c8", ["sampled"]),
        ("c32", ["c32"]),
    ]
    assert [harness.order_of(r) for r in (1, 2, 3, 4)] == [
        ["tt", "peer"],
        ["peer", "tt"],
        ["tt", "peer"],
        ["peer", "tt"],
    ]


def test_slots_hold_each_groups_longest_request() -> None:
    s = Sizes(long=(2048, 30000))
    assert s.slots("single") == Slots(1, 4096 + 64 + 1)
    assert s.slots("c8") == Slots(8, 640)
    assert s.slots("c32") == Slots(32, 320)
    assert s.slots("long") == Slots(1, 30000 + 64 + 1)
    # llama-server divides -c by --parallel: every slot gets the whole request, rounded up.
    assert Slots(32, 320).llama_ctx() == 32 * 512
    assert Slots(1, 4161).llama_ctx() == 4352


# -- ratio, medians, cross-check, table ----------------------------------------------------------


def test_ratio_is_oriented_so_above_one_means_tt_serve_better() -> None:
    assert summary.ratio(200.0, 100.0, "higher") == 2.0  # tok/s: more is better
    assert summary.ratio(0.05, 0.10, "lower") == 2.0  # seconds: less is better
    assert summary.ratio(50.0, 100.0, "higher") == 0.5
    assert summary.ratio(None, 1.0, "lower") is None
    assert summary.ratio(0.0, 1.0, "higher") is None
    with pytest.raises(ValueError):
        summary.ratio(1.0, 1.0, "sideways")


def _round(n: int, tt: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    def side(ms: dict[str, Any]) -> dict[str, Any]:
        return {
            name: {"metrics": m, "error": None, "load": {"foreign_cores": 0.1, "steal_s": 0.0}}
            for name, m in ms.items()
        }

    return {"round": n, "order": harness.order_of(n), "sides": {"tt": side(tt), "peer": side(peer)}}


def test_aggregate_takes_medians_over_rounds_and_skips_failures() -> None:
    rounds = [
        _round(1, {"decode": {"tok_s": 70.0}}, {"decode": {"tok_s": 90.0}}),
        _round(2, {"decode": {"tok_s": 80.0}}, {"decode": {"tok_s": 80.0}}),
        _round(3, {"decode": {"tok_s": 75.0}}, {"decode": {"tok_s": None}}),
        _round(4, {"decode": {"tok_s": 100.0}}, {"decode": {"tok_s": 70.0}}),
    ]
    rounds[2]["sides"]["peer"]["decode"]["error"] = "boom"
    (row,) = summary.aggregate(rounds, summary.rows(Sizes(), ["decode"]))
    assert row["tt"] == 77.5 and row["tt_n"] == 4 and row["tt_range"] == [70.0, 100.0]
    assert row["peer"] == 80.0 and row["peer_n"] == 3
    assert row["ratio"] == pytest.approx(77.5 / 80.0)


def test_rows_cover_every_measure() -> None:
    rows = summary.rows(Sizes(long=(2048,)), [*harness.M.MEASURES])
    keys = {(r.measure, r.key) for r in rows}
    assert ("prefix", "warm_over_cold") in keys and ("c32", "max_ttft") in keys
    assert ("sampled", "sampled_over_greedy") in keys and ("long", "2048.cold_ttft") in keys
    assert all(r.better in ("higher", "lower") for r in rows)
    lower = {(r.measure, r.key) for r in rows if r.better == "lower"}
    assert ("prefix", "warm_over_cold") in lower and ("c8", "output_tok_s") not in lower


def test_compare_probes() -> None:
    a = {"ids": [1, 2, 3], "top": [["a", "b"], ["c", "d"], ["e", "f"]], "logprobs": [-1, -2, -3]}
    same = summary.compare_probes(a, dict(a, logprobs=[-1.0, -2.5, -3.0]))
    assert same["identical"] and same["top_order_equal"] == 3
    assert same["max_abs_logprob_diff"] == 0.5
    b = {"ids": [1, 2, 4], "top": [["a", "b"], ["d", "c"], ["e", "f"]], "logprobs": [-1, -2, -3]}
    diff = summary.compare_probes(a, b)
    assert not diff["identical"] and diff["first_difference"] == 2
    assert diff["top_order_equal"] == 2
    short = summary.compare_probes(a, dict(a, ids=[1, 2]))
    assert not short["identical"] and short["first_difference"] == 2


def test_markdown_table() -> None:
    rounds = [
        _round(r, {"prefill": {"tok_s": 10959.0}}, {"prefill": {"tok_s": 13170.0}}) for r in (1, 2)
    ]
    for r in rounds:
        r["crosscheck"] = {"identical": True, "steps": 16, "top_order_equal": 16}
    rounds[1]["sides"]["tt"]["prefill"]["load"]["foreign_cores"] = 0.9
    agg = summary.aggregate(rounds, summary.rows(Sizes(), ["prefill"]))
    text = summary.markdown(
        agg, summary.crosscheck_summary(rounds), summary.load_summary(rounds), "llama.cpp"
    )
    assert "| measure | better | tt-serve | llama.cpp | ratio (> 1: tt-serve better) |" in text
    assert "| cold prefill, 2,048 tokens | higher | 10,959 tok/s (10,959–10,959) |" in text
    assert "| 0.83× | 2 / 2 |" in text
    assert "identical in 2 of 2 rounds; top-5 order equal at 16 of 16 steps" in text
    assert "Noisy (> 0.25 foreign cores): r2 tt prefill." in text


def test_foreign_load_subtracts_the_server_and_the_harness() -> None:
    before = LoadSample(10.0, 1.0, 5.0, 100.0, 3.0, 1.0)
    after = LoadSample(12.0, 1.5, 5.5, 104.0, 5.0, 1.5)
    got = load_between(before, after)
    assert got["foreign_cores"] == pytest.approx((4.0 - 2.0 - 0.5) / 2.0)
    assert got["steal_s"] == 0.5 and got["server_cpu_s"] == 2.0
    assert got["loadavg_1m"] == [1.0, 1.5]


# -- the two kinds of server ---------------------------------------------------------------------


def test_llama_server_command_and_request_extras(tmp_path: Path) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text(
        "#!/bin/sh\necho '--no-webui   disable the Web UI'\necho 'version: 1 (abc)' >&2\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    side = LlamaServerSide(str(fake), str(tmp_path / "m.gguf"), 2, extra=["--cache-ram", "0"])
    cmd = side.command(8123, Slots(8, 640))
    assert cmd[:3] == [str(fake), "-m", str(tmp_path / "m.gguf")]
    for flag, value in (("-t", "2"), ("-tb", "2"), ("--port", "8123"), ("--parallel", "8")):
        assert cmd[cmd.index(flag) + 1] == value
    assert cmd[cmd.index("-c") + 1] == str(8 * 768)
    assert "--no-webui" in cmd and cmd[-2:] == ["--cache-ram", "0"]
    assert side.request_extras(cold=True) == {"cache_prompt": False}
    assert side.request_extras(cold=False) == {"cache_prompt": True}
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(60))
    desc = side.describe(Slots(1, 100))
    assert desc["version"] == "version: 1 (abc)" and "--port" not in desc["flags"]
    assert desc["gguf"]["name"] == "m.gguf" and desc["gguf"]["bytes"] == 64
    assert str(tmp_path) not in json.dumps(desc)  # no machine paths in the ledger


def test_tt_serve_threads_go_through_the_environment() -> None:
    side = TtServeSide("/some/model", 2, ["--max-batch-size", "32"])
    env = side.env()
    assert env["OMP_NUM_THREADS"] == "2" and env["MKL_NUM_THREADS"] == "2"
    cmd = side.command(9000, Slots(1, 10))
    assert cmd[1:4] == ["-m", "tt_serve.cli", "serve"] and cmd[-2:] == ["--max-batch-size", "32"]
    assert "/some/model" not in json.dumps(side.describe(Slots(1, 10)))


def test_llama_probe_parses_the_native_completion_reply() -> None:
    seen: dict[str, Any] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        seen.update(json.loads(req.content), path=req.url.path)
        steps = [
            {
                "id": t,
                "logprob": -0.1 * t,
                "top_logprobs": [{"id": t, "logprob": -0.1}, {"id": 7, "logprob": -2.0}],
            }
            for t in (5, 6)
        ]
        return httpx.Response(200, json={"tokens": [5, 6], "completion_probabilities": steps})

    side = LlamaServerSide("x", "y", 1, render=lambda t: f"<{t}>")

    async def go() -> Any:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(base_url="http://peer", transport=transport) as c:
            return await side.greedy_probe(c, [1, 2, 3], 2, 5)

    probe = asyncio.run(go())
    assert seen["path"] == "/completion" and seen["prompt"] == [1, 2, 3]
    assert seen["n_predict"] == 2 and seen["n_probs"] == 5 and seen["temperature"] == 0.0
    assert seen["return_tokens"] and seen["ignore_eos"]
    assert probe.ids == [5, 6]
    assert probe.top == [["<5>", "<7>"], ["<6>", "<7>"]]
    assert probe.logprobs == [pytest.approx(-0.5), pytest.approx(-0.6)]


# -- the whole harness, a second tt-serve as the peer ------------------------------------------


@pytest.mark.slow
def test_harness_end_to_end_with_a_tt_serve_peer(tiny_model: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "peer.jsonl"
    argv = [
        "--peer-kind", "tt-serve",
        "--model", str(tiny_model),
        "--threads", "1",
        "--rounds", "2",
        "--measures", "prefix,decode,c8",
        "--prefix-head", "64", "--prefix-suffix", "8",
        "--decode-prompt", "16", "--decode-tokens", "8",
        "--c8", "3x16+4",
        "--crosscheck-tokens", "8",
        "--tt-args", "--kv-blocks 128 --block-size 16 --prefill-chunk 64",
        "--llama-args", "--kv-blocks 128 --block-size 16 --prefill-chunk 64",
        "--ledger", str(ledger),
        "--log-dir", str(tmp_path / "logs"),
        "--health-timeout", "120",
    ]  # fmt: skip
    assert harness.main(argv) == 0
    (line,) = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert line["bench"] == "peer" and line["git"]["source_sha256"] and line["machine"]["cores"]
    assert [r["order"] for r in line["rounds"]] == [["tt", "peer"], ["peer", "tt"]]
    for r in line["rounds"]:
        # The same model and threads on both sides: the cross-check must agree exactly.
        assert r["crosscheck"]["identical"] and r["crosscheck"]["top_order_equal"] == 8
        for side in ("tt", "peer"):
            got = r["sides"][side]
            assert set(got) == {"crosscheck", "prefix", "decode", "c8"}
            assert all(e["error"] is None for e in got.values())
            assert got["decode"]["metrics"]["tok_s"] > 0
            assert got["c8"]["metrics"]["output_tok_s"] > 0
            assert got["prefix"]["detail"]["prefix"]["warm_cached"] > 0  # a real hit
            assert got["decode"]["load"]["wall_s"] > 0
    by_key = {(s["measure"], s["key"]): s for s in line["summary"]}
    assert by_key[("decode", "tok_s")]["tt_n"] == 2 and by_key[("decode", "tok_s")]["ratio"]
    assert line["flags"]["model"] == tiny_model.name  # basenames only
    assert str(tmp_path) not in json.dumps(line["flags"])
    assert line["servers"]["c8"]["tt"]["kind"] == "tt-serve"
    assert len(list((tmp_path / "logs").glob("r*-*.log"))) == 8
