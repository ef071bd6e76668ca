"""The sparse MoE path (``tt/runtime/moe.py`` on ``ttnn.sparse_matmul``): the op's rules and semantics in
the contract fake, the dense formula on blocks of tokens, only the routed experts read, and the
tiny MoE model end to end (exactly the torch backend's tokens) on one chip and on 1 x 2 / 1 x 4
meshes with whole experts per chip, in bf16 and the block-float profiles."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tt import harness as h
from tests.tt.runtime.test_moe import INTER, TOP_K, H, _checkpoint, _dense, _ops, _weights
from tt_serve.model.precision import Precision
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout import ROW_MAJOR
from tt_serve.model.tt.layout.checkpoint import layout_weights
from tt_serve.model.tt.layout.host import shape_only_weights
from tt_serve.model.tt.layout.transforms import sparse_experts
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime import moe
from tt_serve.model.tt.virtual import rules_moe
from tt_serve.model.tt.virtual.device import P150, WORMHOLE, VirtualTTNN
from tt_serve.model.tt.virtual.rules_base import DeviceLimitError, TensorInfo
from tt_serve.model.tt.virtual.rules_moe import Matmul1DConfig
from tt_serve.model.tt.virtual.tensors import ContractViolation

EXPERTS = 8


def _sparse(ops: Ops, ck: dict[str, np.ndarray], dtype: str = "bfloat16") -> moe.MoeWeights:
    gate_up, down = sparse_experts(ck["gate_up"], ck["down"])
    experts = moe.SparseExperts(ops.upload(gate_up, dtype), ops.upload(down, dtype))
    return dataclasses.replace(_weights(ops, ck), experts=experts)


def _top_k(x: np.ndarray, ck: dict[str, np.ndarray]) -> torch.Tensor:
    """Each token's top-k experts by the reference router (float32)."""
    probs = torch.softmax(torch.from_numpy(x) @ torch.from_numpy(ck["router"]).T, -1)
    return probs.topk(TOP_K, -1).indices


@pytest.mark.parametrize("tokens", [5, 96, 512])
def test_sparse_experts_match_the_dense_formula(tokens: int) -> None:
    """One block of 5 rows, one of 96 and two of 256 give the per-expert float32 result; only
    the summation order differs (a few ulps of values of order 1: the 1e-5 of test_moe)."""
    ops, _ = _ops()
    ck = _checkpoint(EXPERTS)
    x = np.random.default_rng(1).standard_normal((1, tokens, H)).astype(np.float32)
    got = ops.read(moe.moe_forward(ops, ops.upload(x, "bfloat16"), _sparse(ops, ck)))
    want = _dense(torch.from_numpy(x[0]), ck).numpy()
    np.testing.assert_allclose(got[0], want, atol=1e-5, rtol=1e-5)


def test_only_the_routed_experts_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block (here 3 of 4 rows) computes, and reads the weights of, exactly the union of
    its rows' top-k experts, counted independently from the reference router; a row mask leaves
    only the kept rows' experts. (The dense path reads every expert on every call.)"""
    monkeypatch.setattr(moe, "BLOCK_ROWS", 4)
    ops, fake = _ops()
    ck = _checkpoint(EXPERTS, seed=3)
    x = np.random.default_rng(4).standard_normal((1, 12, H)).astype(np.float32)
    top = _top_k(x[0], ck)
    unions = [len(set(top[b * 4 : (b + 1) * 4].flatten().tolist())) for b in range(3)]
    assert sum(unions) < 3 * EXPERTS, "every block routing everywhere makes this vacuous"
    got = moe.moe_forward(ops, ops.upload(x, "bfloat16"), _sparse(ops, ck))
    np.testing.assert_allclose(
        ops.read(got)[0], _dense(torch.from_numpy(x[0]), ck).numpy(), atol=1e-5, rtol=1e-5
    )
    (gu_plan, gu_active), (down_plan, down_active) = fake.sparse_matmul_work
    assert gu_active == down_active == sum(unions)
    assert gu_plan.batches == down_plan.batches == 3 * EXPERTS
    # one expert's [H, 2I] and [I, H] blocks in bf16 tiles
    assert gu_plan.b_batch_bytes == (H // 32) * (2 * INTER // 32) * 2048
    assert down_plan.b_batch_bytes == (INTER // 32) * (H // 32) * 2048
    # one kept row (a decode batch with one active slot): exactly its top-k experts
    rows = np.zeros((1, 5, 1), np.float32)
    rows[0, 2] = 1.0
    out = moe.moe_forward(
        ops, ops.upload(x[:, :5], "bfloat16"), _sparse(ops, ck), ops.upload(rows, "float32")
    )
    assert [a for _, a in fake.sparse_matmul_work[2:]] == [TOP_K, TOP_K]
    dense = ops.read(
        moe.moe_forward(
            ops, ops.upload(x[:, :5], "bfloat16"), _weights(ops, ck), ops.upload(rows, "float32")
        )
    )
    np.testing.assert_allclose(ops.read(out)[0, 2], dense[0, 2], atol=1e-5, rtol=1e-5)


def _t(*shape: int, dtype: str = "bfloat16", layout: str = "tile") -> TensorInfo:
    return TensorInfo(shape, dtype, layout)


CFG = Matmul1DConfig((8, 1), 2, 1, 1, 1, 1, 1, 1, False, True)


def _call(a: TensorInfo, b: TensorInfo, s: TensorInfo, **kw: object) -> rules_moe.SparseMatmulPlan:
    args: dict = {"nnz": None, "is_input_a_sparse": False, "is_input_b_sparse": True}
    config = kw.pop("config", CFG)
    args.update(kw)
    return rules_moe.sparse_matmul(P150, a, b, s, config, **args)  # type: ignore[arg-type]


def test_sparse_matmul_modes() -> None:
    """The 0.81.1 docstring's mode table: output shapes of the three modes."""
    sp = _t(1, 3, 1, 8, layout=ROW_MAJOR)
    assert _call(_t(1, 3, 32, 64), _t(1, 8, 64, 256), sp).shape == (1, 3, 1, 8, 32, 256)
    both = {"is_input_a_sparse": True}
    s1 = _t(1, 1, 1, 8, layout=ROW_MAJOR)
    assert _call(_t(1, 8, 5, 64), _t(1, 8, 64, 256), s1, **both).shape == (1, 8, 5, 256)
    a_only = {"is_input_a_sparse": True, "is_input_b_sparse": False}
    s3 = _t(1, 1, 3, 8, layout=ROW_MAJOR)
    plan = _call(
        _t(3, 8, 32, 64, dtype="bfloat16"), _t(1, 8, 64, 256, dtype="bfloat4_b"), s3, **a_only
    )
    assert plan.shape == (3, 8, 32, 256) and plan.batches == 24
    assert plan.b_batch_bytes == 2 * 8 * 576  # bfp4 tiles
    assert _call(_t(1, 3, 32, 64), _t(1, 8, 64, 256, dtype="bfloat8_b"), sp, nnz=24).batches == 24


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"config": None}, "sparse_matmul.program_config"),
        ({"config": dataclasses.replace(CFG, mcast_in0=False)}, "sparse_matmul.program_config"),
        ({"config": dataclasses.replace(CFG, grid=(12, 1))}, "sparse_matmul.program_config"),
        ({"config": dataclasses.replace(CFG, out_subblock_w=2)}, "sparse_matmul.program_config"),
        ({"config": dataclasses.replace(CFG, in0_block_w=3)}, "sparse_matmul.program_config"),
        ({"config": dataclasses.replace(CFG, grid=(4, 1))}, "sparse_matmul.cores"),
        ({"s": _t(1, 3, 1, 8)}, "sparse_matmul.sparsity"),
        ({"s": _t(1, 3, 1, 8, dtype="float32", layout=ROW_MAJOR)}, "sparse_matmul.sparsity"),
        ({"s": _t(1, 1, 3, 8, layout=ROW_MAJOR)}, "sparse_matmul.sparsity"),
        ({"b": _t(1, 8, 64, 256, dtype="int32")}, "sparse_matmul.dtype"),
        ({"b": _t(1, 8, 96, 256)}, "sparse_matmul.shape"),
        ({"b": _t(8, 64, 256)}, "sparse_matmul.rank"),
        ({"a": _t(1, 3, 32, 64, layout=ROW_MAJOR)}, "sparse_matmul.layout"),
        ({"is_input_b_sparse": False}, "sparse_matmul.mode"),
        ({"is_input_a_sparse": True}, "sparse_matmul.shape"),
        ({"nnz": 0}, "sparse_matmul.nnz"),
        ({"nnz": 25}, "sparse_matmul.nnz"),
    ],
)
def test_sparse_matmul_rules(change: dict, rule: str) -> None:
    a = change.pop("a", _t(1, 3, 32, 64))
    b = change.pop("b", _t(1, 8, 64, 256))
    s = change.pop("s", _t(1, 3, 1, 8, layout=ROW_MAJOR))
    with pytest.raises(DeviceLimitError) as info:
        _call(a, b, s, **change)
    assert info.value.rule == rule


def test_every_core_of_the_multicast_grid_gets_work() -> None:
    """tt-metal multicasts in0 to the config's whole grid and refuses a grid with idle cores
    (sparse_matmul_multicore_reuse_mcast_1d_optimized.cpp:312, found on a mock P300: 32 blocks
    of the 35B-A3B's TP experts on an 11x3 grid); the backend's config picks a rectangle of
    exactly the cores with work, on Blackhole's 11x10 grid and Wormhole's 8x8."""
    idle = dataclasses.replace(CFG, grid=(11, 3), per_core_N=1)
    with pytest.raises(DeviceLimitError) as info:
        _call(_t(1, 3, 32, 64), _t(1, 8, 64, 1024), _t(1, 3, 1, 8, layout=ROW_MAJOR), config=idle)
    msg = str(info.value)
    assert info.value.rule == "sparse_matmul.cores" and "make it rectangular" in msg
    for chip in (P150, WORMHOLE):
        ops = Ops(VirtualTTNN(chip=chip))
        ops.open_device(0, trace_region_size=1 << 20, l1_small_size=0)
        for n_tiles in (7, 16, 32, 33, 64, 96, 121, 256):
            c = moe.sparse_program_config(ops, 32, 64, 32 * n_tiles)
            x, y = c.grid
            assert x <= chip.grid_x and y <= chip.grid_y
            assert -(-n_tiles // c.per_core_N) == x * y, (chip.arch, n_tiles, x, y, c.per_core_N)


def test_skipped_entries_are_zero_and_nnz_must_be_exact() -> None:
    """A skipped (block, expert) entry is zero even where its operand holds NaN (the op does
    not read it); nnz other than the non-zero count is the device hang, refused."""
    fake = VirtualTTNN()
    ops = Ops(fake)
    ops.open_device(0, trace_region_size=1 << 20, l1_small_size=0)
    g = np.random.default_rng(0)
    a = g.standard_normal((1, 4, 32, 64)).astype(np.float32)
    a[0, 1] = np.nan
    b = g.standard_normal((1, 4, 64, 64)).astype(np.float32)
    mask = np.array([1, 0, 1, 1], np.float32).reshape(1, 1, 1, 4)
    config = moe.sparse_program_config(ops, 32, 64, 64)
    out = ops.sparse_matmul(
        ops.upload(a, "bfloat16"),
        ops.upload(b, "bfloat8_b"),
        ops.upload(mask, "bfloat16", ROW_MAJOR),
        program_config=config,
        a_sparse=True,
        b_sparse=True,
    )
    got = ops.read(out)
    np.testing.assert_array_equal(got[0, 1], 0.0)
    np.testing.assert_allclose(got[0, [0, 2, 3]], (a @ b)[0, [0, 2, 3]], rtol=1e-5, atol=1e-4)
    args = [ops.upload(x, "bfloat16") for x in (a, b)]
    sp = ops.upload(mask, "bfloat16", ROW_MAJOR)
    kw = {"sparsity": sp, "program_config": config, "is_input_a_sparse": True}
    fake.sparse_matmul(*args, nnz=3, **kw)  # type: ignore[arg-type]
    with pytest.raises(ContractViolation) as cv:
        fake.sparse_matmul(*args, nnz=4, **kw)  # type: ignore[arg-type]
    assert cv.value.rule == "sparse_matmul.nnz"


# ---- the tiny MoE model end to end ------------------------------------------------------------
@pytest.fixture(scope="module")
def moe_torch_tokens(
    moe_dir: Path, prompts: tuple[list[int], list[int]]
) -> list[tuple[list[int], int]]:
    spec = ModelSpec.from_hf_dir(moe_dir)
    return h.generate(h.engine(h.torch_backend(moe_dir), spec), list(prompts), 8)


def _decode_reads(fakes: list[VirtualTTNN], rows: int) -> list[int]:
    """Experts computed per decode-program gate/up call, summed over the chips (a decode batch
    is one block of ``rows`` rows; prefill blocks are whole buckets of 32 rows or more)."""
    per_chip = [
        [a for p, a in f.sparse_matmul_work if len(p.shape) == 6 and p.shape[-2] == rows]
        for f in fakes
    ]
    return [sum(col) for col in zip(*per_chip, strict=True)]  # type: ignore[misc]


@pytest.mark.slow
def test_single_chip_sparse_equals_torch_and_dense(
    moe_dir: Path,
    prompts: tuple[list[int], list[int]],
    moe_torch_tokens: list[tuple[list[int], int]],
) -> None:
    """Sparse (the default) and dense dispatch give the torch tokens, the second prompt a warm
    hit at 256 that equals its cold run, pipelined (deviceResident) as synchronous; every
    decode step reads top_k of the 8 experts per layer (one active row; idle rows route
    nowhere) where the dense path reads all 8."""
    spec = ModelSpec.from_hf_dir(moe_dir)
    fake = h.fake()
    sparse = h.generate(h.engine(h.tt_backend(moe_dir, fake), spec), list(prompts), 8)
    assert sparse == moe_torch_tokens and sparse[1][1] == 256
    reads = _decode_reads([fake], rows=4)
    moe_layers = sum(spec.is_moe_layer(i) for i in range(spec.num_layers))
    # 7 decode steps per prompt; the compile and capture runs have every row idle: 0 experts
    assert reads.count(spec.num_experts_per_tok) == 14 * moe_layers
    assert set(reads) == {0, spec.num_experts_per_tok}
    dense_fake = h.fake()
    be = h.tt_backend(moe_dir, dense_fake, moe_dispatch="dense")
    assert h.generate(h.engine(be, spec), list(prompts), 8) == moe_torch_tokens
    assert "sparse_matmul" not in dense_fake.counts
    cold = h.generate(h.engine(h.tt_backend(moe_dir), spec, prefix_caching=False), [prompts[1]], 8)
    assert cold[0][1] == 0 and cold[0][0] == sparse[1][0]
    piped = h.tt_backend(moe_dir, device_resident=True)
    eng = h.engine(piped, spec)
    assert eng.pipelining
    assert h.generate(eng, list(prompts), 8) == moe_torch_tokens
    assert piped.device_fed_decodes > 0


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_mesh_expert_placement(
    moe_dir: Path,
    prompts: tuple[list[int], list[int]],
    moe_torch_tokens: list[tuple[list[int], int]],
    n: int,
) -> None:
    """Whole experts per chip (8 / n), the router replicated, the chips' partial sums
    all-reduced: the torch tokens with the warm hit (equal to the cold run), synchronous and
    pipelined (deviceResident); a decode step's chips together compute top_k experts per
    layer."""
    spec = ModelSpec.from_hf_dir(moe_dir)
    fake = h.mesh_fake(n)
    be = h.mesh_backend(moe_dir, n, fake)
    assert h.generate(h.engine(be, spec), list(prompts), 8) == moe_torch_tokens
    layer = be.model.layers[0].mlp
    assert isinstance(layer, moe.MoeWeights) and isinstance(layer.experts, moe.SparseExperts)
    assert layer.experts.gate_up.shape == (1, spec.num_experts // n, spec.hidden_size, 256)
    assert layer.experts.select is not None and layer.experts.select.shape[-1] == 8 // n
    assert set(_decode_reads(fake.chips, rows=4)) == {0, spec.num_experts_per_tok}
    cold_be = h.mesh_backend(moe_dir, n)
    cold = h.generate(h.engine(cold_be, spec, prefix_caching=False), [prompts[1]], 8)
    assert cold == [(moe_torch_tokens[1][0], 0)]
    piped = h.mesh_backend(moe_dir, n, device_resident=True)
    eng = h.engine(piped, spec)
    assert eng.pipelining
    assert h.generate(eng, list(prompts), 8) == moe_torch_tokens
    assert piped.device_fed_decodes > 0


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["mixed", "bfp4-mlp"])
def test_block_float_experts(moe_dir: Path, profile: str) -> None:
    """The experts in bfloat8_b / bfloat4_b go through sparse_matmul (the fake keeps float32
    values, so the tokens are the torch backend's; block-float numerics are the hardware
    tier's)."""
    spec = ModelSpec.from_hf_dir(moe_dir)
    p = [h.prompt(100, 7)]
    ref = h.generate(h.engine(h.torch_backend(moe_dir), spec), p, 4)
    prec = Precision.named(profile)
    be = h.tt_backend(moe_dir, precision=profile)
    assert h.generate(h.engine(be, spec), p, 4) == ref
    layer = be.model.layers[0].mlp
    assert isinstance(layer, moe.MoeWeights) and isinstance(layer.experts, moe.SparseExperts)
    assert layer.experts.gate_up.dtype.value == layer.experts.down.dtype.value == prec.experts


def test_unknown_dispatch_is_refused(moe_dir: Path) -> None:
    spec = ModelSpec.from_hf_dir(moe_dir)
    with pytest.raises(ValueError, match="moe_dispatch"):
        layout_weights(spec, shape_only_weights(spec), Precision(), "topk")  # type: ignore[arg-type]
    sparse = layout_weights(spec, shape_only_weights(spec), Precision())
    assert sparse["0.experts.gate_up"].array.shape == (1, 8, spec.hidden_size, 256)
    assert not any(".experts.0." in n for n in sparse)
    dense = layout_weights(spec, shape_only_weights(spec), Precision(), "dense")
    assert "0.experts.0.gate" in dense and "0.experts.gate_up" not in dense


def test_shape_only_real_size_layer_charges_the_expanded_outputs() -> None:
    """One Qwen3.6-35B-A3B MoE layer on a 256-token chunk in the planner's shape-only fake
    (bfp4 experts): the rules pass at real size, each sparse matmul scans the 256 experts and
    reads 576-B bfp4 tiles per expert, and the DRAM peak holds the expanded outputs (128 MiB of
    gate/up and 256 MiB of down projections, bf16)."""
    hidden, inter, experts, tokens = 2048, 512, 256, 256
    fake = VirtualTTNN(shape_only=True)
    ops = Ops(fake)
    ops.open_device(0, trace_region_size=1 << 20, l1_small_size=0)

    def z(*shape: int, dtype: str = "bfloat16") -> object:
        return ops.zeros(shape, dtype)

    w = moe.MoeWeights(
        router=z(hidden, experts),
        experts=moe.SparseExperts(
            z(1, experts, hidden, 2 * inter, dtype="bfloat4_b"),
            z(1, experts, inter, hidden, dtype="bfloat4_b"),
        ),
        shared=(z(hidden, inter), z(hidden, inter), z(inter, hidden)),
        shared_gate=z(hidden, 1),
        top_k=8,
        norm_topk_prob=True,
    )
    before = fake.dram.used_per_bank * fake.dram.banks
    out = moe.moe_forward(ops, z(1, tokens, hidden), w)
    assert out.shape == (1, tokens, hidden)
    (gu, active_gu), (down, active_down) = fake.sparse_matmul_work
    assert active_gu is None and active_down is None  # shape-only: the routing is unknown
    assert gu.batches == down.batches == experts
    assert gu.b_batch_bytes == (hidden // 32) * (2 * inter // 32) * 576
    peak = fake.dram_peak_per_bank * fake.dram.banks - before
    assert peak > (128 + 256) << 20


@pytest.mark.slow
def test_weight_cache_keys_the_expert_layout(moe_dir: Path, tmp_path: Path) -> None:
    """The converted-weight cache holds one folder per dispatch: a sparse backend loads the
    sparse layout from it without reconverting, and a dense one does not take it."""
    spec = ModelSpec.from_hf_dir(moe_dir)
    first = h.tt_backend(moe_dir, weight_cache_dir=tmp_path)
    folders = {p.parent for p in tmp_path.rglob("manifest.json")}

    def boom() -> dict[str, np.ndarray]:
        raise AssertionError("a cache hit must not reconvert the checkpoint")

    ops = Ops(h.fake())
    ops.open_device(0, trace_region_size=h.TRACE_REGION, l1_small_size=0)
    second = h.build(
        spec,
        boom,
        ops=ops,
        prefill_chunk=h.CHUNK,
        weight_cache_dir=tmp_path,
        checkpoint=moe_dir,
    )
    layer = second.model.layers[0].mlp
    assert isinstance(layer, moe.MoeWeights) and isinstance(layer.experts, moe.SparseExperts)
    p = [h.prompt(70, 3)]
    assert h.generate(h.engine(first, spec), p, 4) == h.generate(h.engine(second, spec), p, 4)
    h.tt_backend(moe_dir, weight_cache_dir=tmp_path, moe_dispatch="dense")
    assert len({p.parent for p in tmp_path.rglob("manifest.json")} - folders) == 1
