"""The declared device-weight table drives the layout, the mesh placement and the planner's
groups, and changes none of them: every host weight (array, dtype, layout, placement, per-chip
shape, report group) of the tiny models and the published sizes on 1x1, 1x2, 1x4 and 2x4 meshes
hashes to the digest recorded from the suffix-table code it replaced."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import pytest

from tt_serve.model.precision import Precision
from tt_serve.model.published import SIZES, published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.checkpoint import layout_weights
from tt_serve.model.tt.layout.experts import MoeDispatch
from tt_serve.model.tt.layout.host import HostWeight, is_shape_only, shape_only_weights
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.layout.table import TABLE, DeviceWeight, Placement, slot
from tt_serve.model.tt.plan import planner

MESHES = ((1, 1), (1, 2), (1, 4), (2, 4))
# Two profiles in which every weight group has its own pair of dtypes, so a weight taking its
# dtype from the wrong group changes the digest.
PRECISIONS = (
    Precision(
        attention="bfloat16",
        gdn="bfloat8_b",
        mlp="bfloat4_b",
        experts="bfloat8_b",
        lm_head="bfloat16",
    ),
    Precision(
        attention="bfloat4_b",
        gdn="bfloat16",
        mlp="bfloat8_b",
        experts="bfloat4_b",
        lm_head="bfloat8_b",
    ),
)


def _tiny(kind: str) -> dict[str, Any]:
    """The tiny test models' configs (tests/tiny_models.py) without building a checkpoint."""
    cfg: dict[str, Any] = {
        "vocab_size": 4096,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    }
    moe = {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
    }
    if kind == "dense":
        return {"model_type": "qwen3_5_text", **cfg, "intermediate_size": 512}
    if kind == "moe":
        return {"model_type": "qwen3_5_moe_text", **cfg, **moe}
    del cfg["layer_types"]
    return {
        "model_type": "qwen3_next",
        **cfg,
        **moe,
        "full_attention_interval": 4,
        "intermediate_size": 384,
        "mlp_only_layers": [1],
    }


TINY = ("dense", "moe", "next")


def _synthetic(spec: ModelSpec) -> dict[str, np.ndarray]:
    """Every canonical tensor filled with distinct small integers (exact in float32, so the
    digests do not depend on the platform's rounding); A_log 0 so -exp(A_log) is exact too."""
    out = {}
    for k, (name, a) in enumerate(sorted(shape_only_weights(spec).items())):
        if name.endswith("A_log"):
            out[name] = np.zeros(a.shape, np.float32)
            continue
        v = (np.arange(a.size, dtype=np.int64) * 7 + 13 * k) % 4093 - 2046
        out[name] = v.astype(np.float32).reshape(a.shape)
    return out


def _record(name: str, hw: HostWeight, tp: TensorParallel, spec: ModelSpec) -> str:
    a = hw.array
    data = "shape-only" if is_shape_only(a) else hashlib.sha256(a.tobytes()).hexdigest()[:16]
    group = planner._weight_group(name, spec)
    return (
        f"{name}|{a.shape}|{a.dtype}|{hw.dtype}|{hw.layout}|{hw.shard_dim}|{hw.mesh_dims}|"
        f"{tp.chip_shape(hw)}|{group}|{data}"
    )


def laid_digest(
    spec: ModelSpec,
    w: dict[str, np.ndarray],
    precision: Precision,
    dispatch: MoeDispatch,
    mesh: tuple[int, int],
) -> str:
    """One digest of every laid-out weight on ``mesh``, as the backend and the planner lay it out
    (``tp.layout`` on a mesh of more than one chip), or of the split's refusal."""
    try:
        tp = TensorParallel.for_mesh(spec, mesh)
    except ValueError as e:
        return "refused:" + hashlib.sha256(str(e).encode()).hexdigest()[:16]
    laid = layout_weights(spec, w, precision, dispatch)
    if tp.degree > 1:
        laid = tp.layout(laid)
    lines = sorted(_record(n, hw, tp, spec) for n, hw in laid.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:20]


def model_digest(model: str) -> str:
    """``model`` (a tiny kind with synthetic values, or a published size shape-only): one
    digest over both profiles, both dispatch paths (MoE models) and every mesh of MESHES."""
    if model in TINY:
        spec = ModelSpec.from_config(_tiny(model), model_id=model)
        w = _synthetic(spec)
    else:
        spec = ModelSpec.from_config(published_config(model), model_id=model)
        w = shape_only_weights(spec)
    lines = []
    for p, prec in enumerate(PRECISIONS):
        for d in ("sparse", "dense") if spec.num_experts else ("sparse",):
            for mesh in MESHES:
                digest = laid_digest(spec, w, prec, d, mesh)
                lines.append(f"p{p}/{d}/{mesh[0]}x{mesh[1]}={digest}")
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:24]


# Recorded from the name-suffix placement tables the device-weight table replaced.
RECORDED = {
    "dense": "c5f6d3490ce28c5f4e742a54",
    "moe": "5125d5042a63ef0f8f197725",
    "next": "b64695f2d6af332127602fed",
    "qwen3.5-0.8b": "8d2740f78474bd9348e4c9ff",
    "qwen3.5-2b": "1b3fe247904e3a37fcb88e2f",
    "qwen3.5-4b": "ffdb0237f7d40498bc8cb904",
    "qwen3.5-9b": "59f48724b6a45c3f1042caaf",
    "qwen3.5-27b": "bb1ab2a497579d82d883448b",
    "qwen3.5-35b-a3b": "3a01b3537a3a6a8fe82f33e7",
    "qwen3.5-122b-a10b": "b79f88cba93c961367273cf4",
    "qwen3.5-397b-a17b": "ecfb4407f0557af15cdbe6ec",
    "qwen3.6-27b": "bb1ab2a497579d82d883448b",
    "qwen3.6-35b-a3b": "3a01b3537a3a6a8fe82f33e7",
}


# The largest published shapes take a second or more each: the slow run holds them.
_BIG = ("397b", "122b", "35b", "27b")


@pytest.mark.parametrize(
    "model",
    [
        *TINY,
        *(
            pytest.param(m, marks=pytest.mark.slow) if any(b in m for b in _BIG) else m
            for m in SIZES
        ),
    ],
)
def test_layout_matches_the_recorded_digests(model: str) -> None:
    assert model_digest(model) == RECORDED[model]


def _specs() -> list[ModelSpec]:
    tiny = [ModelSpec.from_config(_tiny(k), model_id=k) for k in TINY]
    return tiny + [ModelSpec.from_config(published_config(n), model_id=n) for n in SIZES]


def _entries_naming(spec: ModelSpec, name: str) -> list[DeviceWeight]:
    """The table entries whose declared name (``{j}`` any index in range) is ``name``, on the
    layer it names, found without the table's own lookup."""
    layer, _, field = name.partition(".")
    per_layer = layer.isdigit()
    found = []
    for w in TABLE:
        if (w.layers != "model") != per_layer:
            continue
        if per_layer and not w.carried_by(spec, int(layer)):
            continue
        pattern = re.escape(w.name).replace(re.escape("{j}"), r"(\d+)")
        m = re.fullmatch(pattern, field if per_layer else name)
        if m and (not m.groups() or int(m.group(1)) < w.count(spec)):
            found.append(w)
    return found


@pytest.mark.parametrize("spec", _specs(), ids=lambda s: s.model_id)
def test_every_device_weight_has_exactly_one_table_entry(spec: ModelSpec) -> None:
    """Each name the layout produces (either dispatch path) is declared once, by the entry that
    built it, and its placement and report group are that entry's."""
    used = set()
    for d in ("sparse", "dense"):
        laid = layout_weights(spec, shape_only_weights(spec), PRECISIONS[0], d)
        for name in laid:
            (entry,) = _entries_naming(spec, name)
            assert slot(spec, name).weight is entry
            assert planner._weight_group(name, spec) == entry.group
            used.add(entry)
    if spec.num_experts and any(not spec.is_moe_layer(i) for i in range(spec.num_layers)):
        assert used == set(TABLE), "every entry is some weight of a hybrid MoE model"
    with pytest.raises(KeyError, match="not a device weight"):
        slot(spec, "0.mlp.gate_proj")


def test_the_table_declares_what_the_runtime_and_planner_read() -> None:
    """Device names, dtypes and groups the model and the planner rely on, from the table."""
    by_name = {w.name: w for w in TABLE if w.layers in ("model", "gdn", "moe")}
    prec = PRECISIONS[1]
    assert by_name["lm_head"].dtype(prec) == prec.lm_head
    assert by_name["lm_head"].placement is Placement.ALL_CHIPS_COLUMN
    assert by_name["neg_a"].dtype(prec) == by_name["dt_bias"].dtype(prec) == "float32"
    assert by_name["tap{j}"].group == "gdn" and by_name["router"].group == "mlp"
    assert {w.placement for w in TABLE if w.name == "qkv"} == {
        Placement.ATTENTION_QKV,
        Placement.GDN_QKV,
    }
