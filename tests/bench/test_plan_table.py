"""bench/capacity/plan_table's cells: both checkers' verdicts side by side, and a disagreement
marked unless the virtual device accepts the very pool tt-metal ran (its refusal was the plan's
DRAM margin while sizing the pool, not a rule)."""

from __future__ import annotations

from typing import Any

from bench.capacity.plan_table import cell, compare, table


def _row(ok: bool, mock_ok: bool | None, **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "model": "qwen3.5-9b",
        "request": {"device": "n150", "precision": "bfp4-mlp", "max_batch_size": 32},
        "ok": ok,
        "limit_rule": None if ok else "dram.capacity",
        "kv_bytes": 2.0e9 if ok else 0,
        "weights_bytes": 8.1e9,
    }
    if mock_ok is not None:
        row |= {"mock_ok": mock_ok, "mock_where": "" if mock_ok else "bank_manager.cpp:514"}
        row |= {"agree": ok == mock_ok, "mock_kv_blocks": 10, **more}
    return row


def test_cells_say_both_verdicts_and_mark_an_unexplained_disagreement() -> None:
    assert cell(_row(True, None)) == "fits (KV 2.0 GB)"
    assert cell(_row(True, True)) == "fits (KV 2.0 GB) / tt-metal: fits"
    refused = "`dram.capacity` / tt-metal: `bank_manager.cpp:514`"
    assert cell(_row(False, False)) == refused
    assert cell(_row(False, True)).endswith("**DISAGREE**")
    assert cell(_row(True, False)).endswith("**DISAGREE**")
    assert cell(_row(False, True, virtual_same_pool_ok=False)).endswith("**DISAGREE**")


def test_a_refusal_by_the_margin_alone_is_explained_not_hidden() -> None:
    text = cell(_row(False, True, virtual_same_pool_ok=True))
    assert "DISAGREE" not in text and "both fit the same 10-block pool" in text
    assert text.startswith("`dram.capacity`")  # the plan's own verdict is still shown


def test_table_puts_batches_in_columns() -> None:
    rows = [
        _row(True, True)
        | {"request": {"device": "n150", "precision": "mixed", "max_batch_size": b}}
        for b in (1, 32)
    ]
    lines = table(rows, [1, 16, 32])
    assert lines[0] == "| model | device | precision | weights | b=1 | b=16 | b=32 |"
    assert lines[2].startswith("| qwen3.5-9b | n150 | mixed | 8.10 GB | fits")
    assert lines[2].split(" | ")[5] == "-"  # no batch-16 row


def test_compare_puts_each_new_plan_beside_the_old_one() -> None:
    def row(blocks: int, left: int, ok: bool = True, commit: str = "a" * 40) -> dict[str, Any]:
        q = {"device": "n150", "mesh": None, "precision": "mixed", "max_batch_size": 16}
        return {
            "model": "qwen3.5-0.8b",
            "request": {**q, "kv_blocks": 0, "block_size": 64},
            "ok": ok,
            "limit_rule": None if ok else "dram.capacity",
            "kv_tokens": (blocks - 1) * 64,
            "dram_left": left,
            "git": {"commit": commit},
        }

    old, new = [row(12054, 205_600_000)], [{**row(11987, 258_000_000), "kv_blocks": 11987}]
    lines = compare(old, new)
    assert lines[2] == (
        "| qwen3.5-0.8b | n150 | mixed | 16 | fits -> fits | 12054 -> 11987 | 205.6 -> 258.0 "
        "| 257.7 | aaaaaaa |"
    )
    refused = compare([row(1, 0, ok=False)], [row(1, 0, ok=False)])
    assert "dram.capacity -> dram.capacity | - | - |" in refused[2]
    assert "| - -> fits |" in compare([], new)[2]
