"""The A/B harness end to end: two real tt-serve arms on a tiny model, two rounds, ledger schema
checked, arms down afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.cache.report import markdown, ratios
from bench.load.ledger import check_line, read_ledger
from tests.bench.conftest import TINY_VOCAB

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
V = f"vocab={TINY_VOCAB}"


def test_prefix_cache_ab_end_to_end(tiny_model: Path, tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        ROUNDS="2",
        OMP_NUM_THREADS="1",
        LEDGER_DIR=str(tmp_path / "runs"),
        OUT_DIR=str(tmp_path / "out"),
        HEALTH_TIMEOUT="150",
        WARMUP=f"random:num=1,min_len=16,max_len=32,max_tokens=2,{V}",
        COMMON_FLAGS=(
            f"--model {tiny_model} --kv-blocks 128 --prefill-chunk 64 --block-size 16 "
            "--max-batch-size 4 --max-num-batched-tokens 256 --log-level warning"
        ),
        PHASES=(
            f"prefix4k=shared-prefix:groups=1,per_group=2,head=64,suffix=8,max_tokens=3,{V} "
            f"nohead=nohead:agents=2,turns=1,head=64,new=8,max_tokens=3,{V}"
        ),
    )
    res = subprocess.run(
        ["bash", "bench/ab/prefix-cache.sh"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    lines = read_ledger(tmp_path / "runs" / "prefix-cache.jsonl")
    assert len(lines) == 2
    assert [line["order"] for line in lines] == [["A", "B"], ["B", "A"]]
    for line in lines:
        assert check_line(line) == []
        assert line["differing_flag"] == "prefix-caching"
        assert "--no-prefix-caching" in line["arms"]["B"]["flags"]
        assert line["git"]["source_sha256"] and line["machine"]["cores"]
        a, b = line["results"]["A"], line["results"]["B"]
        # Same prompts on both arms; the cache-on arm hits on the second shared-prefix prompt.
        assert a["prefix4k"]["prompt_sha256"] == b["prefix4k"]["prompt_sha256"]
        assert a["prefix4k"]["hit_rate"] > 0
        assert a["prefix4k"]["requests"][1]["cached_tokens"] == 64
        assert not b["prefix4k"]["hit_rate"]
        assert a["nohead"]["server"]["tt_serve:prefix_cache_hits_total"] == 0
        for arm in (a, b):
            for phase in arm.values():
                assert phase["metrics"]["failed"] == 0 and phase["metrics"]["completed"] > 0
                assert phase["metrics"]["tpot_s"]["p50"] > 0
    # Rounds use different seeds, so round 2 cannot hit round 1's entries.
    r1, r2 = (line["results"]["A"]["prefix4k"]["prompt_sha256"] for line in lines)
    assert set(r1).isdisjoint(r2)
    table = markdown(ratios(lines))
    assert "warm/cold TTFT" in table and table.count("| 2 |") == 3
    for arm in ("A", "B"):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{lines[0]['arms'][arm]['url']}/health", timeout=2)
