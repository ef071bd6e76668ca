"""The published-size configs rebuild the released models: their text parameter counts equal
the counts derived from the real checkpoints' tensor inventories (design notes, qwen-configs:
exact on five checkpoints), and the spec parser reads them as it reads a release folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tt_serve.model.published import SIZES, published_config, write_published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.weights import expected_shapes

# Text params (embedding + decoder + LM head, no MTP or vision), to the 1e6 the notes give.
TEXT_PARAMS_M = {
    "qwen3.5-0.8b": 752,
    "qwen3.5-2b": 1882,
    "qwen3.5-4b": 4206,
    "qwen3.5-9b": 8954,
    "qwen3.5-27b": 26896,
    "qwen3.5-35b-a3b": 34661,
    "qwen3.5-122b-a10b": 122112,
    "qwen3.5-397b-a17b": 396346,
    "qwen3.6-27b": 26896,
    "qwen3.6-35b-a3b": 34661,
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_published_sizes_have_the_released_parameter_counts(name: str) -> None:
    spec = ModelSpec.from_config(published_config(name))
    params = sum(int(np.prod(s)) for s in expected_shapes(spec, set()).values())
    assert round(params / 1e6) == TEXT_PARAMS_M[name]
    assert spec.num_attention_layers * 4 == spec.num_layers  # every fourth layer is full
    assert spec.vocab_size == 248320 and spec.head_dim == 256


def test_written_folder_reads_like_a_release(tmp_path: Path) -> None:
    folder = write_published_config("Qwen3.6-35B-A3B", tmp_path / "m")
    spec = ModelSpec.from_hf_dir(folder)
    assert spec.family == "qwen3_5_moe" and spec.num_experts == 256
    assert spec.num_experts_per_tok == 8 and not spec.tie_word_embeddings
    with pytest.raises(ValueError, match="unknown published model"):
        published_config("qwen3.5-7b")
