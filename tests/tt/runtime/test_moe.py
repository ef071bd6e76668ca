"""The MoE block's dense reference path (``tt/runtime/moe.py``, stacked experts): exact against the dense
formula whatever the grouping, a fixed op count per layer whatever the expert count, the matmul
batch rules it relies on; and a real-size shape-only plan of Qwen3.6-35B-A3B (the default sparse
path). The sparse path's own tests are in test_moe_sparse.py."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tt_serve.model.published import write_published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import device_spec
from tt_serve.model.tt.layout import TILE
from tt_serve.model.tt.layout import experts as expert_layout
from tt_serve.model.tt.layout.transforms import linear_t, stacked_experts
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.plan import planner
from tt_serve.model.tt.runtime import moe
from tt_serve.model.tt.virtual import rules_matmul, rules_movement
from tt_serve.model.tt.virtual.device import VirtualTTNN
from tt_serve.model.tt.virtual.rules_base import DeviceLimitError, TensorInfo
from tt_serve.model.tt.virtual.tensors import ContractViolation

H, INTER, TOKENS, TOP_K = 64, 32, 5, 2


def _ops() -> tuple[Ops, VirtualTTNN]:
    fake = VirtualTTNN()
    ops = Ops(fake)
    ops.open_device(0, trace_region_size=1 << 20, l1_small_size=0)
    return ops, fake


def _checkpoint(experts: int, seed: int = 0) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (g.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)

    return {
        "router": rand(experts, H),
        "gate_up": rand(experts, 2 * INTER, H),
        "down": rand(experts, H, INTER),
        "shared_gate": rand(INTER, H),
        "shared_up": rand(INTER, H),
        "shared_down": rand(H, INTER),
        "shared_expert_gate": rand(1, H),
    }


def _weights(ops: Ops, ck: dict[str, np.ndarray]) -> moe.MoeWeights:
    experts = ck["router"].shape[0]
    groups = []
    for first, end in expert_layout.expert_groups(experts, INTER):
        gate, up, cat = stacked_experts(ck["gate_up"], ck["down"], first, end, INTER)
        groups.append(
            moe.ExpertGroup(
                ops.upload(gate, "bfloat16"),
                ops.upload(up, "bfloat16"),
                ops.upload(cat, "bfloat16"),
                first,
            )
        )
    return moe.MoeWeights(
        router=ops.upload(linear_t(ck["router"]), "bfloat16"),
        experts=tuple(groups),
        shared=tuple(  # type: ignore[arg-type]
            ops.upload(linear_t(ck[k]), "bfloat16")
            for k in ("shared_gate", "shared_up", "shared_down")
        ),
        shared_gate=ops.upload(linear_t(ck["shared_expert_gate"]), "bfloat16"),
        top_k=TOP_K,
        norm_topk_prob=True,
    )


def _dense(x: torch.Tensor, ck: dict[str, np.ndarray]) -> torch.Tensor:
    """Every expert on every token, weighted by the renormalised top-k probability (float32)."""
    t = {k: torch.from_numpy(v) for k, v in ck.items()}
    probs = torch.softmax(x @ t["router"].T, -1)
    top_v, top_i = probs.topk(TOP_K, -1)
    weight = torch.zeros_like(probs).scatter(-1, top_i, top_v / top_v.sum(-1, keepdim=True))
    out = torch.zeros_like(x)
    for e in range(t["router"].shape[0]):
        gu = x @ t["gate_up"][e].T
        h = F.silu(gu[:, :INTER]) * gu[:, INTER:]
        out += (h @ t["down"][e].T) * weight[:, e : e + 1]
    shared = (F.silu(x @ t["shared_gate"].T) * (x @ t["shared_up"].T)) @ t["shared_down"].T
    return out + torch.sigmoid(x @ t["shared_expert_gate"].T) * shared


@pytest.mark.parametrize("group_rows", [expert_layout.EXPERT_GROUP_ROWS, 3 * INTER, INTER])
def test_stacked_experts_match_the_dense_formula(
    group_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One group, groups of 3 (the last one of 2) and one expert per group give the dense
    per-expert result. The fake computes in float32, so the only difference is summation order:
    a few float32 ulps of values of order 1, hence the 1e-5 tolerance."""
    monkeypatch.setattr(expert_layout, "EXPERT_GROUP_ROWS", group_rows)
    ops, _ = _ops()
    ck = _checkpoint(8)
    w = _weights(ops, ck)
    assert len(w.experts) == len(expert_layout.expert_groups(8, INTER))
    x = np.random.default_rng(1).standard_normal((1, TOKENS, H)).astype(np.float32)
    got = ops.read(moe.moe_forward(ops, ops.upload(x, "bfloat16"), w))
    want = _dense(torch.from_numpy(x[0]), ck).numpy()
    np.testing.assert_allclose(got[0], want, atol=1e-5, rtol=1e-5)


def test_op_count_does_not_grow_with_the_expert_count() -> None:
    """One group: 11 routing programs (one topk with two outputs), 4 for the transposes in, 7
    for the experts, 2 out, 8 for the shared expert, 1 add = 33, for 4 experts as for 64."""
    counts = []
    for experts in (4, 64):
        ops, fake = _ops()
        w = _weights(ops, _checkpoint(experts))
        x = ops.upload(np.zeros((1, TOKENS, H), np.float32), "bfloat16")
        before = sum(fake.counts.values())
        moe.moe_forward(ops, x, w)
        counts.append(sum(fake.counts.values()) - before)
    assert counts == [33, 33], counts


def test_expert_groups_cover_every_expert_once() -> None:
    groups = expert_layout.expert_groups(256, 512)
    assert groups == [(0, 64), (64, 128), (128, 192), (192, 256)]
    assert expert_layout.expert_groups(8, 128) == [(0, 8)]
    assert expert_layout.expert_groups(5, 1 << 20) == [(i, i + 1) for i in range(5)]


def _t(*shape: int, dtype: str = "bfloat16") -> TensorInfo:
    return TensorInfo(shape, dtype, "tile")


def test_matmul_batch_rules() -> None:
    # B batch 1: broadcast over A's batches (the stacked experts' gate/up), output A's batch
    assert rules_matmul.matmul(_t(1, 256, 512, 2048, dtype="bfloat4_b"), _t(1, 1, 2048, 32)) == (
        1,
        256,
        512,
        32,
    )
    assert rules_matmul.matmul(_t(1, 32, 2048), _t(2048, 512)) == (1, 32, 512)  # x @ W
    assert rules_matmul.matmul(_t(2, 3, 32, 64), _t(2, 3, 64, 32)) == (2, 3, 32, 32)
    for a, b, rule in (
        (_t(1, 1, 32, 2048), _t(1, 256, 2048, 512), "matmul.batch"),  # A reuse: not modelled
        (_t(2, 32, 64), _t(1, 2, 64, 32), "matmul.batch"),  # ranks differ
        (_t(1, 32, 64), _t(1, 65, 32), "matmul.shape"),
        (_t(32, 64), TensorInfo((64, 32), "bfloat16", "row_major"), "matmul.layout"),
        (_t(32, 64), _t(64, 32, dtype="int32"), "matmul.dtype"),
    ):
        with pytest.raises(DeviceLimitError) as info:
            rules_matmul.matmul(a, b)
        assert info.value.rule == rule, (a, b)
    ops, _ = _ops()
    w = ops.upload(np.zeros((1, 4, 32, 64), np.float32), "bfloat4_b", TILE)
    xt = ops.upload(np.zeros((1, 1, 64, 32), np.float32), "bfloat16", TILE)
    assert ops.matmul(w, xt).dtype.value == "bfloat4_b"  # ttnn's default: A's dtype
    assert ops.matmul(w, xt, dtype="bfloat16").dtype.value == "bfloat16"
    with pytest.raises(ContractViolation) as cv:
        ops.matmul(xt, ops.upload(np.zeros((1, 4, 32, 64), np.float32), "bfloat16", TILE))
    assert cv.value.rule == "matmul.batch"


def test_permute_rules() -> None:
    assert rules_movement.permute(_t(1, 1, 16, 256), [0, 3, 1, 2]) == (1, 256, 1, 16)
    for dims, rule in (([0, 2, 1], "permute.rank"), ([0, 1, 1, 2], "permute.dims")):
        with pytest.raises(DeviceLimitError) as info:
            rules_movement.permute(_t(1, 1, 16, 256), dims)
        assert info.value.rule == rule


@pytest.fixture(scope="module")
def q35(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published_config("qwen3.6-35b-a3b", tmp_path_factory.mktemp("q35"))


@pytest.mark.slow
def test_plan_qwen36_35b_a3b_bfp4_on_p150(q35: Path) -> None:
    """Startup, captures, prefill, decode and snapshot copies of the published config on the
    shape-only P150 at max_batch 16, in well under a minute (the per-expert loop took > 400 s)."""
    spec = ModelSpec.from_hf_dir(q35)
    board = device_spec("p150")
    req = TTOptions(precision="bfp4-mlp", max_batch_size=16)
    log = io.StringIO()
    start = time.monotonic()
    p = planner.plan(spec, board, req, log)
    elapsed = time.monotonic() - start
    assert elapsed < 60, elapsed
    assert p.ok or p.limit_rule, p
    assert p.ok, f"[{p.limit_rule}] {p.limit_message}"
    phases = {json.loads(line)["phase"] for line in log.getvalue().splitlines()}
    assert phases >= {"startup", "capture", "prefill", "decode", "copy"}
    # 40 layers x 256 experts x 3 x 2048 x 512 parameters in bfloat4_b (576 B per 1024-tile)
    experts = 40 * 256 * 3 * 2048 * 512 * 576 / 1024
    assert abs(p.weights["experts"] - experts) / experts < 0.01
    assert p.kv_blocks > 0 and p.dram_left >= 0
