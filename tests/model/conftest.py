"""Session-scoped tiny checkpoints (built once per test session in a temp dir)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests import tiny_models as tm

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _threads() -> None:
    # Tiny shapes: on a shared 2-core machine extra intra-op threads mostly wait on each other.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ckpts")


@pytest.fixture(scope="session")
def dense_dir(ckpt_root: Path) -> Path:
    return tm.make_dense(ckpt_root / "dense", seed=0)


@pytest.fixture(scope="session")
def moe_dir(ckpt_root: Path) -> Path:
    return tm.make_moe(ckpt_root / "moe", seed=1)


@pytest.fixture(scope="session")
def next_dir(ckpt_root: Path) -> Path:
    return tm.make_next(ckpt_root / "next", seed=2)


@pytest.fixture(scope="session")
def tied_dir(ckpt_root: Path) -> Path:
    return tm.make_dense(ckpt_root / "tied", seed=3, tied=True)


@pytest.fixture(scope="session")
def release_dir(ckpt_root: Path, moe_dir: Path) -> Path:
    return tm.make_release_layout(moe_dir, ckpt_root / "release")
