"""The mesh fake: distribution (1-D and 2-D mappers), per-chip memory, CCL semantics per
``cluster_axis`` on 1 x N and 2-D meshes, and one test per CCL rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN
from tt_serve.model.tt.virtual.mesh_types import GlobalSemaphore, MeshShape, MeshTensor
from tt_serve.model.tt.virtual.tensors import ContractViolation


def mesh_ops(n: int = 4, rows: int = 1, **kw: Any) -> Ops:
    """An open ``rows`` x ``n / rows`` mesh of the fake."""
    ops = Ops(VirtualMeshTTNN(num_devices=n, **kw))
    ops.open_mesh((rows, n // rows), trace_region_size=1 << 20, l1_small_size=0)
    return ops


def sems(ops: Ops, k: int) -> list[GlobalSemaphore]:
    return [ops.global_semaphore() for _ in range(k)]


def gather(ops: Ops, x: Any, dim: int = -1, k: int = 2, **kw: Any) -> Any:
    kw.setdefault("num_links", 1)
    kw.setdefault("cluster_axis", 1)
    return ops.all_gather(x, dim, semaphores=sems(ops, k), barrier=ops.global_semaphore(), **kw)


def scatter(ops: Ops, x: Any, dim: int = -1, k: int = 3, axis: int = 1, links: int = 1) -> Any:
    return ops.reduce_scatter(
        x,
        dim,
        cluster_axis=axis,
        semaphores=sems(ops, k),
        barrier=ops.global_semaphore(),
        num_links=links,
    )


def test_mesh_shape_and_device() -> None:
    ops = mesh_ops(4)
    dev = ops.device
    assert tuple(dev.shape) == (1, 4) and dev.shape == MeshShape([1, 4])
    assert dev.get_num_devices() == 4 and dev.get_device_ids() == [0, 1, 2, 3]
    assert not hasattr(dev, "get_devices")  # absent in 0.81.1
    with pytest.raises(RuntimeError, match="needs 8 chips"):
        Ops(VirtualMeshTTNN(num_devices=4)).open_mesh((1, 8), trace_region_size=0, l1_small_size=0)


def test_shard_and_replicate_distribution_and_readback() -> None:
    ops = mesh_ops(4)
    a = np.arange(2 * 256, dtype=np.float32).reshape(2, 256)
    sharded = ops.upload(a, "float32", shard_dim=-1)
    assert isinstance(sharded, MeshTensor) and sharded.shape == (2, 64)  # per-chip shape
    np.testing.assert_array_equal(ops.read_concat(sharded, -1), a)
    rep = ops.upload(a, "float32")
    assert rep.shape == (2, 256)
    np.testing.assert_array_equal(ops.read(rep), a)  # chip 0's replica
    host = ops.ttnn.from_device(rep)
    with pytest.raises(ContractViolation, match=r"\[mesh.compose\]"):
        host.to_numpy()
    with pytest.raises(ContractViolation, match=r"\[mesh.shard_uneven\]"):
        ops.upload(np.zeros((2, 6), np.float32), "float32", shard_dim=-1)
    with pytest.raises(ContractViolation, match=r"\[mesh.distribution\]"):
        ops.ttnn.copy_host_to_device_tensor(ops.ttnn.chips[0].Tensor(a), rep)


def test_per_chip_dram_charges_each_chip_its_shard() -> None:
    """A [4096, 4096] bf16 weight sharded 4 ways costs each chip a quarter; replicated, the
    whole tensor on every chip."""
    ops = mesh_ops(4, shape_only=True)
    fake = ops.ttnn
    base = [c.dram.used_per_bank for c in fake.chips]
    w = ops.upload(np.zeros((4096, 4096), np.float32), "bfloat16", shard_dim=-1)
    per_shard = [c.dram.used_per_bank - b for c, b in zip(fake.chips, base, strict=True)]
    rep = ops.upload(np.zeros((4096, 4096), np.float32), "bfloat16")
    per_rep = [
        c.dram.used_per_bank - b - s for c, b, s in zip(fake.chips, base, per_shard, strict=True)
    ]
    assert len(set(per_shard)) == 1 and len(set(per_rep)) == 1
    assert per_rep[0] == 4 * per_shard[0] > 0
    del w, rep
    assert [c.dram.used_per_bank for c in fake.chips] == base  # freed on every chip


def test_all_gather_and_reduce_scatter_semantics() -> None:
    ops = mesh_ops(4)
    a = np.random.default_rng(0).standard_normal((1, 32, 512)).astype(np.float32)
    x = ops.upload(a, "float32", shard_dim=-1)  # chip c holds columns [128c, 128c + 128)
    g = gather(ops, x)
    assert g.shape == (1, 32, 512)
    for shard in ops.ttnn.get_device_tensors(g):  # the whole tensor on every chip
        np.testing.assert_array_equal(shard.buffer.data.numpy(), a)
    parts = ops.upload(a, "float32")  # the same partials on every chip: the sum is 4 a
    rs = scatter(ops, parts)
    assert rs.shape == (1, 32, 128)
    np.testing.assert_allclose(ops.read_concat(rs, -1), 4 * a, rtol=1e-6)


def test_ccl_replays_inside_a_mesh_trace() -> None:
    """A captured gather recomputes from the chips' current inputs on replay."""
    ops = mesh_ops(2)
    a = np.ones((1, 32, 64), np.float32)
    x = ops.upload(a, "float32", shard_dim=-1)
    out = ops.zeros((1, 32, 64), "float32")
    s, b = sems(ops, 2), ops.global_semaphore()

    def program() -> None:
        ops.copy(ops.all_gather(x, -1, cluster_axis=1, semaphores=s, barrier=b, num_links=1), out)

    program()
    tid = ops.begin_trace()
    program()
    ops.end_trace(tid)
    ops.write(
        ops.host(
            np.arange(64, dtype=np.float32).reshape(1, 1, 64).repeat(32, 1), "float32", shard_dim=-1
        ),
        x,
    )
    ops.execute_trace(tid, blocking=True)
    np.testing.assert_array_equal(ops.read(out)[0, 0], np.arange(64))


@pytest.mark.parametrize(
    ("rule", "call"),
    [
        ("all_gather_async.semaphores", lambda ops, x: gather(ops, x, k=1)),
        ("reduce_scatter_minimal_async.semaphores", lambda ops, x: scatter(ops, x, k=2)),
        ("all_gather_async.rank", lambda ops, x: gather(ops, ops.upload(np.zeros(64), "float32"))),
        (
            "reduce_scatter_minimal_async.rank",
            lambda ops, x: scatter(ops, ops.upload(np.zeros(64), "float32")),
        ),
        ("all_gather_async.dim", lambda ops, x: gather(ops, x, dim=3)),  # rank 3
        ("reduce_scatter_minimal_async.dim", lambda ops, x: scatter(ops, x, dim=-4)),
        # axis 0 of a 1 x 4 mesh: lines of one chip
        ("all_gather_async.devices", lambda ops, x: gather(ops, x, cluster_axis=0)),
        ("reduce_scatter_minimal_async.devices", lambda ops, x: scatter(ops, x, axis=0)),
        (
            "reduce_scatter_minimal_async.divisible",  # 96 columns = 3 tiles over 4 chips
            lambda ops, x: scatter(ops, ops.upload(np.zeros((1, 32, 96)), "bfloat16")),
        ),
        (
            "reduce_scatter_minimal_async.dtype",
            lambda ops, x: scatter(ops, ops.upload(np.zeros((1, 32, 128)), "uint32")),
        ),
        ("all_gather_async.num_links", lambda ops, x: gather(ops, x, num_links=3)),
        ("reduce_scatter_minimal_async.num_links", lambda ops, x: scatter(ops, x, links=3)),
        (
            "all_gather_async.page_alignment",  # a 10 x 4 B row-major page is not 64-B aligned
            lambda ops, x: gather(ops, ops.upload(np.zeros((4, 10)), "float32", "row_major")),
        ),
        (
            "reduce_scatter_minimal_async.page_alignment",
            lambda ops, x: scatter(ops, ops.upload(np.zeros((4, 10)), "float32", "row_major")),
        ),
        (
            "ccl.topology",
            lambda ops, x: ops.ttnn.experimental.all_gather_async(
                x, dim=-1, multi_device_global_semaphore=sems(ops, 2), num_links=1
            ),  # the experimental default is Ring, and the fabric is FABRIC_1D
        ),
        (
            "ccl.input",
            lambda ops, x: gather(ops, ops.ttnn.get_device_tensors(x)[0]),
        ),
    ],
)
def test_each_ccl_rule_fires(rule: str, call: Any) -> None:
    """The device-operation checks of experimental/ccl/all_gather_async/device/
    all_gather_async_device_operation.cpp and experimental/ccl/reduce_scatter_minimal_async/
    device/reduce_scatter_minimal_async_op_device_operation.cpp (``rules_ccl.all_gather_async``,
    ``rules.reduce_scatter_minimal_async``), and the mesh's fabric, topology and input checks
    (``ccl.*``), on a 1 x 4 P150 mesh with 2 links between neighbours."""
    ops = mesh_ops(4, max_links=2)
    x = ops.upload(np.zeros((1, 32, 128), np.float32), "bfloat16", shard_dim=-1)
    with pytest.raises(ContractViolation, match=rf"\[{rule}\]"):
        call(ops, x)


def test_ccl_needs_a_fabric() -> None:
    fake = VirtualMeshTTNN(num_devices=2)
    ops = Ops(fake)
    ops.device = fake.open_mesh_device(MeshShape(1, 2))  # no set_fabric_config first
    ops.mesh = (1, 2)
    x = ops.upload(np.zeros((1, 32, 64), np.float32), "bfloat16", shard_dim=-1)
    with pytest.raises(ContractViolation, match=r"\[ccl.fabric\]"):
        gather(ops, x)


def test_trace_rules_for_ccls() -> None:
    """Under capture: no semaphore creation (a host write) and no composite gather (a tile-
    padded gather dim goes through all_broadcast, unsafe under trace)."""
    ops = mesh_ops(2)
    x = ops.upload(np.zeros((1, 32, 1), np.float32), "float32")
    s, b = sems(ops, 2), ops.global_semaphore()
    kw = {"semaphores": s, "barrier": b, "num_links": 1, "cluster_axis": 1}
    ops.all_gather(x, -1, **kw)  # eager: allowed
    ops.all_gather(x, 0, **kw)
    tid = ops.begin_trace()
    with pytest.raises(ContractViolation, match=r"\[host_io\]"):
        ops.global_semaphore()
    with pytest.raises(ContractViolation, match=r"\[all_gather_async.composite\]"):
        ops.all_gather(x, -1, **kw)
    ops.all_gather(x, 0, **kw)  # dim 0: not padded
    ops.end_trace(tid)


def test_reduce_scatter_charges_its_staging_buffer_on_every_chip() -> None:
    """Linear topology: the intermediate is the padded input with dim 0 doubled."""
    ops = mesh_ops(4, shape_only=True)
    fake = ops.ttnn
    x = ops.zeros((1, 2048, 8192), "bfloat16")
    before = [c.dram_peak_per_bank for c in fake.chips]
    used = [c.dram.used_per_bank for c in fake.chips]
    scatter(ops, x)
    for c, b, u in zip(fake.chips, before, used, strict=True):
        staging = c.dram.per_bank(x.info()) * 2
        assert c.dram_peak_per_bank >= max(b, u + staging)


def test_injected_fault_hits_one_chip_after_the_ones_before_it() -> None:
    ops = mesh_ops(2)
    pool = ops.zeros((2, 32, 32), "float32")
    row = ops.upload(np.ones((1, 32, 32), np.float32), "float32")
    ops.ttnn.inject_fault(1, "fill_cache")
    with pytest.raises(RuntimeError, match="chip 1: injected fill_cache"):
        ops.fill_row(pool, row, 0)
    chips = ops.ttnn.get_device_tensors(pool)
    assert chips[0].buffer.data[0].sum() == 32 * 32 and chips[1].buffer.data[0].sum() == 0
    ops.fill_row(pool, row, 0)  # the fault fires once


# ---- 2-D meshes ------------------------------------------------------------------------------


def test_2d_mapper_shards_in_mesh_coordinate_order() -> None:
    """``ShardTensor2dMesh(dims=(0, 1))`` on 2 x 4: chip (r, c) gets block (r, c), row-major;
    (None, 1) replicates over the rows; the 1-D mapper goes row-major over all 8 chips; a dim
    on both axes or an uneven 2-D split is refused (distributed_tensor.cpp)."""
    ops = mesh_ops(8, rows=2)
    t = ops.ttnn
    a = np.arange(64 * 128, dtype=np.float32).reshape(64, 128)
    two = t.Tensor(a, mesh_mapper=t.ShardTensor2dMesh(ops.device, (2, 4), dims=(0, 1)))
    for i, shard in enumerate(t.get_device_tensors(two)):
        r, c = divmod(i, 4)
        np.testing.assert_array_equal(
            shard.to_numpy(), a[32 * r : 32 * r + 32, 32 * c : 32 * c + 32]
        )
    cols = t.get_device_tensors(ops.host(a, "float32", mesh_dims=(None, -1)))
    for i, shard in enumerate(cols):
        np.testing.assert_array_equal(shard.to_numpy(), a[:, 32 * (i % 4) : 32 * (i % 4) + 32])
    flat = t.get_device_tensors(ops.host(a, "float32", shard_dim=-1))
    for i, shard in enumerate(flat):
        np.testing.assert_array_equal(shard.to_numpy(), a[:, 16 * i : 16 * i + 16])
    with pytest.raises(ContractViolation, match=r"\[mesh.mapper\] dims must be unique"):
        ops.host(a, "float32", mesh_dims=(1, -1))
    with pytest.raises(ContractViolation, match="ND sharding requires"):
        ops.host(np.zeros((6, 128), np.float32), "float32", mesh_dims=(None, 0))


def _chip_blocks(rows: int, cols: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Different data on every chip: [rows, cols, *shape]."""
    return np.random.default_rng(seed).standard_normal((rows, cols, *shape)).astype(np.float32)


def _per_chip(ops: Ops, blocks: np.ndarray) -> Any:
    """A mesh tensor whose chip (r, c) holds ``blocks[r, c]``."""
    whole = np.concatenate([np.concatenate(list(row), -1) for row in blocks], -2)
    return ops.upload(whole, "float32", mesh_dims=(-2, -1))


@pytest.mark.parametrize("axis", [0, 1])
def test_2d_ccls_run_independently_on_each_line_of_the_axis(axis: int) -> None:
    """On 2 x 4, ``cluster_axis`` 1 gathers / reduces within each row (4 chips), 0 within each
    column (2 chips); the other axis's lines never mix (numpy reference per chip)."""
    rows, cols = 2, 4
    ops = mesh_ops(8, rows=rows)
    blocks = _chip_blocks(rows, cols, (32, 128), seed=axis)
    x = _per_chip(ops, blocks)
    assert x.shape == (32, 128)
    g = ops.ttnn.get_device_tensors(gather(ops, x, cluster_axis=axis))
    rs = ops.ttnn.get_device_tensors(scatter(ops, x, axis=axis))
    n = (rows, cols)[axis]
    for i in range(rows * cols):
        r, c = divmod(i, cols)
        line = [blocks[r, k] for k in range(cols)] if axis else [blocks[k, c] for k in range(rows)]
        np.testing.assert_array_equal(g[i].buffer.data.numpy(), np.concatenate(line, -1))
        k = c if axis else r  # this chip's place on its line
        want = np.split(np.sum(line, 0), n, -1)[k]
        np.testing.assert_allclose(rs[i].buffer.data.numpy(), want, rtol=1e-6, atol=1e-6)


def test_ccl_without_cluster_axis_on_a_2d_mesh_needs_a_2d_fabric() -> None:
    """The line is the whole mesh only on a 2-D fabric (the vllm-tt-plugin fabric tests:
    all_gather without cluster_axis on a non-degenerate 2-D mesh asserts a 2-D fabric); on a
    1 x N mesh no cluster_axis is needed."""
    ops = mesh_ops(8, rows=2)
    x = ops.upload(np.zeros((1, 32, 256), np.float32), "bfloat16", shard_dim=-1)
    with pytest.raises(ContractViolation, match=r"\[ccl.cluster_axis\].*needs a 2-D fabric"):
        gather(ops, x, cluster_axis=None)
    line = mesh_ops(4)
    y = line.upload(np.zeros((1, 32, 256), np.float32), "bfloat16", shard_dim=-1)
    assert gather(line, y, cluster_axis=None).shape == (1, 32, 256)


def test_2d_links_and_ring_topology_are_per_axis() -> None:
    """Galaxy-like links (4, 3) per axis (tt_transformers get_num_links TG): 4 links pass on
    axis 0 and fail on axis 1. Ring needs a ring fabric and an axis that wraps around."""
    ops = mesh_ops(8, rows=2, max_links=(4, 3))
    x = ops.upload(np.zeros((1, 32, 256), np.float32), "bfloat16", shard_dim=-1)
    gather(ops, x, cluster_axis=0, num_links=4)
    with pytest.raises(ContractViolation, match=r"\[all_gather_async.num_links\]"):
        gather(ops, x, cluster_axis=1, num_links=4)
    fake = VirtualMeshTTNN(num_devices=8, ring_axes=(1,))
    ring = Ops(fake)
    fake.set_fabric_config(fake.FabricConfig.FABRIC_1D_RING)
    ring.device = fake.open_mesh_device(MeshShape(2, 4))
    ring.mesh = (2, 4)
    y = ring.upload(np.zeros((1, 32, 256), np.float32), "bfloat16", shard_dim=-1)

    def ring_gather(axis: int) -> Any:
        return fake.experimental.all_gather_async(
            y,
            dim=-1,
            multi_device_global_semaphore=sems(ring, 2),
            num_links=1,
            cluster_axis=axis,
            topology=fake.Topology.Ring,
        )

    assert ring_gather(1).shape == (1, 32, 128)
    with pytest.raises(ContractViolation, match=r"\[ccl.topology\].*do not wrap around"):
        ring_gather(0)
