"""Tiny HF checkpoints for engine tests (written at test time, context-sensitive init)."""

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
def engine_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tm.make_dense(tmp_path_factory.mktemp("engine") / "dense", seed=11)
