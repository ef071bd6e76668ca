"""Fixtures shared by tests/tt (runtime/, virtual/, plan/): tiny checkpoints and tt backends on
the virtual device."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests import tiny_models as tm
from tests.tt import harness as h
from tt_serve.model.spec import ModelSpec

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


@pytest.fixture(scope="session")
def prompts() -> tuple[list[int], list[int]]:
    """Two prompts sharing two full chunks: the second is a warm hit at 256."""
    a = h.prompt(300, 1)
    b = a[:256] + h.prompt(45, 2)
    return a, b


@pytest.fixture(scope="session")
def torch_tokens(
    dense_dir: Path, prompts: tuple[list[int], list[int]]
) -> list[tuple[list[int], int]]:
    """The torch backend's greedy tokens and cached counts for ``prompts``, one after another."""
    spec = ModelSpec.from_hf_dir(dense_dir)
    return h.generate(h.engine(h.torch_backend(dense_dir), spec), list(prompts), 12)
