"""Each rule of the contract fake trips when violated (so passing e2e tests mean something)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.tt_host.ops_calls import extract
from tt_serve.model.tt.layout import ROW_MAJOR, TILE
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.runtime.inputs import gdn_const_tiles
from tt_serve.model.tt.virtual.device import VirtualTTNN
from tt_serve.model.tt.virtual.tensors import ContractViolation


@pytest.fixture
def ops() -> Ops:
    o = Ops(VirtualTTNN())
    o.open_device(0, trace_region_size=1 << 20, l1_small_size=0)
    return o


def _trips(rule: str, fn: Callable[[], object]) -> None:
    with pytest.raises(ContractViolation) as info:
        fn()
    assert info.value.rule == rule, info.value


def _captured(ops: Ops, program: Callable[[], None]) -> object:
    program()
    tid = ops.begin_trace()
    program()
    ops.end_trace(tid)
    return tid


def test_fake_implements_every_ttnn_name_ops_uses() -> None:
    """The mesh fake (a VirtualTTNN per chip plus the mesh and CCL names) has every name."""
    from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN

    fake = VirtualMeshTTNN(num_devices=2)
    calls, attrs = extract()
    for path in [c.path for c in calls] + attrs:
        obj: object = fake
        for part in path.split("."):
            assert hasattr(obj, part), f"fake lacks ttnn.{path}"
            obj = getattr(obj, part)


def test_replay_recomputes_from_refreshed_inputs(ops: Ops) -> None:
    x = ops.zeros([1, 32, 32], "float32")
    out = ops.zeros([1, 32, 32], "float32")
    tid = _captured(ops, lambda: ops.copy(ops.mul(x, 2.0), out))
    ops.write(ops.host(np.full((1, 32, 32), 3.0), "float32"), x)
    ops.execute_trace(tid, blocking=True)
    assert float(ops.read(out)[0, 0, 0]) == 6.0


def test_tile_rule(ops: Ops) -> None:
    cache = ops.zeros([4, 1, 16, 32], "bfloat16")  # block of 16 rows: not whole tiles
    table = ops.upload(np.zeros((1, 2), np.int32), "int32", ROW_MAJOR)
    x = ops.zeros([1, 1, 32, 32], "bfloat16")
    _trips("tile", lambda: ops.paged_fill_cache(cache, x, table))


def test_dtype_rules(ops: Ops) -> None:
    cache = ops.zeros([4, 1, 32, 32], "bfloat16")
    table = ops.upload(np.zeros((1, 1), np.int32), "int32", ROW_MAJOR)
    _trips(
        "dtype", lambda: ops.paged_fill_cache(cache, ops.zeros([1, 1, 32, 32], "float32"), table)
    )
    ids = ops.upload(np.zeros((1, 4), np.int32), "int32", ROW_MAJOR)
    _trips("dtype", lambda: ops.embedding(ids, ops.zeros([8, 32], "bfloat16", ROW_MAJOR)))
    buf = ops.zeros([1, 4], "uint32", ROW_MAJOR)
    _trips("dtype", lambda: ops.write(ops.host(np.zeros((1, 4)), "int32", ROW_MAJOR), buf))
    _trips("dtype", lambda: ops.host(np.zeros((32, 32)), "bfloat8_b", ROW_MAJOR))


def test_dtype_name_inverts_dtype(ops: Ops) -> None:
    """``Ops.dtype_name`` gives back the name a tensor was made with (the planner's KV headroom
    allocates more pools like the K pool by it)."""
    for name in Ops.DTYPES:
        layout = TILE if name.endswith("_b") else ROW_MAJOR
        assert ops.dtype_name(ops.allocate([32, 32], name, layout)) == name
    with pytest.raises(KeyError):
        ops.dtype("float64")


def test_argmax_is_uint32_row_major(ops: Ops) -> None:
    logits = ops.upload(np.array([[[0.0, 3.0, 1.0] + [0.0] * 29]], np.float32), "float32")
    ids = ops.argmax(logits)
    assert ids.dtype is ops.dtype("uint32") and ids.layout is ops.layout(ROW_MAJOR)
    assert ops.read(ids).tolist() == [[1]]
    _trips("dtype", lambda: ops.copy(ids, ops.zeros([1, 1], "int32", ROW_MAJOR)))


def test_no_host_io_inside_capture(ops: Ops) -> None:
    x = ops.zeros([1, 32], "float32")
    ops.mul(x, 1.0)
    tid = ops.begin_trace()
    _trips("host_io", lambda: ops.write(ops.host(np.ones((1, 32)), "float32"), x))
    _trips("host_io", lambda: ops.read(x))
    ops.end_trace(tid)


def test_no_device_allocation_or_upload_inside_capture(ops: Ops, tmp_path: Path) -> None:
    """zeros(device=...), to_device and load_tensor(device=...) write the device from the host:
    not allowed while a trace is being captured (ops allocate their outputs on the device)."""
    x = ops.zeros([1, 32], "float32")
    host = ops.host(np.ones((1, 32)), "float32")
    ops.dump(tmp_path / "t.bin", host)
    ops.mul(x, 1.0)
    tid = ops.begin_trace()
    _trips("host_io", lambda: ops.zeros([1, 32], "float32"))
    _trips("host_io", lambda: ops.to_device(host))
    _trips("host_io", lambda: ops.load_tensor(tmp_path / "t.bin"))
    ops.mul(x, 1.0)  # an op's own output is allocated by the device op: fine
    ops.end_trace(tid)


def test_no_allocation_alive_at_replay(ops: Ops) -> None:
    x = ops.zeros([1, 32, 32], "float32")
    out = ops.zeros([1, 32, 32], "float32")
    tid = _captured(ops, lambda: ops.copy(ops.add(x, 1.0), out))
    late = ops.zeros([1, 32, 32], "float32")  # allocated behind the capture and kept
    _trips("alloc", lambda: ops.execute_trace(tid, blocking=True))
    del late
    ops.execute_trace(tid, blocking=True)


def test_trace_inputs_keep_their_identity(ops: Ops) -> None:
    x = ops.zeros([1, 32, 32], "float32")
    out = ops.zeros([1, 32, 32], "float32")
    tid = _captured(ops, lambda: ops.copy(ops.add(x, 1.0), out))
    ops.deallocate(x)  # rebinding/freeing an input instead of refreshing it in place
    _trips("identity", lambda: ops.execute_trace(tid, blocking=True))


def test_one_trace_per_bucket(ops: Ops) -> None:
    x = ops.zeros([1, 32, 32], "float32")
    out = ops.zeros([1, 32, 32], "float32")

    def program() -> None:
        ops.copy(ops.add(x, 1.0), out)

    _captured(ops, program)
    _trips("one_trace", lambda: _captured(ops, program))


def test_runtime_values_are_device_tensors_under_trace(ops: Ops) -> None:
    fake = ops.ttnn
    cache = ops.zeros([8, 1, 32, 32], "bfloat16")
    table = ops.upload(np.zeros((1, 8), np.int32), "int32", ROW_MAJOR)  # whole 32-byte sticks
    q = ops.zeros([1, 1, 32, 32], "bfloat16")
    cfg = ops.sdpa_program_config(32, 32)
    flat = ops.zeros([1, 32, 64], "bfloat16")
    gates = ops.zeros([1, 32, 2], "float32")
    state = ops.zeros([1, 2, 32, 32], "float32")
    fake.transformer.chunked_scaled_dot_product_attention(
        q, cache, cache, table, 0, program_config=cfg
    )
    tid = ops.begin_trace()
    _trips(
        "runtime_args",
        lambda: fake.transformer.chunked_scaled_dot_product_attention(
            q, cache, cache, table, 0, program_config=cfg
        ),
    )
    _trips(
        "runtime_args",
        lambda: fake.transformer.chunk_gated_delta_rule(
            flat, flat, flat, gates, gates, initial_state=state, chunk_size=32
        ),
    )
    ops.end_trace(tid)
    consts = tuple(ops.upload(a, "float32") for a in gdn_const_tiles(32))
    o, _ = ops.chunk_gated_delta_rule(
        flat,
        flat,
        flat,
        gates,
        gates,
        state=state,
        scale=1.0,
        chunk_size=32,
        consts=consts,  # type: ignore[arg-type]
    )
    assert o.shape == (1, 32, 2, 32)


def test_programs_are_compiled_before_capture(ops: Ops) -> None:
    x = ops.zeros([1, 32, 32], "float32")
    tid = ops.begin_trace()
    _trips("program_cache", lambda: ops.sigmoid(x))
    ops.end_trace(tid)


def test_tile_layout_padding(ops: Ops) -> None:
    t = ops.host(np.zeros((5, 40)), "bfloat16", TILE)
    assert t.padded_shape == (32, 64)


def test_async_read_lands_only_at_a_later_event(ops: Ops) -> None:
    fake = ops.ttnn
    x = ops.upload(np.array([[1, 2]], np.uint32), "uint32", ROW_MAJOR)
    before = fake.record_event(ops.device, cq_id=0)
    host = fake.from_device(x, blocking=False)
    _trips("async_read", host.to_numpy)
    _trips("async_read", lambda: fake.to_layout(host, fake.TILE_LAYOUT))
    fake.event_synchronize(before)  # recorded before the read: proves nothing
    _trips("async_read", host.to_numpy)
    fake.event_synchronize(fake.record_event(ops.device, cq_id=0))
    assert host.to_numpy().tolist() == [[1, 2]]
    pending = ops.read_start(x)
    _trips("async_read", pending.host.to_numpy)
    ops.synchronize()
    assert pending.host.to_numpy().tolist() == [[1, 2]]


def test_async_read_sees_the_value_at_enqueue_time(ops: Ops) -> None:
    x = ops.upload(np.array([[1, 2]], np.uint32), "uint32", ROW_MAJOR)
    pending = ops.read_start(x)
    ops.write(ops.host(np.array([[7, 8]]), "uint32", ROW_MAJOR), x)  # a later step's write
    assert ops.read_finish(pending).tolist() == [[1, 2]]
    assert ops.read(x).tolist() == [[7, 8]]
