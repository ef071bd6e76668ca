"""Fail-fast device checks, the CLI on a machine without a device, and host-side planning."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tt_serve.model.interface import PAD_BLOCK, StepRow
from tt_serve.model.tt.device import NoDeviceError, parse_device_ids, probe_devices, require_device
from tt_serve.model.tt.plan import (
    DecodeValues,
    choose_bucket,
    decode_values,
    make_buckets,
    prefill_values,
    slot_row,
)


def test_import_needs_no_ttnn() -> None:
    code = "import sys, tt_serve.model.tt, tt_serve.model.tt.backend; print('ttnn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_require_device_without_ttnn_exits_with_a_clear_message() -> None:
    with pytest.raises(NoDeviceError, match="needs the ttnn package"):
        probe_devices(sys.executable)
    with pytest.raises(SystemExit, match="--backend ttnn: the ttnn backend needs the ttnn package"):
        require_device((0,), python=sys.executable)


def test_serve_backend_ttnn_fails_fast_without_a_device() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tt_serve.cli", "serve", "--backend", "ttnn"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "--backend ttnn:" in proc.stderr
    assert "needs the ttnn package" in proc.stderr or "no Tenstorrent device" in proc.stderr


def test_parse_device_ids() -> None:
    assert parse_device_ids("cpu") == (0,)
    assert parse_device_ids("1") == (1,)
    assert parse_device_ids("tt:0,1") == (0, 1)
    with pytest.raises(ValueError):
        parse_device_ids("cuda")


def test_buckets_and_prefill_values() -> None:
    assert make_buckets(64, 256) == (64, 128, 256)
    assert choose_bucket(40, (64, 128)) == 64
    with pytest.raises(ValueError):
        choose_bucket(200, (64, 128))
    row = StepRow(1, tuple(range(10, 50)), 128, (7, 8, 9, 4), 2, True)
    v = prefill_values(
        row,
        bucket=128,
        block_size=64,
        width=6,
        head_dim=32,
        rotary_dim=16,
        theta=1e4,
        num_v_heads=2,
        conv_state_len=3,
    )
    assert v.page_table.tolist() == [[7, 8, 9, 4, PAD_BLOCK, PAD_BLOCK]]
    assert v.fill_table.tolist() == [[9, PAD_BLOCK]]  # pages past the valid tokens -> padding
    assert v.gate_mask[0, :, 0].sum() == 40 and v.gate_mask[0, 40:].sum() == 0
    assert v.last_select[0, 0].argmax() == 39
    assert [int(r.argmax()) for r in v.conv_select[0]] == [40, 41, 42]
    assert v.start.tolist() == [128] and v.ids[0, 39] == 49 and v.ids[0, 40] == 0


def _decode3(rows: list[StepRow]) -> DecodeValues:
    return decode_values(
        rows, num_rows=3, width=3, head_dim=32, rotary_dim=16, theta=1e4, num_v_heads=2
    )


def test_decode_values_mark_idle_slots() -> None:
    """Three rows for state slots 1..3 (no row for the padding slot 0): slot s in row s - 1."""
    rows = [StepRow(1, (5,), 70, (3, 4), 2, True)]
    v = _decode3(rows)
    assert v.cur_pos.tolist() == [-1, 70, -1] and v.ids.tolist() == [[0, 5, 0]]
    assert v.page_table[1].tolist() == [3, 4, PAD_BLOCK] and not v.page_table[0].any()
    assert v.conv_mask.reshape(-1).tolist() == [0, 1, 0]
    assert v.gate_mask.shape == (1, 3, 2) and v.cos.shape == (1, 3, 1, 32)
    assert v.active == (2,)
    np.testing.assert_array_equal(v.cos[0, 0, 0], np.ones(32, np.float32))
    last = _decode3([StepRow(1, (9,), 5, (1,), 3, True)])
    assert last.cur_pos.tolist() == [-1, -1, 5]
    with pytest.raises(ValueError, match="share state slot 2"):
        _decode3(rows * 2)
    for bad in (0, 4):
        with pytest.raises(ValueError, match=f"state slot {bad} outside 1..3"):
            _decode3([StepRow(1, (5,), 70, (3,), bad, True)])


def test_slot_row_maps_engine_slots_past_the_padding_slot() -> None:
    assert [slot_row(s, 32) for s in (1, 2, 32)] == [0, 1, 31]
    for bad in (0, -1, 33):
        with pytest.raises(ValueError, match=f"state slot {bad} outside 1..32"):
            slot_row(bad, 32)
