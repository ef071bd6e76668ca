"""Fail-fast device checks, the CLI on a machine without a device, and host-side planning."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tt_serve.model.buckets import choose_bucket, prefill_buckets
from tt_serve.model.interface import PAD_BLOCK, StepRow
from tt_serve.model.tt.probe import NoDeviceError, probe_devices, require_device
from tt_serve.model.tt.runtime.inputs import (
    DecodeValues,
    decode_values,
    prefill_values,
)


def test_import_needs_no_ttnn() -> None:
    code = "import sys, tt_serve.model.tt, tt_serve.model.tt.runtime.backend; print('ttnn' in sys.modules)"
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


def test_buckets_and_prefill_values() -> None:
    assert prefill_buckets(256, 64, unit="block_size") == (64, 128, 256)
    assert choose_bucket(40, (64, 128)) == 64
    with pytest.raises(ValueError):
        choose_bucket(200, (64, 128))
    row = StepRow(1, tuple(range(10, 50)), 128, (7, 8, 9, 4), 2, True)
    v = prefill_values(
        row,
        bucket=128,
        block_size=64,
        width=6,
        num_v_heads=2,
        conv_state_len=3,
    )
    assert v.page_table.tolist() == [[7, 8, 9, 4, PAD_BLOCK, PAD_BLOCK]]
    assert v.fill_table.tolist() == [[9, PAD_BLOCK]]  # pages past the valid tokens -> padding
    assert v.gate_mask[0, :, 0].sum() == 40 and v.gate_mask[0, 40:].sum() == 0
    assert v.last_select[0, 0].argmax() == 39
    assert [int(r.argmax()) for r in v.conv_select[0]] == [40, 41, 42]
    assert v.start.tolist() == [128] and v.ids[0, 39] == 49 and v.ids[0, 40] == 0
    # RoPE rows by position; padding tokens past the 6 x 64 table rows read its last row.
    assert v.positions.dtype == np.uint32 and v.positions[0, :3].tolist() == [128, 129, 130]
    assert v.positions[0, -1] == 255


def _decode3(rows: list[StepRow]) -> DecodeValues:
    return decode_values(rows, num_rows=3, width=3, num_v_heads=2)


def test_decode_values_mark_idle_slots() -> None:
    """Three rows for state slots 0..2: slot s in row s; a fed row's id comes from the device."""
    rows = [StepRow(1, (5,), 70, (3, 4), 1, True)]
    v = _decode3(rows)
    assert v.cur_pos.tolist() == [-1, 70, -1] and v.ids.tolist() == [[0, 5, 0]]
    assert v.page_table[1].tolist() == [3, 4, PAD_BLOCK] and not v.page_table[0].any()
    assert v.conv_mask.reshape(-1).tolist() == [0, 1, 0]
    assert v.gate_mask.shape == (1, 3, 2) and v.positions.tolist() == [[0, 70, 0]]
    assert v.write_pos.tolist() == [-1, 70, -1]
    assert v.active == (1,)
    last = _decode3(
        [StepRow(1, (9,), 5, (1,), 2, True), StepRow(2, (), 8, (2,), 0, True, fed=True)]
    )
    assert last.cur_pos.tolist() == [8, -1, 5] and last.ids.tolist() == [[0, 0, 9]]
    with pytest.raises(ValueError, match="share state slot 1"):
        _decode3(rows * 2)
    for bad in (-1, 3):
        with pytest.raises(ValueError, match=rf"state slot {bad} outside 0\.\.2"):
            _decode3([StepRow(1, (5,), 70, (3,), bad, True)])
