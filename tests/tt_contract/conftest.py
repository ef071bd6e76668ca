"""Fixtures for the contract tier: tiny checkpoints and tt backends on the contract fake."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests import tiny_models as tm

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def dense_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tm.make_dense(tmp_path_factory.mktemp("tt_ckpt") / "dense", seed=0, layers=4)


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tm.make_moe(tmp_path_factory.mktemp("tt_ckpt_moe") / "moe", seed=1, layers=4)
