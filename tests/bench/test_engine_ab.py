"""bench/cache/engine_ab.py end to end on a tiny model: one ledger line per round, warm hits
real."""

from __future__ import annotations

import json
from pathlib import Path

from bench.cache import engine_ab
from tests.bench.conftest import TINY_VOCAB


def test_engine_ab_writes_ledger_lines(tiny_model: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "engine-ab.jsonl"
    rc = engine_ab.main(
        [
            "--model",
            str(tiny_model),
            "--rounds",
            "2",
            "--cold-n",
            "2",
            "--cold-len",
            "130",
            "--head",
            "512",
            "--suffix",
            "16",
            "--max-tokens",
            "2",
            "--kv-blocks",
            "256",
            "--token-range",
            "3",
            str(TINY_VOCAB),
            "--ledger",
            str(ledger),
        ]
    )
    assert rc == 0
    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert [x["order"] for x in lines] == ["AB", "BA"]
    for x in lines:
        assert x["git"]["source_sha256"] and x["machine"]["cores"]
        assert x["warm_cached_tokens"] == 512  # the head is a multiple of the 256 chunk
        assert set(x["ratios"]) == {
            "cold_path_wall_on_off",
            "cold_path_cpu_on_off",
            "warm_cold_ttft",
            "warm_tail_speed_over_cold",
        }
        assert x["phases"]["prefix"]["off"]["cached_tokens"] == 0
        assert all(v > 0 for v in x["ratios"].values())
