"""The real-device tier: every test needs a Tenstorrent device and skips, saying why, without."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import tiny_models as tm
from tt_serve.model.tt.device import NoDeviceError, probe_devices


def _device_reason() -> str | None:
    try:
        n = probe_devices()
    except NoDeviceError as exc:
        return str(exc)
    return None if n > 0 else "ttnn sees 0 Tenstorrent devices"


@pytest.fixture(scope="session")
def tt_device_id() -> int:
    reason = _device_reason()
    if reason is not None:
        print(f"SKIP tt_hardware: {reason}")
        pytest.skip(f"no Tenstorrent device: {reason}")
    return int(os.environ.get("TT_DEVICE_ID", "0"))


@pytest.fixture(scope="session")
def hw_dense_dir(tmp_path_factory: pytest.TempPathFactory, tt_device_id: int) -> Path:
    return tm.make_dense(tmp_path_factory.mktemp("hw") / "dense", seed=0, layers=4)


@pytest.fixture
def tt_ops(tt_device_id: int) -> Iterator[object]:
    from tt_serve.model.tt.ops import Ops

    ops = Ops.load()
    ops.open_device(tt_device_id, trace_region_size=64 << 20, l1_small_size=32768)
    yield ops
    ops.close_device()
