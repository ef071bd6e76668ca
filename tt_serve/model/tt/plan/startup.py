"""One shape-only build of a ttnn start: the backend's whole startup as the start's
``TTOptions`` and ``Target`` describe it, then a short workload (two prefill chunks, decode
steps of every slot, device- and host-sampled steps, a snapshot save / restore / reset), on a
fresh virtual device of the board (shape-only: no weights, no data) or on the real ttnn of a mock
box (``plan/mock.py``). Every rule of ``virtual/rules_*.py`` and ``virtual/dram.py``, or
tt-metal's own checks, applies at real size; a refusal is the :class:`PlanError`. The planner
(``planner.py``) sizes pools from one such build and checks them with another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tt_serve.model.interface import RowSampling, StateCopy, StepBatch, StepRow
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import DeviceSpec
from tt_serve.model.tt.layout.host import shape_only_weights
from tt_serve.model.tt.ops import DEFAULT_L1_SMALL, Ops
from tt_serve.model.tt.options import Target, TTOptions
from tt_serve.model.tt.plan.oplog import OpLog, Recorder
from tt_serve.model.tt.runtime.backend import TTBackend
from tt_serve.model.tt.runtime.build import build_backend

if TYPE_CHECKING:  # the virtual devices hold torch tensors; a mock run (plan/mock.py) has no torch
    from tt_serve.model.tt.virtual.device import VirtualTTNN
    from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN

DECODE_STEPS = 8
READBACK_SAMPLING = RowSampling(0.7, top_k=20, top_p=0.95, uniform=0.5)
"""The sampled decode steps of the workload (Qwen's recommended settings; the uniform does not
change a shape): every row drawn on the device with 5 logprobs, then every row host-picked."""


class PlanError(Exception):
    """A limit tripped: ``rule`` is the DeviceLimitError / contract rule."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule, self.message = rule, message


@dataclass
class Run:
    fake: VirtualTTNN | VirtualMeshTTNN | None  # None: the real ttnn on a mock box
    traced: bool = True  # False: every program eager (a mock box without the trace shim)
    backend: TTBackend | None = None
    ops: Ops | None = None
    readback: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)  # phase -> DRAM used per bank after it
    peak_l1: int = 0  # tt-metal's graph capture of the workload: peak L1 bytes (mock runs)
    traces: int = 0  # traces captured (and replayed by the workload)
    kv_more: int = 0  # KV blocks tt-metal's allocator still took after the workload (mock runs)

    @property
    def virtual(self) -> VirtualTTNN | VirtualMeshTTNN:
        assert self.fake is not None, "a run on a mock box has no virtual device"
        return self.fake


def _workload(
    be: TTBackend,
    log: OpLog,
    chunk: int,
    rows: int,
    kv_blocks: int,
    readback: dict[str, int],
    watch: Callable[[], AbstractContextManager[object]] = nullcontext,
) -> None:
    """Two prefill chunks of one sequence, DECODE_STEPS greedy decode steps of every slot, one
    device-sampled and one host-sampled step, and one snapshot save / restore / reset;
    ``readback``: the device -> host bytes of a decode step of each kind. ``watch`` wraps the
    first prefill chunk and the first decode step (a mock run's graph capture)."""
    assert be.pools is not None
    bs = be.pools.block_size
    blocks = max(1, be.width)
    table = tuple(1 + (i % max(1, kv_blocks - 1)) for i in range(blocks))
    log.phase = "copy"
    be.copy_states([StateCopy.reset(s) for s in range(rows)])
    log.phase = "prefill"
    n_chunks = 2 if 2 * chunk <= blocks * bs else 1
    for c in range(n_chunks):
        last = c == n_chunks - 1
        row = StepRow(1, tuple(range(3, 3 + chunk)), c * chunk, table, 0, last)
        with watch() if c == 0 else nullcontext():
            be.execute(StepBatch((row,)))
    log.phase = "decode"
    pos = n_chunks * chunk
    for step in range(DECODE_STEPS):
        p = min(pos + step, blocks * bs - 1)
        batch = tuple(StepRow(s + 1, (5,), p, table, s, True) for s in range(rows))
        before = be.ops.bytes_read
        with watch() if step == 0 else nullcontext():
            be.execute(StepBatch(batch))
        readback["greedy"] = be.ops.bytes_read - before
    p = min(pos + DECODE_STEPS, blocks * bs - 1)
    drawn = tuple(
        StepRow(s + 1, (5,), p, table, s, True, top_logprobs=5, sampling=READBACK_SAMPLING)
        for s in range(rows)
    )
    host = tuple(StepRow(s + 1, (5,), p, table, s, True, want_logits=True) for s in range(rows))
    for mode, batch in (("device_sampled", drawn), ("host_sampled", host)):
        before = be.ops.bytes_read
        be.execute(StepBatch(batch))
        readback[mode] = be.ops.bytes_read - before
    log.phase = "copy"
    if be.pools.num_snapshots:
        be.copy_states([StateCopy.save(0, 0), StateCopy.restore(0, 0), StateCopy.reset(0)])
    else:
        be.copy_states([StateCopy.reset(0)])


def run(
    spec: ModelSpec,
    opts: TTOptions,
    place: Target,
    kv_blocks: int,
    log: OpLog,
    ttnn: Any = None,
    traced: bool = True,
) -> Run:
    """The backend's startup and the workload as ``opts`` and ``place`` describe it, on a
    fresh shape-only chip or a mesh of them (tensor parallel): one shape-only build. ``ttnn``:
    the real module on a mock box instead (``plan/mock.py``): traced as on a card when the
    trace shim is loaded (``traced``), else every program eager, and tt-metal's own refusals
    (RuntimeError) become the PlanError."""
    board = place.board
    assert board is not None, "a plan runs on a known board"
    if ttnn is not None:
        real = Run(None, traced=traced)
        try:
            _start(real, Ops(Recorder(ttnn, log)), spec, opts, place, kv_blocks, log)
        except RuntimeError as exc:
            raise PlanError("tt-metal", str(exc)) from None
        return real
    from tt_serve.model.tt.virtual.device import VirtualTTNN
    from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN
    from tt_serve.model.tt.virtual.tensors import ContractViolation

    fake: VirtualTTNN | VirtualMeshTTNN
    if place.mesh == (1, 1):
        fake = VirtualTTNN(chip=board.chip, shape_only=True)
    else:
        n = place.mesh[0] * place.mesh[1]
        fake = VirtualMeshTTNN(
            num_devices=n,
            chip=board.chip,
            shape_only=True,
            max_links=board.links_on(place.mesh) if board.num_chips > 1 else 0,
            mirror=True,  # SPMD on equal shapes: one chip's model stands for every chip
        )
    run = Run(fake)
    try:
        _start(run, Ops(Recorder(fake, log)), spec, opts, place, kv_blocks, log)
    except ContractViolation as exc:
        raise PlanError(exc.rule, str(exc).split("] ", 1)[-1]) from None
    return run


def target(spec: ModelSpec, board: DeviceSpec, opts: TTOptions) -> Target:
    """``opts.mesh`` (None: the board's own) on ``board``; PlanError ``tp.split`` when the
    model does not split over it."""
    try:
        return Target.of(spec, board, opts)
    except ValueError as exc:
        raise PlanError("tp.split", str(exc)) from None


def run_on_ttnn(
    ttnn: Any,
    spec: ModelSpec,
    board: DeviceSpec,
    opts: TTOptions,
    kv_blocks: int,
    log: OpLog,
    *,
    traced: bool,
) -> Run:
    """The plan's startup, pools and workload on the real ``ttnn`` module (a mock box:
    ``plan/mock.py``), traced (with the trace shim) or every program eager; tt-metal's refusal
    is the PlanError."""
    place = target(spec, board, opts)
    return run(spec, opts, place, kv_blocks, log, ttnn=ttnn, traced=traced)


def _start(
    run: Run,
    ops: Ops,
    spec: ModelSpec,
    opts: TTOptions,
    place: Target,
    kv_blocks: int,
    log: OpLog,
) -> None:
    real = run.fake is None
    board = place.board
    assert board is not None
    l1_small = DEFAULT_L1_SMALL if real else 0
    dispatch = _mock_dispatch(board) if real else None
    # The start's own options; only a mock box without the trace shim runs every program eager.
    built = opts if run.traced else opts.replace(traced_decode=False, traced_prefill=False)
    if place.mesh == (1, 1):
        ops.open_device(0, trace_region_size=opts.trace_region_size, l1_small_size=l1_small)
    else:
        ops.open_mesh(
            place.mesh,
            trace_region_size=opts.trace_region_size,
            l1_small_size=l1_small,
            dispatch_core_type=dispatch,
        )
    run.ops = ops
    log.phase = "startup"
    be = build_backend(
        spec,
        lambda: shape_only_weights(spec),
        ops=ops,
        options=built,
        tp=place.tp,
        ccl_links=place.links,
        on_capture=lambda: setattr(log, "phase", "capture"),
    )
    run.backend = be
    watch: Callable[[], AbstractContextManager[object]] = nullcontext
    if real:
        run.after["startup"] = ops.memory_view("DRAM").allocated_per_bank
        # tt-metal's graph capture (NORMAL: the ops run as well) of one prefill chunk and one
        # decode step: the peak L1 their programs use, circular buffers and L1 tensors together
        # (ttnn.graph, torch-free). One step each: a whole workload's graph takes gigabytes.
        # A traced program's step is a replay, so its compile run is watched instead: the
        # capture at the end of allocate.
        graph = ops.ttnn.graph

        @contextmanager
        def watching() -> Iterator[None]:
            graph._cpp_begin_graph_capture(graph.RunMode.NORMAL)
            try:
                yield
            finally:
                captured = graph._cpp_end_graph_capture()
            run.peak_l1 = max(run.peak_l1, int(graph.extract_peak_L1_memory_usage(captured)))

        watch = watching
    with watch() if real and run.traced else nullcontext():
        be.allocate(
            num_kv_blocks=kv_blocks,
            block_size=opts.block_size,
            num_state_slots=opts.max_batch_size,
            num_snapshot_slots=opts.snapshot_slots,
        )
    run.traces = be.programs.num_captured
    if real:
        run.after["pools"] = ops.memory_view("DRAM").allocated_per_bank
    _workload(be, log, opts.prefill_chunk, opts.max_batch_size, kv_blocks, run.readback, watch)
    if real:
        run.after["workload"] = ops.memory_view("DRAM").allocated_per_bank
        log.phase = "kv headroom"
        pools = be.pools
        assert pools is not None, "allocated above"
        run.kv_more = _kv_headroom(ops, pools.k[0], 2 * len(pools.k)) if pools.k else 0


def _kv_headroom(ops: Ops, like: Any, tensors: int) -> int:
    """How many more KV blocks tt-metal's allocator takes once everything else is allocated:
    the largest k for which ``tensors`` more pools of k blocks shaped like ``like`` (a K pool)
    all allocate, by bisection; each try is freed again. This is the pool the real allocator
    accepts, not our DRAM arithmetic (the allocator's per-bank rounding and fragmentation
    included)."""
    shape = list(like.shape)
    dtype = ops.dtype_name(like)

    def fits(k: int) -> bool:
        held = []
        try:
            for _ in range(tensors):
                held.append(ops.allocate([k, *shape[1:]], dtype))
            return True
        except RuntimeError:  # tt-metal's out-of-memory
            return False
        finally:
            for t in held:
                ops.deallocate(t)

    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _mock_dispatch(board: DeviceSpec) -> str | None:
    """The dispatch a mock box opens with. Wormhole meshes (N300, T3K) default to ethernet
    dispatch, under which 0.81.1's mock reports an 8x8 worker grid but validates every work
    unit against 8x7 (``work_unit.cpp:47 ... targets node (0,7) ... grid on this device is
    8x7``, even for one ``ttnn.slice``): they open with tensix (WORKER) dispatch, whose 8x7
    grid both agree on; a program that fits 8x7 fits the card's 8x8."""
    return "WORKER" if board.chip.arch == "wormhole_b0" and board.num_chips > 1 else None
