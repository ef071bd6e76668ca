"""Every rule the virtual device keeps is tripped by a test.

The first tests trip the rules no other test tripped (29 of the 117 rule names the virtual
device had were raised by no test under tests/tt, slow tests included), each through the op
call on the virtual device where the device reaches it, at Qwen3.5-9B shapes; each names the
tt-metal source the rule models (op paths relative to ``ttnn/cpp/ttnn/operations/``), or says
that the rule is the virtual device's own.

The last test pins the coverage: it reads every rule name the virtual device can raise out of
the source of ``tt_serve/model/tt/virtual/`` and every rule name a test in ``tests/tt/virtual``
or ``tests/tt/runtime`` asserts, and fails when a rule has no test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np

from tests.tt.virtual.test_limits import (
    BLOCK,
    GDN_DIM,
    HEAD_DIM,
    HIDDEN,
    K_HEADS,
    KV_HEADS,
    Q_HEADS,
    V_HEADS,
    VOCAB,
    T,
    _ops,
    _trips,
)
from tt_serve.model.tt.layout import ROW_MAJOR, TILE
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime import moe
from tt_serve.model.tt.runtime.inputs import gdn_const_tiles
from tt_serve.model.tt.virtual import dram
from tt_serve.model.tt.virtual.device import P150, WORMHOLE
from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN
from tt_serve.model.tt.virtual.mesh_types import MeshMapper, MeshShape, PlacementShard

REPO = Path(__file__).resolve().parents[3]


# ---- Gated DeltaNet ----------------------------------------------------------------------------
def _chunk_gdn(ops: Ops, t: int = 64, *, gates_t: int | None = None, **const_kw: str) -> object:
    """The backend's prefill call on the rank-3 flat path: q, k [1, T, 16*128], v [1, T, 32*128],
    g, beta [1, T, 32] fp32, the fp32 state [1, 32, 128, 128] and the four constant tiles.
    ``const_kw``: ``dtype`` / ``layout`` of the constant tiles (fp32 TILE by default)."""
    kd, vd = K_HEADS * GDN_DIM, V_HEADS * GDN_DIM
    q = ops.zeros([1, t, kd], "bfloat16")
    v = ops.zeros([1, t, vd], "bfloat16")
    gate = ops.zeros([1, t if gates_t is None else gates_t, V_HEADS], "float32")
    state = ops.zeros([1, V_HEADS, GDN_DIM, GDN_DIM], "float32")
    dtype, layout = const_kw.get("dtype", "float32"), const_kw.get("layout", TILE)
    eye, tril, ones, masks = (ops.upload(c, dtype, layout) for c in gdn_const_tiles(32))
    return ops.chunk_gated_delta_rule(
        q, q, v, gate, gate, state=state, scale=1.0, chunk_size=32, consts=(eye, tril, ones, masks)
    )


def test_chunk_gdn_operand_rules() -> None:
    """transformer/chunk_gated_delta_rule (the 0.81.1 docstring and its device ops): the constant
    tiles (eye, tril, ones, masks) are fp32 TILE, "a ROW_MAJOR input fails the device op's
    validation", and g / beta are [B, T, HV] with q's B and T ("chunk_gdn: {} must be
    [B, T, HV]")."""
    _chunk_gdn(_ops(P150))
    msg = _trips("chunk_gated_delta_rule.dtype", lambda: _chunk_gdn(_ops(P150), dtype="bfloat16"))
    assert "fp32" in msg
    msg = _trips("chunk_gated_delta_rule.layout", lambda: _chunk_gdn(_ops(P150), layout=ROW_MAJOR))
    assert "must be TILE" in msg
    # gates built for a 32-token bucket, q for 64 tokens
    msg = _trips("chunk_gated_delta_rule.shape", lambda: _chunk_gdn(_ops(P150), gates_t=32))
    assert "must be [B, T, HV]" in msg


def _recurrent(ops: Ops, *, key_dim: int = GDN_DIM, state_v: int = GDN_DIM) -> object:
    q = ops.zeros([1, 1, K_HEADS, key_dim], "float32")
    v = ops.zeros([1, 1, V_HEADS, GDN_DIM], "float32")
    gate = ops.zeros([1, 1, V_HEADS], "float32")
    state = ops.zeros([1, V_HEADS, key_dim, state_v], "float32")
    return ops.fused_recurrent_gated_delta_rule(q, q, v, gate, gate, state=state, scale=1.0)


def test_recurrent_gdn_shape_rules() -> None:
    """transformer/fused_recurrent_gated_delta_rule/device/ (the program factory): key and value
    dims non-zero multiples of 32 and a state [B, HV, K, V]."""
    _recurrent(_ops(P150))
    msg = _trips(
        "fused_recurrent_gated_delta_rule.shape", lambda: _recurrent(_ops(P150), key_dim=100)
    )
    assert "multiples of 32" in msg
    # a state pool allocated [.., 128, 64] for value heads of 128
    msg = _trips(
        "fused_recurrent_gated_delta_rule.shape", lambda: _recurrent(_ops(P150), state_v=64)
    )
    assert "must be [B, HV, K, V]" in msg


# ---- caches --------------------------------------------------------------------------------------
def test_fill_cache_into_a_sharded_pool() -> None:
    """kv_cache/device/update_cache_device_operation.cpp, FILL branch: the cache must be
    interleaved (a state pool moved to L1 height-sharded cannot be filled)."""
    ops = _ops(P150)
    pool = ops.height_sharded(ops.zeros([3, V_HEADS, GDN_DIM, GDN_DIM], "float32"), V_HEADS)
    row = ops.zeros([1, V_HEADS, GDN_DIM, GDN_DIM], "float32")
    msg = _trips("fill_cache.memory", lambda: ops.fill_row(pool, row, 2))
    assert "interleaved" in msg


def test_paged_fill_cache_geometry_rule() -> None:
    """experimental/paged_cache/device/fill_cache/paged_fill_cache_device_operation.cpp: the
    input's heads x head dim match the cache blocks' (prefill K of 2 heads into a 4-head cache)."""
    ops = _ops(P150)
    cache = ops.zeros([8, KV_HEADS, BLOCK, HEAD_DIM], "bfloat16")
    table = ops.upload(np.array([[1, 2]], np.int32), "int32", ROW_MAJOR)
    ops.paged_fill_cache(cache, ops.zeros([1, KV_HEADS, 128, HEAD_DIM], "bfloat16"), table)
    x = ops.zeros([1, KV_HEADS // 2, 128, HEAD_DIM], "bfloat16")
    msg = _trips("paged_fill_cache.shape", lambda: ops.paged_fill_cache(cache, x, table))
    assert "does not match cache blocks" in msg


def _update(
    ops: Ops, *, x_layout: str = TILE, head_dim: int = HEAD_DIM, shard_cache: bool = False
) -> None:
    """The decode K write of 16 users: [1, 16, kv, hd] height-sharded one user per core."""
    users = 16
    cache = ops.zeros([8, KV_HEADS, BLOCK, HEAD_DIM], "bfloat16")
    if shard_cache:
        cache = ops.height_sharded(cache, 8)
    k = ops.height_sharded(ops.zeros([1, users, KV_HEADS, head_dim], "bfloat16", x_layout), users)
    pos = ops.upload(np.zeros(users, np.int32), "int32", ROW_MAJOR)
    table = ops.upload(np.zeros((users, 8), np.int32), "int32", ROW_MAJOR)
    ops.paged_update_cache(cache, k, pos, table)


def test_paged_update_cache_layout_memory_and_shape_rules() -> None:
    """experimental/paged_cache/device/update_cache/paged_update_cache_device_operation.cpp: input
    and cache TILE, the cache interleaved, the input's head dim the cache's."""
    _update(_ops(P150))
    msg = _trips("paged_update_cache.layout", lambda: _update(_ops(P150), x_layout=ROW_MAJOR))
    assert "TILE" in msg
    msg = _trips("paged_update_cache.memory", lambda: _update(_ops(P150), shard_cache=True))
    assert "interleaved" in msg
    msg = _trips("paged_update_cache.shape", lambda: _update(_ops(P150), head_dim=128))
    assert "head dim 128/256" in msg


# ---- attention ---------------------------------------------------------------------------------
def _decode(
    ops: Ops, *, q_dim: int = HEAD_DIM, k_chunk: int = 128, shard_q: str | None = None
) -> object:
    """Paged decode SDPA of 16 users, 16 q / 4 kv heads, with a program config."""
    users, fake = 16, ops.ttnn
    cache = ops.zeros([8, KV_HEADS, BLOCK, HEAD_DIM], "bfloat16")
    q = ops.zeros([1, users, Q_HEADS, q_dim], "bfloat16")
    if shard_q is not None:
        grid = ops.device.compute_with_storage_grid_size()
        config = fake.create_sharded_memory_config(
            shape=(32, q_dim),
            core_grid=fake.num_cores_to_corerangeset(users, grid, True),
            strategy=shard_q,
            use_height_and_width_as_shard_shape=True,
        )
        q = fake.interleaved_to_sharded(q, config)
    table = ops.upload(np.ones((users, 8), np.int32), "int32", ROW_MAJOR)
    pos = ops.upload(np.full(users, 3, np.int32), "int32", ROW_MAJOR)
    config = fake.SDPAProgramConfig(
        compute_with_storage_grid_size=ops.device.compute_with_storage_grid_size(),
        q_chunk_size=0,
        k_chunk_size=k_chunk,
        exp_approx_mode=False,
        max_cores_per_head_batch=1,
    )
    return ops.paged_sdpa_decode(q, cache, cache, table, pos, scale=1.0, program_config=config)


def test_sdpa_decode_memory_shape_and_chunk_rules() -> None:
    """transformer/sdpa_decode/device/sdpa_decode_device_operation.cpp (validate): Q DRAM
    interleaved or HEIGHT sharded, Q/K/V one head dim, k_chunk_size a multiple of 32."""
    _decode(_ops(WORMHOLE))
    _decode(_ops(WORMHOLE), shard_q="height")
    msg = _trips("paged_sdpa_decode.memory", lambda: _decode(_ops(WORMHOLE), shard_q="width"))
    assert "height sharded" in msg
    msg = _trips("paged_sdpa_decode.shape", lambda: _decode(_ops(WORMHOLE), q_dim=128))
    assert "head dims Q 128 K 256 V 256" in msg
    msg = _trips("paged_sdpa_decode.chunk", lambda: _decode(_ops(WORMHOLE), k_chunk=48))
    assert "k_chunk 48" in msg


def _prefill_attention(ops: Ops, *, q_heads: int = Q_HEADS, q_dim: int = HEAD_DIM) -> object:
    cache = ops.zeros([16, KV_HEADS, BLOCK, HEAD_DIM], "bfloat16")
    q = ops.zeros([1, q_heads, 128, q_dim], "bfloat16")
    table = ops.upload(np.arange(16, dtype=np.int32)[None], "int32", ROW_MAJOR)
    start = ops.upload(np.array([0], np.int32), "int32", ROW_MAJOR)
    config = ops.sdpa_program_config(64, 64)
    return ops.chunked_sdpa(q, cache, cache, table, start, scale=1.0, program_config=config)


def test_chunked_sdpa_head_rules() -> None:
    """transformer/sdpa/device/sdpa_device_operation.cpp, validate_chunked_mode: Q, K, V share a
    head dim and the q heads are a multiple of the kv heads (GQA)."""
    _prefill_attention(_ops(P150))
    msg = _trips(
        "chunked_scaled_dot_product_attention.shape",
        lambda: _prefill_attention(_ops(P150), q_dim=128),
    )
    assert "Q (1, 16, 128, 128)" in msg
    msg = _trips(
        "chunked_scaled_dot_product_attention.shape",
        lambda: _prefill_attention(_ops(P150), q_heads=6),
    )
    assert "6 q heads vs 4 kv heads" in msg


# ---- elementwise, sparse matmul, unmodelled arguments --------------------------------------------
def test_where_broadcast_rule() -> None:
    """eltwise/ternary (ternary_op_utils.cpp get_broadcast_type): one rank for every operand;
    outer dims only, or a row, column or scalar broadcast with equal outer dims. A row of one
    operand against a column of another, which binary_ng broadcasts both ways, is not among
    them."""
    ops = _ops(P150)
    pred = ops.zeros([1, 32, 32], "float32")
    ops.where(pred, ops.zeros([1, 32, 1], "float32"), 0.0)  # column broadcast
    ops.where(pred, ops.zeros([1, 1, 32], "float32"), ops.zeros([1, 32, 32], "float32"))  # row
    msg = _trips("where.broadcast", lambda: ops.where(pred, ops.zeros([32, 32], "float32"), 0.0))
    assert "ranks" in msg
    col, row = ops.zeros([1, 32, 1], "float32"), ops.zeros([1, 1, 32], "float32")
    msg = _trips("where.broadcast", lambda: ops.where(col, row, pred))
    assert "shapes [(1, 32, 1), (1, 1, 32), (1, 32, 32)]" in msg
    half = ops.zeros([1, 16, 32], "float32")
    _trips("where.broadcast", lambda: ops.where(pred, half, 0.0))


def test_sparse_matmul_of_a_sharded_operand() -> None:
    """The virtual device's sparse_matmul models the op with interleaved operands only (the
    scan-mode programs of matmul/device/sparse/ read A, B and the sparsity from interleaved
    buffers); a sharded operand is refused rather than guessed at. The op's own validate
    (sparse_matmul_device_operation.cpp) has no such message: this rule is the device model's."""
    ops = _ops(P150)
    a = ops.zeros([1, 3, 32, 64], "bfloat16")
    b = ops.zeros([1, 8, 64, 256], "bfloat16")
    sparsity = ops.upload(np.ones((1, 3, 1, 8), np.float32), "bfloat16", ROW_MAJOR)
    config = moe.sparse_program_config(ops, 32, 64, 256)

    def call(x: object) -> object:
        return ops.sparse_matmul(
            x, b, sparsity, program_config=config, a_sparse=False, b_sparse=True
        )

    assert call(a).shape == (1, 3, 1, 8, 32, 256)
    msg = _trips("sparse_matmul.memory", lambda: call(ops.height_sharded(a, 3)))
    assert "interleaved" in msg


def test_arguments_the_virtual_device_does_not_model() -> None:
    """Not a tt-metal limit: the virtual device refuses ttnn arguments whose semantics it does not
    model (smallest-k / unsorted topk, a fused activation in a 1D matmul config) rather than
    compute something else."""
    ops = _ops(P150)
    x = ops.zeros([1, 32, 256], "float32")
    fake = ops.ttnn
    msg = _trips("not_modelled", lambda: fake.topk(x, 8, -1, False, True))
    assert "largest=True" in msg
    _trips(
        "not_modelled",
        lambda: fake.MatmulMultiCoreReuseMultiCast1DProgramConfig(
            compute_with_storage_grid_size=fake.CoreCoord(8, 1),
            in0_block_w=2,
            out_subblock_h=1,
            out_subblock_w=1,
            per_core_M=1,
            per_core_N=1,
            fuse_batch=False,
            fused_activation="silu",
            mcast_in0=True,
        ),
    )


# ---- DRAM ----------------------------------------------------------------------------------------
def test_a_block_float_row_major_tensor_has_no_page_size() -> None:
    """ttnn's tensor conversion (convert_python_tensor_to_tt_tensor): TT_FATAL "Layout must be
    Layout::TILE for bfloat8_b or bfloat4_b!". The 9B embedding table is ROW_MAJOR (the gather
    reads rows), so a bfloat8_b profile cannot size it: the DRAM budget refuses it."""
    budget = dram.DramBudget(P150)
    budget.allocate(0, T((VOCAB, HIDDEN), "bfloat16", "row_major"), "embed")
    msg = _trips(
        "layout.block_float",
        lambda: budget.allocate(1, T((VOCAB, HIDDEN), "bfloat8_b", "row_major"), "embed"),
    )
    assert "only in TILE layout" in msg


# ---- mesh ----------------------------------------------------------------------------------------
def test_fabric_is_configured_before_the_mesh_opens() -> None:
    """tt-metal's mesh_device fixture (repo-root conftest.py) calls set_fabric_config before
    open_mesh_device and set_fabric_config(DISABLED) only after closing it (notes/ttnn-mesh.md
    1.4, 7): the fabric is brought up when the mesh opens."""
    fake = VirtualMeshTTNN(num_devices=2)
    Ops(fake).open_mesh((1, 2), trace_region_size=0, l1_small_size=0)
    msg = _trips("mesh.fabric", lambda: fake.set_fabric_config(fake.FabricConfig.FABRIC_1D_RING))
    assert "after the mesh is open" in msg
    fake.set_fabric_config(fake.FabricConfig.DISABLED)  # teardown


def test_physical_device_ids_name_distinct_chips_of_the_system() -> None:
    """ttnn.open_mesh_device(physical_device_ids=...) (notes/ttnn-mesh.md 1.2): one id per mesh
    position, each a chip of the system."""
    for ids in ([1, 1], [0, 4], [0]):
        ops = Ops(VirtualMeshTTNN(num_devices=4))
        _trips(
            "mesh.device_ids",
            lambda ops=ops, ids=ids: ops.open_mesh(
                (1, 2), trace_region_size=0, l1_small_size=0, device_ids=ids
            ),
        )
    Ops(VirtualMeshTTNN(num_devices=4)).open_mesh(
        (1, 2), trace_region_size=0, l1_small_size=0, device_ids=[3, 1]
    )


def test_distributed_tensors_need_an_open_mesh(tmp_path: Path) -> None:
    """The virtual device's own rule (no tt-metal message): a mesh mapper, and a tensor file
    written on a mesh, are placed onto the chips of an open mesh; before open_mesh_device there
    are none (tt-metal builds a mapper from the MeshDevice, distributed_tensor.cpp)."""
    ops = Ops(VirtualMeshTTNN(num_devices=2))
    ops.open_mesh((1, 2), trace_region_size=0, l1_small_size=0)
    path = tmp_path / "w.bin"
    ops.ttnn.dump_tensor(str(path), ops.upload(np.zeros((32, 64)), "bfloat16", shard_dim=-1))
    fresh = VirtualMeshTTNN(num_devices=2)  # a second start, before its mesh is open
    msg = _trips("mesh.open", lambda: fresh.load_tensor(str(path), device=None))
    assert "before open_mesh_device" in msg
    mapper = MeshMapper((2,), (PlacementShard(-1),))
    _trips("mesh.open", lambda: fresh.Tensor(np.zeros((32, 64), np.float32), mesh_mapper=mapper))
    assert tuple(fresh.open_mesh_device(MeshShape(1, 2)).shape) == (1, 2)
    assert fresh.load_tensor(str(path), device=None).shape == (32, 32)


# ---- coverage ----------------------------------------------------------------------------------
CONTRACT = REPO / "tt_serve" / "model" / "tt" / "virtual"
TEST_DIRS = (REPO / "tests" / "tt" / "virtual", REPO / "tests" / "tt" / "runtime")
RAISERS = {"_fail", "ContractViolation", "DeviceLimitError"}
# VirtualTTNN._rules re-raises a rules.DeviceLimitError as a ContractViolation under its own name
PASS_THROUGH = {"exc.rule"}


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _source_rules(path: Path) -> tuple[set[str], list[str]]:
    """The rule names ``path`` passes to ``_fail`` / ``ContractViolation`` / ``DeviceLimitError``
    (literals, ``rule + ".x"`` with ``rule`` assigned in the function, or a parameter resolved
    through the module's calls of that function), and the arguments it could not resolve."""
    tree = ast.parse(path.read_text())
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def function_of(node: ast.AST) -> ast.FunctionDef | None:
        while node in parent:
            node = parent[node]
            if isinstance(node, ast.FunctionDef):
                return node
        return None

    def resolve(expr: ast.expr, fn: ast.FunctionDef | None, depth: int = 0) -> set[str] | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left, right = resolve(expr.left, fn, depth), resolve(expr.right, fn, depth)
            if left is None or right is None:
                return None
            return {a + b for a in left for b in right}
        if not isinstance(expr, ast.Name) or fn is None:
            return None
        assigned = [
            n.value
            for n in ast.walk(fn)
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)
        ]
        params = [a.arg for a in fn.args.args]
        if not assigned and expr.id in params and depth < 3:
            i = params.index(expr.id)
            assigned = [
                c.args[i]
                for c in ast.walk(tree)
                if isinstance(c, ast.Call) and _name(c) == fn.name and len(c.args) > i
            ]
            values = [resolve(a, function_of(a), depth + 1) for a in assigned]
        else:
            values = [resolve(a, fn, depth) for a in assigned]
        if not values or any(v is None for v in values):
            return None
        return set().union(*(v for v in values if v is not None))

    names: set[str] = set()
    unresolved: list[str] = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and _name(call) in RAISERS and call.args):
            continue
        arg = call.args[0]
        found = resolve(arg, function_of(call))
        if found is not None:
            names |= found
        elif ast.unparse(arg) not in PASS_THROUGH:
            unresolved.append(f"{path.name}:{call.lineno}: {ast.unparse(arg)}")
    return names, unresolved


def _test_rules(path: Path) -> set[str]:
    """The rule names a test file asserts: ``_trips("r", ...)``, ``x.rule == "r"``,
    ``pytest.raises(..., match=r"\\[r\\]...")``, and the ``rule`` column of a parametrize table
    or of a ``for ..., rule in (...)`` table."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def column(rows: ast.expr, i: int, width: int) -> None:
        if not isinstance(rows, (ast.Tuple, ast.List)):
            return
        for row in rows.elts:
            cell = row.elts[i] if width > 1 and isinstance(row, (ast.Tuple, ast.List)) else row
            if isinstance(cell, ast.Constant) and isinstance(cell.value, str):
                names.add(cell.value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _name(node)
            first = node.args[0] if node.args else None
            if name == "_trips" and isinstance(first, ast.Constant):
                names.add(str(first.value))
            if name == "raises":
                for kw in node.keywords:
                    if kw.arg == "match" and isinstance(kw.value, ast.Constant):
                        names.update(re.findall(r"\\\[([\w.]+)\\\]", str(kw.value.value)))
            if name == "parametrize" and len(node.args) >= 2:
                argnames = node.args[0]
                if isinstance(argnames, ast.Constant):
                    cols = [c.strip() for c in str(argnames.value).split(",")]
                elif isinstance(argnames, (ast.Tuple, ast.List)):
                    cols = [str(c.value) for c in argnames.elts if isinstance(c, ast.Constant)]
                else:
                    cols = []
                if "rule" in cols:
                    column(node.args[1], cols.index("rule"), len(cols))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "rule" for s in sides):
                names.update(
                    s.value
                    for s in sides
                    if isinstance(s, ast.Constant) and isinstance(s.value, str)
                )
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Tuple):
            targets = [t.id if isinstance(t, ast.Name) else "" for t in node.target.elts]
            if "rule" in targets:
                column(node.iter, targets.index("rule"), len(targets))
    return names


def defined_rules() -> set[str]:
    names: set[str] = set()
    unresolved: list[str] = []
    for path in sorted(CONTRACT.glob("*.py")):
        found, missed = _source_rules(path)
        names |= found
        unresolved += missed
    assert not unresolved, f"rule names the scan cannot resolve (name them literally): {unresolved}"
    return names


def tripped_rules() -> set[str]:
    return set().union(*(_test_rules(p) for d in TEST_DIRS for p in sorted(d.glob("test_*.py"))))


def test_every_rule_of_the_virtual_device_is_tripped_by_a_test() -> None:
    """A rule added to the virtual device (any module of ``virtual/``: ``rules_*.py``, the op
    families, ``mesh.py``, ``ccl.py``, ``dram.py``) without a test that asserts its name fails here, as does a test asserting a
    rule name the device no longer has."""
    defined, tripped = defined_rules(), tripped_rules()
    # the scan sees each way a rule is named: a literal, ``rule + ".x"``, a parameter (the CCLs'
    # _ccl_common), the DRAM books and the mesh
    assert {
        "dtype",
        "where.broadcast",
        "sparse_matmul.memory",
        "reduce_scatter_minimal_async.num_links",
        "dram.capacity",
        "trace.region",
        "mesh.fabric",
        "layout.block_float",
    } <= defined
    missing = sorted(defined - tripped)
    assert not missing, f"rules of the virtual device that no test trips: {missing}"
    stale = sorted(tripped - defined)
    assert not stale, f"rule names the tests assert that the virtual device does not have: {stale}"
