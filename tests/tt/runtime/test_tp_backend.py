"""The tt backend tensor-parallel on a fake 1 x 2 and 1 x 4 mesh and on the 2-D 2 x 2 and
2 x 4 meshes (``VirtualMeshTTNN``, numeric mode): the torch backend's tokens, warm == cold,
pipelined == synchronous, device draws and logits as on one chip, and a state restore that fails
on one chip fails the hit cleanly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests import numerics as nm
from tests.tt import harness as h
from tt_serve.model.interface import RowSampling, StateCopy, StepBatch, StepRow
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.launch import identify, launch
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime.backend import StateCopyError
from tt_serve.model.tt.runtime.moe import SparseExperts
from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN
from tt_serve.sequence import SamplingParams


def mesh2d_fake(rows: int, cols: int) -> VirtualMeshTTNN:
    return h.mesh_fake(rows * cols)


def mesh2d_backend(
    path: Path, rows: int, cols: int, fake: VirtualMeshTTNN | None = None, **kw: object
) -> h.TTBackend:
    """The tt backend tensor-parallel over a fake ``rows`` x ``cols`` mesh."""
    ops = Ops(fake or mesh2d_fake(rows, cols))
    ops.open_mesh((rows, cols), trace_region_size=h.TRACE_REGION, l1_small_size=0)
    spec = ModelSpec.from_hf_dir(path)
    kw.setdefault("prefill_chunk", h.CHUNK)
    return h.build(spec, h.load_weights(path, spec), ops=ops, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_tp_tokens_match_torch_with_warm_prefix_hit(
    dense_dir: Path,
    prompts: tuple[list[int], list[int]],
    torch_tokens: list[tuple[list[int], int]],
    n: int,
) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    fake = h.mesh_fake(n)
    be = h.mesh_backend(dense_dir, n, fake)
    got = h.generate(h.engine(be, spec), list(prompts), 12)
    assert got == torch_tokens
    assert got[1][1] == 256, "the second prompt must be a warm prefix hit"
    assert be.programs.num_captured == len(be.buckets) + 1  # captured on the mesh
    # Each chip holds its heads: 4 q / 2 KV heads (KV replicated past 2 chips), 8 GDN value
    # heads, a quarter or half of the vocabulary.
    assert be.pools is not None
    assert be.pools.k[0].shape[1] == max(1, spec.num_kv_heads // n)
    assert be.pools.rec[0].shape[1] == spec.linear_num_value_heads // n
    assert be.pools.conv[0].shape[-1] == spec.conv_dim // n
    assert be.model.lm_head[0].shape[1] == spec.vocab_size // n
    kinds = {op for op, _, _, _ in fake.ccl_calls}
    assert kinds == {"all_gather_async", "reduce_scatter_minimal_async"}
    assert {topo for _, _, topo, _ in fake.ccl_calls} == {"linear"}
    assert {axis for _, _, _, axis in fake.ccl_calls} == {1}  # one line: no axis-0 collective
    # Weights, pools and buffers are charged to every chip alike (SPMD, lock-step allocator).
    assert len({c.dram.used_per_bank for c in fake.chips}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_tp_warm_equals_cold(dense_dir: Path, prompts: tuple[list[int], list[int]], n: int) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    cold_be = h.mesh_backend(dense_dir, n)
    cold = h.generate(h.engine(cold_be, spec, prefix_caching=False), [prompts[1]], 12)
    warm = h.generate(h.engine(h.mesh_backend(dense_dir, n), spec), list(prompts), 12)
    assert cold[0][1] == 0 and warm[1][1] == 256
    assert warm[1][0] == cold[0][0]


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_tp_pipelined_equals_synchronous(
    dense_dir: Path,
    prompts: tuple[list[int], list[int]],
    torch_tokens: list[tuple[list[int], int]],
    n: int,
) -> None:
    """deviceResident on the mesh: fed ids are the replicated picks every chip holds."""
    spec = ModelSpec.from_hf_dir(dense_dir)
    be = h.mesh_backend(dense_dir, n, device_resident=True)
    eng = h.engine(be, spec)
    assert eng.pipelining
    assert h.generate(eng, list(prompts), 12) == torch_tokens
    assert be.device_fed_decodes == 20 and eng.num_pipelined_steps == 20


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_tp_moe_tokens_match_torch(moe_dir: Path, n: int) -> None:
    """Whole experts placed per chip (8 / n each, the sparse path), the shared expert column /
    row parallel, the router replicated."""
    spec = ModelSpec.from_hf_dir(moe_dir)
    p = [h.prompt(140, 11)]
    ref = h.generate(h.engine(h.torch_backend(moe_dir), spec), p, 6)
    be = h.mesh_backend(moe_dir, n)
    assert h.generate(h.engine(be, spec), p, 6) == ref
    layer = be.model.layers[0].mlp
    assert not isinstance(layer, tuple)
    assert isinstance(layer.experts, SparseExperts)
    assert layer.experts.gate_up.shape[1] == spec.num_experts // n


TABLES = {1: (1, 2), 2: (3, 4)}
DRAWS = (
    RowSampling(0.7, top_k=20, uniform=0.3),
    RowSampling(1.0, top_k=32, top_p=0.9, uniform=0.8),
)


def _sampled_run(be: h.TTBackend) -> list[tuple[list[int | None], list[dict[int, float] | None]]]:
    """Prefill two slots, then decode steps whose rows draw on the device with logprobs, then
    one greedy step whose row also returns logits."""
    be.allocate(num_kv_blocks=8, block_size=h.BLOCK, num_state_slots=3, num_snapshot_slots=2)
    be.copy_states([StateCopy.reset(1), StateCopy.reset(2)])
    rows = tuple(
        StepRow(s, tuple(h.prompt(n, 20 + s)), 0, TABLES[s], s, True)
        for s, n in zip((1, 2), (70, 40), strict=True)
    )
    out = be.execute(StepBatch(rows))
    ids = {r.state_slot: out.token_ids[i] or 0 for i, r in enumerate(rows)}
    pos = {1: 70, 2: 40}
    got = [(out.token_ids, out.logprobs)]
    for k in range(4):
        batch = tuple(
            StepRow(s, (ids[s],), pos[s] + k, TABLES[s], s, True, top_logprobs=3, sampling=d)
            for s, d in zip((1, 2), DRAWS, strict=True)
        )
        r = be.execute(StepBatch(batch))
        ids = {s: r.token_ids[i] or 0 for i, s in enumerate((1, 2))}
        got.append((r.token_ids, r.logprobs))
    return got


@pytest.mark.slow
def test_tp_device_draws_equal_single_chip(dense_dir: Path) -> None:
    """RowSampling rows drawn on a 1 x 4 mesh (local top-32 per chip, gathered, the final pick
    on every chip) give the single-chip ttnn draws; their logprobs differ only by the order of
    the fp32 sums of the log-normaliser (per-chip partial sums): ~1e-6 on logprobs of
    magnitude < 20 (fp32 epsilon 1.2e-7 x 4096 terms summed at most, relative)."""
    one = _sampled_run(h.tt_backend(dense_dir))
    mesh = _sampled_run(h.mesh_backend(dense_dir, 4))
    assert [t for t, _ in mesh] == [t for t, _ in one]
    assert len({t for toks, _ in one for t in toks}) >= 4, "degenerate draws make this vacuous"
    for (_, lp_mesh), (_, lp_one) in zip(mesh, one, strict=True):
        for a, b in zip(lp_mesh, lp_one, strict=True):
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert a.keys() == b.keys()
                np.testing.assert_allclose(list(a.values()), list(b.values()), atol=1e-5)


def test_tp_logits_match_torch(dense_dir: Path) -> None:
    """want_logits rows read every chip's vocabulary shard (a concat composer); the partial
    sums of row-parallel projections are summed in another order than one matmul, inside the
    derived fp32 bound of test_tt_backend.test_logits_match_torch_backend."""
    p = h.prompt(180, 5)
    got = []
    for be in (h.torch_backend(dense_dir), h.mesh_backend(dense_dir, 2)):
        be.allocate(num_kv_blocks=16, block_size=h.BLOCK, num_state_slots=3, num_snapshot_slots=2)
        be.copy_states([StateCopy.reset(1)])
        tab, logits = (1, 2, 3, 4), []
        for s, e in ((0, 128), (128, 180)):
            r = be.execute(StepBatch((StepRow(1, tuple(p[s:e]), s, tab, 1, True, True),)))
            logits.append(r.logits[0])
        r = be.execute(StepBatch((StepRow(1, (p[80],), 180, tab, 1, True, True),)))
        logits.append(r.logits[0])
        got.append(logits)
    dims = nm.model_dims(dense_dir)
    for ref, tt in zip(*got, strict=True):
        assert tt.shape == ref.shape
        np.testing.assert_allclose(tt, ref, atol=nm.logits_bound(float(np.abs(ref).max()), dims))


def _fault_on_restore(
    be: h.TTBackend,
    fake: VirtualMeshTTNN,
    chip: int,
    spec: ModelSpec,
    prompts: tuple[list[int], list[int]],
    torch_tokens: list[tuple[list[int], int]],
) -> None:
    """The first prompt cold, then its warm hit with a fault injected into ``chip``'s part of
    the snapshot restore: StateCopyError, that request fails naming the chip, nothing leaks
    (blocks, slots), and the same hit again gives the torch tokens."""
    eng = h.engine(be, spec)
    a, b = prompts
    assert h.generate(eng, [a], 12) == torch_tokens[:1]
    errors: list[BaseException] = []
    original = be.copy_states

    def spy(copies: list[StateCopy] | tuple[StateCopy, ...]) -> None:
        try:
            original(copies)
        except Exception as exc:
            errors.append(exc)
            raise

    be.copy_states = spy  # type: ignore[method-assign]
    fake.inject_fault(chip, "fill_cache")
    eng.add_request("hit", b, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    done = None
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                done = o
    assert done is not None and done.error is not None and f"chip {chip}" in done.error
    assert len(errors) == 1 and isinstance(errors[0], StateCopyError)
    c = eng.scheduler.cache
    c.check_invariants()
    assert c.num_active_blocks == 0
    assert c.num_free_blocks + c.num_inactive_blocks == c.num_usable_blocks
    assert len(eng.scheduler._free_slots) == eng.scheduler.config.max_batch
    assert h.generate(eng, [b], 12) == [torch_tokens[1]]


@pytest.mark.slow
def test_restore_fault_on_one_chip_fails_the_hit_and_leaks_nothing(
    dense_dir: Path, prompts: tuple[list[int], list[int]], torch_tokens: list[tuple[list[int], int]]
) -> None:
    """The second prompt's warm hit restores its snapshot on every chip; chip 1's copy fails
    (chip 0 has run its copy). The backend raises StateCopyError, the engine fails that request
    only, and every block, state slot and snapshot pin returns; the same request then runs
    warm and gives the torch tokens."""
    fake = h.mesh_fake(2)
    be = h.mesh_backend(dense_dir, 2, fake)
    _fault_on_restore(be, fake, 1, ModelSpec.from_hf_dir(dense_dir), prompts, torch_tokens)


def test_heads_not_divisible_by_the_mesh_raise_at_construction(dense_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"1 x 8 mesh.*attention heads 4 % 8.*GDN key heads 4"):
        h.mesh_backend(dense_dir, 8)
    with pytest.raises(ValueError, match=r"1 x 3 mesh.*KV heads 2 neither"):
        h.mesh_backend(dense_dir, 3)


@pytest.mark.slow
def test_one_chip_mesh_is_the_single_device(
    dense_dir: Path, prompts: tuple[list[int], list[int]], torch_tokens: list[tuple[list[int], int]]
) -> None:
    """A 1 x 1 mesh of the mesh fake runs the single-device program: the same tokens, the
    same op counts and the same DRAM as the single-device fake."""
    spec = ModelSpec.from_hf_dir(dense_dir)
    single = h.fake()
    be1 = h.tt_backend(dense_dir, single)
    mesh = h.mesh_fake(1)
    ops = Ops(mesh)
    ops.open_mesh((1, 1), trace_region_size=h.TRACE_REGION, l1_small_size=0)
    be2 = h.build(spec, h.load_weights(dense_dir, spec), ops=ops, prefill_chunk=h.CHUNK)
    for be in (be1, be2):
        assert h.generate(h.engine(be, spec), list(prompts), 12) == torch_tokens
    assert mesh.chips[0].counts == single.counts
    assert mesh.chips[0].dram_peak_per_bank == single.dram_peak_per_bank
    assert mesh.chips[0].dram.used_per_bank == single.dram.used_per_bank


@pytest.mark.slow
def test_from_config_opens_the_mesh(dense_dir: Path, tmp_path: Path) -> None:
    """``device_ids`` (0, 1) with mesh "1x2" (config.mesh_shape) open a 1 x 2 MeshDevice with
    the FABRIC_1D fabric and run the tensor-parallel programs; the collectives use the box's
    links (two Blackhole chips: a P300, 2 links in tt_transformers' get_num_links)."""
    import dataclasses

    from tt_serve.config import ServeConfig

    fake = h.mesh_fake(2)
    cfg = ServeConfig(
        model=str(dense_dir),
        backend="ttnn",
        prefill_chunk=128,
        block_size=64,
        device_ids=(0, 1),
        trace_region_size=64 << 20,
    )
    cfg = dataclasses.replace(cfg, mesh="1x2")
    spec = ModelSpec.from_hf_dir(dense_dir)
    be = launch(cfg, spec, max_model_len=512, ops=Ops(fake)).backend
    assert be.ops.mesh == (1, 2) and be.tp.degree == 2
    assert be.model.ccl.links == (2, 2)
    assert fake.fabric.name == "FABRIC_1D" and fake.device is not None
    assert fake.device.get_device_ids() == [0, 1]
    be.close()
    assert fake.fabric.name == "DISABLED"


# ---- 2-D meshes ------------------------------------------------------------------------------

MESHES_2D = [(2, 2), (2, 4)]


@pytest.mark.slow
@pytest.mark.parametrize(("rows", "cols"), MESHES_2D)
def test_2d_tokens_match_torch_with_warm_prefix_hit(
    dense_dir: Path,
    prompts: tuple[list[int], list[int]],
    torch_tokens: list[tuple[list[int], int]],
    rows: int,
    cols: int,
) -> None:
    """Heads over the columns, every projection also over the rows: the torch tokens, a warm
    hit, and each chip holding 1 / (rows x cols) of each large projection."""
    spec = ModelSpec.from_hf_dir(dense_dir)
    fake = mesh2d_fake(rows, cols)
    be = mesh2d_backend(dense_dir, rows, cols, fake)
    got = h.generate(h.engine(be, spec), list(prompts), 12)
    assert got == torch_tokens
    assert got[1][1] == 256, "the second prompt must be a warm prefix hit"
    n = rows * cols
    assert be.pools is not None  # pools follow the heads (columns), replicated over the rows
    assert be.pools.k[0].shape[1] == max(1, spec.num_kv_heads // cols)
    assert be.pools.rec[0].shape[1] == spec.linear_num_value_heads // cols
    assert be.pools.conv[0].shape[-1] == spec.conv_dim // cols
    assert be.model.lm_head[0].shape[1] == spec.vocab_size // n
    attn = be.model.layers[spec.attention_layers[0]].mixer
    gdn = be.model.layers[spec.gdn_layers[0]].mixer
    assert attn.qkv.shape[1] == (attn.num_heads + 2 * attn.num_kv_heads) * spec.head_dim // rows
    assert attn.o.shape == (
        spec.num_attention_heads * spec.head_dim // cols,
        spec.hidden_size // rows,
    )
    assert gdn.qkv.shape[1] == spec.conv_dim // n
    mlp = be.model.layers[0].mlp
    assert isinstance(mlp, tuple) and mlp[0].shape[1] == spec.intermediate_size // n
    assert {(op, axis) for op, _, _, axis in fake.ccl_calls} == {
        (op, axis) for op in ("all_gather_async", "reduce_scatter_minimal_async") for axis in (0, 1)
    }
    assert {topo for _, _, topo, _ in fake.ccl_calls} == {"linear"}
    assert len({c.dram.used_per_bank for c in fake.chips}) == 1
    board = identify(be.ops)  # the box its ClusterType names, as a start identifies it
    assert board.num_chips == n and board.chip == fake.chip


@pytest.mark.slow
def test_2d_warm_equals_cold(dense_dir: Path, prompts: tuple[list[int], list[int]]) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    cold_be = mesh2d_backend(dense_dir, 2, 4)
    cold = h.generate(h.engine(cold_be, spec, prefix_caching=False), [prompts[1]], 12)
    warm = h.generate(h.engine(mesh2d_backend(dense_dir, 2, 4), spec), list(prompts), 12)
    assert cold[0][1] == 0 and warm[1][1] == 256
    assert warm[1][0] == cold[0][0]


@pytest.mark.slow
@pytest.mark.parametrize(("rows", "cols"), MESHES_2D)
def test_2d_pipelined_equals_synchronous(
    dense_dir: Path,
    prompts: tuple[list[int], list[int]],
    torch_tokens: list[tuple[list[int], int]],
    rows: int,
    cols: int,
) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    be = mesh2d_backend(dense_dir, rows, cols, device_resident=True)
    eng = h.engine(be, spec)
    assert eng.pipelining
    assert h.generate(eng, list(prompts), 12) == torch_tokens
    assert be.device_fed_decodes == 20 and eng.num_pipelined_steps == 20


@pytest.mark.slow
def test_2d_device_draws_equal_single_chip(dense_dir: Path) -> None:
    """Candidates gathered over both axes give the single-chip draws (logprob bound as in
    test_tp_device_draws_equal_single_chip)."""
    one = _sampled_run(h.tt_backend(dense_dir))
    mesh = _sampled_run(mesh2d_backend(dense_dir, 2, 4))
    assert [t for t, _ in mesh] == [t for t, _ in one]
    for (_, lp_mesh), (_, lp_one) in zip(mesh, one, strict=True):
        for a, b in zip(lp_mesh, lp_one, strict=True):
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                np.testing.assert_allclose(list(a.values()), list(b.values()), atol=1e-5)


@pytest.mark.slow
def test_2d_restore_fault_on_one_chip_fails_the_hit_and_leaks_nothing(
    dense_dir: Path, prompts: tuple[list[int], list[int]], torch_tokens: list[tuple[list[int], int]]
) -> None:
    """On 2 x 4 the warm hit's restore fails on chip 5 (row 1, column 1) after chips 0-4 ran
    theirs: StateCopyError, that request fails, nothing leaks, and the retry is exact."""
    fake = mesh2d_fake(2, 4)
    be = mesh2d_backend(dense_dir, 2, 4, fake)
    _fault_on_restore(be, fake, 5, ModelSpec.from_hf_dir(dense_dir), prompts, torch_tokens)


def test_2d_mesh_that_does_not_divide_raises(dense_dir: Path, moe_dir: Path) -> None:
    """4 x 4: the hidden dim is not 16 tiles; with a wider model on 8 x 4, one head per column
    leaves a 128-wide gate block that is not 8 whole tiles; the tiny MoE model's 8 experts do
    not place whole over 16 chips."""
    import dataclasses

    from tt_serve.model.tt.layout.parallel import TensorParallel

    with pytest.raises(ValueError, match=r"4 x 4 mesh.*hidden 256 % \(32 x 16\)"):
        mesh2d_backend(dense_dir, 4, 4, h.mesh_fake(16))
    spec = ModelSpec.from_hf_dir(dense_dir)
    wide = dataclasses.replace(spec, hidden_size=1024, intermediate_size=1024)
    with pytest.raises(ValueError, match=r"8 x 4 mesh.*attention gate 128 per column % \(32 x 8"):
        TensorParallel.for_mesh(wide, (8, 4))
    assert TensorParallel.for_mesh(wide, (1, 4)).degree == 4
    moe = ModelSpec.from_hf_dir(moe_dir)
    with pytest.raises(ValueError, match=r"2 x 8 mesh.*experts 8 % 16 \(whole experts per chip"):
        TensorParallel.for_mesh(dataclasses.replace(moe, num_attention_heads=8), (2, 8))


@pytest.mark.slow
def test_2d_moe_tokens_match_torch_warm_and_pipelined(moe_dir: Path) -> None:
    """2 x 2: whole experts over all four chips (2 each, row-major), the shared expert split
    like the MLP, routed + shared partial sums reduced over both axes: the torch tokens with a
    warm prefix hit, cold == warm, and pipelined == synchronous."""
    spec = ModelSpec.from_hf_dir(moe_dir)
    a = h.prompt(300, 11)
    b = a[:256] + h.prompt(40, 12)
    ref = h.generate(h.engine(h.torch_backend(moe_dir), spec), [a, b], 6)
    fake = mesh2d_fake(2, 2)
    be = mesh2d_backend(moe_dir, 2, 2, fake)
    got = h.generate(h.engine(be, spec), [a, b], 6)
    assert got == ref and got[1][1] == 256, "the second prompt must be a warm prefix hit"
    layer = be.model.layers[0].mlp
    assert not isinstance(layer, tuple) and isinstance(layer.experts, SparseExperts)
    assert layer.experts.gate_up.shape[1] == spec.num_experts // 4
    assert {call[-1] for call in fake.ccl_calls} == {0, 1}  # both axes' collectives ran
    cold = h.generate(h.engine(mesh2d_backend(moe_dir, 2, 2), spec, prefix_caching=False), [b], 6)
    assert cold[0][1] == 0 and cold[0][0] == got[1][0]
    piped = mesh2d_backend(moe_dir, 2, 2, device_resident=True)
    eng = h.engine(piped, spec)
    assert eng.pipelining and h.generate(eng, [a, b], 6) == ref
    assert piped.device_fed_decodes > 0
