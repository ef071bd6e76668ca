"""Checkpoint loading: layouts accepted, malformed checkpoints rejected with named errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tt_serve.model.spec import ModelSpec, UnsupportedModelError
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.weights import CheckpointError, load_weights


def _rewrite(src: Path, dst: Path, edit: object) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)  # type: ignore[operator]
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_missing_tensor(dense_dir: Path, tmp_path: Path) -> None:
    name = "model.layers.1.linear_attn.in_proj_z.weight"
    bad = _rewrite(dense_dir, tmp_path / "c", lambda t: t.pop(name))
    with pytest.raises(
        CheckpointError, match=r"missing.*layers\.1\.linear_attn\.in_proj_z\.weight"
    ):
        TorchBackend.from_pretrained(bad)


def test_wrong_shape(dense_dir: Path, tmp_path: Path) -> None:
    name = "model.layers.3.self_attn.k_proj.weight"

    def edit(t: dict[str, torch.Tensor]) -> None:
        t[name] = torch.zeros(8, 256)

    bad = _rewrite(dense_dir, tmp_path / "c", edit)
    with pytest.raises(
        CheckpointError, match=r"model.layers.3.self_attn.k_proj.weight.*\(8, 256\)"
    ):
        TorchBackend.from_pretrained(bad)


def test_unexpected_tensor(dense_dir: Path, tmp_path: Path) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(2, 2)

    bad = _rewrite(dense_dir, tmp_path / "c", edit)
    with pytest.raises(CheckpointError, match=r"unexpected.*model\.layers\.0\.self_attn\.q_proj"):
        TorchBackend.from_pretrained(bad)


def test_unknown_model_type(dense_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "c"
    shutil.copytree(dense_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "mamba2"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="mamba2"):
        TorchBackend.from_pretrained(bad)


def test_release_layout_loads_same_tensors(moe_dir: Path, release_dir: Path) -> None:
    flat = load_weights(moe_dir, ModelSpec.from_hf_dir(moe_dir))
    rel = load_weights(release_dir, ModelSpec.from_hf_dir(release_dir))
    assert flat.keys() == rel.keys()
    assert all(torch.equal(flat[k], rel[k]) for k in flat)
    assert not any(k.startswith(("mtp", "visual", "model.")) for k in rel)


def test_tied_and_bf16(tied_dir: Path) -> None:
    spec = ModelSpec.from_hf_dir(tied_dir)
    w = load_weights(tied_dir, spec, dtype="bfloat16")
    assert w["lm_head.weight"] is w["embed_tokens.weight"]
    assert w["layers.0.linear_attn.in_proj_qkv.weight"].dtype == torch.bfloat16
    assert w["layers.0.linear_attn.A_log"].dtype == torch.float32
    with pytest.raises(ValueError, match="float16"):
        load_weights(tied_dir, spec, dtype="float16")
