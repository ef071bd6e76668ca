"""Session fixtures shared by every tier: the real Qwen3.5/3.6 vocabulary, converted to
tokenizer.json once per session (torch-free)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tt_serve.tokenizer import Tokenizer

# CI replays the same examples every run (a red CI must be reproducible); local runs explore.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with the converted ``tokenizer.json`` + ``tokenizer_config.json``."""
    from tt_serve.qwen_vocab import write_tokenizer

    path = tmp_path_factory.mktemp("qwen-tokenizer")
    write_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def qwen_tok(qwen_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(qwen_tokenizer_dir)
