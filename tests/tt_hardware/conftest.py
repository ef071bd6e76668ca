"""The real-device tier: every test needs a Tenstorrent device and skips, saying why, without."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests import tiny_models as tm
from tt_serve.model.tt.probe import NoDeviceError, probe_devices

# Per chip, as test_device.py opens one chip: the tiny models' traces need a few MB.
MESH_TRACE_REGION = 64 << 20


@functools.cache
def _probe() -> tuple[int, str | None]:
    """(devices ttnn sees, why none can be used or None), probed once per session."""
    try:
        n = probe_devices()
    except NoDeviceError as exc:
        return 0, str(exc)
    return n, None if n > 0 else "ttnn sees 0 Tenstorrent devices"


def _device_reason() -> str | None:
    return _probe()[1]


def _skip(reason: str) -> None:
    print(f"SKIP tt_hardware: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tt_device_id() -> int:
    reason = _device_reason()
    if reason is not None:
        _skip(f"no Tenstorrent device: {reason}")
    return int(os.environ.get("TT_DEVICE_ID", "0"))


@pytest.fixture(scope="session")
def tt_num_devices() -> int:
    """The Tenstorrent chips ttnn sees (skips, saying why, when it sees none)."""
    n, reason = _probe()
    if reason is not None:
        _skip(f"no Tenstorrent device: {reason}")
    return n


@pytest.fixture
def tt_mesh_ops(request: pytest.FixtureRequest, tt_num_devices: int) -> Iterator[object]:
    """The real ttnn with a MeshDevice open on the first chips, as ``launch.open_backend``
    opens one (FABRIC_1D, the backend's L1_SMALL): the test's ``indirect`` parameter is N (a
    1 x N mesh) or (rows, cols); skips, saying why, when ttnn sees fewer chips."""
    from tt_serve.model.tt.launch import DEFAULT_L1_SMALL
    from tt_serve.model.tt.ops import Ops

    rows, cols = request.param if isinstance(request.param, tuple) else (1, int(request.param))
    if tt_num_devices < rows * cols:
        _skip(f"needs a {rows} x {cols} mesh: ttnn sees {tt_num_devices} Tenstorrent device(s)")
    ops = Ops.load()
    ops.open_mesh((rows, cols), trace_region_size=MESH_TRACE_REGION, l1_small_size=DEFAULT_L1_SMALL)
    yield ops
    ops.close_device()


@pytest.fixture(scope="session")
def hw_mesh_dense_dir(tmp_path_factory: pytest.TempPathFactory, tt_num_devices: int) -> Path:
    """A tiny dense checkpoint (tests/tiny_models.py's, context-sensitive init) whose heads
    split over 8 chips: 8 query / 2 KV heads (KV replicated past 2 chips), 8 GDN key / 16
    value heads; hidden 256 and intermediate 512 are whole tiles per chip at 8."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hidden = 256
    base = tm._base_config(vocab=4096, layers=4, hidden=hidden, tied=False)
    base |= {"num_attention_heads": 8, "linear_num_key_heads": 8, "linear_num_value_heads": 16}
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**base, intermediate_size=512)).eval()
    tm.context_sensitive_init(model, seed=0, hidden=hidden, tied=False)
    return tm._save(model, tmp_path_factory.mktemp("hw_mesh") / "dense")


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
