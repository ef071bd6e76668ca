"""ModelSpec parsing from HF config.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tt_serve.model.spec import FULL_ATTENTION, ModelSpec, UnsupportedModelError


def _cfg(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_dense_fields(dense_dir: Path) -> None:
    s = ModelSpec.from_hf_dir(dense_dir)
    assert (s.family, s.vocab_size, s.num_layers) == ("qwen3_5", 4096, 4)
    assert s.attention_layers == (3,) and s.gdn_layers == (0, 1, 2)
    assert s.rotary_dim == 32 and s.conv_dim == 2 * 4 * 64 + 8 * 64
    assert s.eos_token_ids == (2,) and not s.is_moe_layer(0)
    assert s.kv_bytes_per_block(16, 2) == 2 * 2 * 16 * 128 * 2
    assert s.state_bytes_per_slot() == 4 * 3 * (1024 * 3 + 8 * 64 * 64)
    assert len(s.model_id) == 16


def test_model_id_changes_with_config(dense_dir: Path, tied_dir: Path) -> None:
    assert ModelSpec.from_hf_dir(dense_dir).model_id != ModelSpec.from_hf_dir(tied_dir).model_id


def test_next_fields_and_interval(next_dir: Path) -> None:
    cfg = _cfg(next_dir)
    del cfg["layer_types"]
    cfg["full_attention_interval"] = 2
    s = ModelSpec.from_config(cfg)
    assert s.layer_types[1] == FULL_ATTENTION and s.attention_layers == (1, 3)
    assert s.is_moe_layer(0) and not s.is_moe_layer(1)  # mlp_only_layers = [1]
    cfg["decoder_sparse_step"] = 2
    cfg["mlp_only_layers"] = []
    s2 = ModelSpec.from_config(cfg)
    assert [s2.is_moe_layer(i) for i in range(4)] == [False, True, False, True]


def test_release_nesting_and_eos(release_dir: Path, moe_dir: Path) -> None:
    rel, flat = ModelSpec.from_hf_dir(release_dir), ModelSpec.from_hf_dir(moe_dir)
    assert rel.model_type == "qwen3_5_moe" and rel.family == "qwen3_5_moe"
    assert rel.num_experts == 8 and rel.norm_topk_prob
    assert rel.layer_types == flat.layer_types
    cfg = _cfg(release_dir)
    cfg["eos_token_id"] = [7, 2]
    s = ModelSpec.from_config(cfg, generation_config={"eos_token_id": [2, 9]})
    assert s.eos_token_ids == (7, 2, 9)


def test_legacy_rope_fields(dense_dir: Path) -> None:
    cfg = _cfg(dense_dir)
    del cfg["rope_parameters"]
    cfg.update(rope_theta=5000.0, partial_rotary_factor=0.5)
    s = ModelSpec.from_config(cfg)
    assert (s.rope_theta, s.rotary_dim) == (5000.0, 64)


def test_unsupported_model_type_names_it(dense_dir: Path) -> None:
    cfg = _cfg(dense_dir)
    cfg["model_type"] = "llama"
    with pytest.raises(UnsupportedModelError, match=r"'llama'.*qwen3_5_moe_text.*qwen3_next"):
        ModelSpec.from_config(cfg)
