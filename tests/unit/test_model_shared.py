"""The helpers both traced backends share (torch CUDA graphs and ttnn traces), each under both
backends' parameters: block tables at a fixed width, the prefill ladder, the row checks and the
program registry. No torch, no ttnn."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest

from tt_serve.config import GDN_CHUNK
from tt_serve.model.buckets import NoBucket, fit_table, prefill_buckets
from tt_serve.model.interface import (
    PAD_BLOCK,
    RowSampling,
    StepRow,
    blocks_needed,
    check_rows,
)
from tt_serve.model.programs import Programs

P = PAD_BLOCK


def _row(table: tuple[int, ...], start: int = 0, n: int = 1, seq: int = 7) -> StepRow:
    return StepRow(seq, (1,) * n, start, table, 0, True)


def test_fit_table_by_positions_cuts_to_the_blocks_reached() -> None:
    """The torch graphs' rule: the blocks positions 0..end_pos-1 reach, padded to the width."""
    row = _row((5, 9, 3, 4), start=20)  # end_pos 21, block 16: two blocks
    assert blocks_needed(row, 16) == 2
    assert fit_table(row, 3, block_size=16, held_by="graphs") == [5, 9, P]
    with pytest.raises(NoBucket, match="seq 7 needs 2 blocks; graphs hold 1"):
        fit_table(row, 1, block_size=16, held_by="graphs")
    short = _row((5,), start=20)
    with pytest.raises(ValueError, match="block table has 1 blocks, positions up to 21 need 2"):
        fit_table(short, 4, block_size=16, held_by="graphs")


def test_fit_table_by_blocks_keeps_every_real_block() -> None:
    """The ttnn traces' rule: the whole table, less its trailing padding (a batch pads every
    row's table to one width), whatever the positions reach."""
    assert fit_table(_row((5, 9, 2)), 6, held_by="traces") == [5, 9, 2, P, P, P]
    assert fit_table(_row((5, P, 2, P, P)), 3, held_by="traces") == [5, P, 2]
    assert fit_table(_row(()), 2, held_by="traces") == [P, P]
    with pytest.raises(NoBucket, match="seq 7 needs 4 blocks; traces hold 3"):
        fit_table(_row((5, P, 2, 8, P)), 3, held_by="traces")


def test_prefill_ladders() -> None:
    def graphs(max_chunk: int) -> tuple[int, ...]:
        return prefill_buckets(max_chunk, GDN_CHUNK, unit="the GDN chunk")

    assert graphs(256) == (64, 128, 256) and graphs(64) == (64,)
    assert prefill_buckets(2048, 128, unit="block_size") == (128, 256, 512, 1024, 2048)
    assert prefill_buckets(384, 128, unit="block_size") == (128, 256, 384)
    for bad in (0, 32, 100):
        with pytest.raises(ValueError, match=rf"\({bad}\) must be a positive multiple of the GDN"):
            graphs(bad)
    with pytest.raises(ValueError, match=r"positive multiple of block_size \(64\)"):
        prefill_buckets(96, 64, unit="block_size")


def test_check_rows() -> None:
    def drawn(top_k: int) -> StepRow:
        return StepRow(3, (1,), 0, (1,), 0, True, sampling=RowSampling(0.7, top_k=top_k))

    check_rows([_row((1,)), drawn(0), drawn(5000)])  # no limit: any top-k
    check_rows([drawn(1), drawn(32)], max_device_top_k=32)
    with pytest.raises(ValueError, match="row for seq 4 has no tokens"):
        check_rows([_row((1,)), StepRow(4, (), 0, (1,), 0, True)])
    for bad in (0, 33):
        with pytest.raises(ValueError, match=rf"1 <= top_k <= 32 \(got {bad}\); pick it on"):
            check_rows([drawn(bad)], max_device_top_k=32)


class _Recorded(Programs[str, str]):
    """Programs whose capture and replay are a log."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(on_capture=lambda: log.append("hook"))
        self.log = log

    def _capture(self, todo: dict[Hashable, Callable[[], str]]) -> dict[Hashable, str]:
        self.log.extend(f"capture {k}" for k in todo)
        return {k: f"trace {k}" for k in todo}

    def _replay(self, handle: str) -> str:
        self.log.append(f"replay {handle}")
        return handle

    def _release(self, handle: str) -> None:
        self.log.append(f"release {handle}")


def test_programs_registry_and_rules() -> None:
    log: list[str] = []
    p = _Recorded(log)
    p.add("big", lambda: "eager big", traced=True)
    p.add("eager", lambda: "eager run", traced=False)
    p.add("small", lambda: "eager small", traced=True)
    with pytest.raises(ValueError, match="program 'big' registered twice"):
        p.add("big", lambda: "", traced=True)
    assert p.keys == ("big", "eager", "small") and "eager" in p and "other" not in p
    assert p.traced("big") and not p.traced("eager")
    with pytest.raises(KeyError):  # a traced program only replays: capture first
        p.run("big")
    p.capture_all()
    p.capture_all()  # captures nothing twice
    assert log == ["hook", "capture big", "capture small", "hook"] and p.num_captured == 2
    log.clear()
    assert p.run("small") == "trace small" and p.run("eager") == "eager run"
    assert log == ["replay trace small"] and p.runs["small"] == p.runs["eager"] == 1
    log.clear()
    p.release()
    assert log == ["release trace big", "release trace small"] and p.num_captured == 0
