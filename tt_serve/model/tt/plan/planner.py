"""Deployment planning for the ttnn backend: the backend's whole startup and a short workload on
the shape-only device model (``VirtualTTNN(shape_only=True)``), no device and no weights needed.

The plan runs what ``serve`` would run: the weights converted by the normal weight path (device
tensors of the profile's dtypes, from shape-only arrays), every pool and persistent buffer
allocated, every trace captured, then prefill chunks, decode steps and one snapshot
save/restore/reset. Every rule of ``virtual/rules.py`` and ``virtual/dram.py`` applies at real size: a
``DeviceLimitError`` (``dram.capacity``, ``trace.region``, an op's core-grid rule, ...) is the
verdict, reported with its rule and what to change.

A plan is at most two shape-only builds, both from the start's own ``TTOptions`` and
``Target`` (``options.py``). Where ``trace_region_size`` or ``kv_blocks`` is 0, a probe build
with a minimal KV pool and no trace region (tt-metal then keeps trace buffers in ordinary DRAM)
measures the captured traces, which size the region, and the peak DRAM of everything else
(weights, states, snapshots, buffers, activations; ``DramBudget.peak_less_traces`` is that peak
with a region holding the traces). The KV pool then takes what is left less
``SAFETY_FRACTION`` of the chip's DRAM, counting exactly what grows with the page-table width
(``_width_bytes``), and the second build runs the start as sized: its verdict and figures are
the plan. With both sizes given, that build alone. :func:`plan_pools` is that sizing, for the
server.

A multi-chip device is planned as the backend runs on it: tensor parallel over its mesh (1 x N,
or 2-D: T3K 2x4 with ``mesh``, Galaxy 8x4; ``VirtualMeshTTNN``: every chip its own DRAM banks,
trace region and op rules on the per-chip shapes; the collectives of each ``cluster_axis`` and
their staging buffers are charged while they run, links per axis as the device has them).
Figures are per chip.
:func:`smallest_mesh` picks the first device description whose plan fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import IO, TYPE_CHECKING, Any

from tt_serve.model.interface import RowSampling, StateCopy, StepBatch, StepRow
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import DeviceSpec, device_spec
from tt_serve.model.tt.layout import ROW_MAJOR
from tt_serve.model.tt.layout.checkpoint import layout_weights
from tt_serve.model.tt.layout.host import shape_only_weights
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.layout.table import slot
from tt_serve.model.tt.ops import DEFAULT_L1_SMALL, Ops
from tt_serve.model.tt.options import Target, TTOptions
from tt_serve.model.tt.plan.oplog import OpLog, Recorder
from tt_serve.model.tt.precision import Precision
from tt_serve.model.tt.runtime.backend import TABLE_ALIGN, TTBackend, table_width
from tt_serve.model.tt.runtime.build import build_backend
from tt_serve.model.tt.virtual.dram import DramBudget
from tt_serve.model.tt.virtual.rules import TensorInfo

if TYPE_CHECKING:  # the virtual devices hold torch tensors; a mock run (plan/mock.py) has no torch
    from tt_serve.model.tt.virtual.device import VirtualTTNN
    from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN

SAFETY_FRACTION = 0.02
"""DRAM kept free when the KV pool is sized from memory (allocator fragmentation, buffers the
device model does not see): 2% of the chip's DRAM, about 0.6 GB on a P150 and 0.24 GB on an N150."""
DECODE_STEPS = 8
READBACK_SAMPLING = RowSampling(0.7, top_k=20, top_p=0.95, uniform=0.5)
"""The sampled decode steps of the workload (Qwen's recommended settings; the uniform does not
change a shape): every row drawn on the device with 5 logprobs, then every row host-picked."""
TRACE_HEADROOM = 1.5
"""An automatic trace region is this many times the traces' estimated size (``memory.
trace_bytes`` is an estimate until it is measured on a card), in whole ``TRACE_REGION_STEP``s."""
TRACE_REGION_STEP = 16 << 20

HINTS = {
    "tp.split": (
        "pick a mesh the model's heads and widths divide over (--mesh ROWSxCOLS, or another "
        "--device)"
    ),
    "dram.capacity": (
        "use --precision mixed or bfp4-mlp (block-float weights), fewer --kv-blocks, fewer "
        "--snapshot-slots, a smaller --max-batch-size or --trace-region-size, or a device with "
        "more DRAM per chip"
    ),
    "trace.region": "raise --trace-region-size (bytes) or lower --prefill-chunk (fewer buckets)",
    "fused_recurrent_gated_delta_rule": (
        "lower --max-batch-size (one core per batch row x value head) until the backend splits "
        "the decode batch"
    ),
    "fill_cache": "lower --max-batch-size or wait for the backend's split state copies",
    "paged_sdpa_decode": "lower --max-batch-size (one core per user)",
}


@dataclass(frozen=True)
class PoolPlan:
    """The pool sizes ``TTBackend.allocate`` takes."""

    num_kv_blocks: int
    block_size: int
    num_state_slots: int
    num_snapshot_slots: int
    trace_region_size: int


@dataclass
class Plan:
    ok: bool
    device: str
    chips: int
    chip: str
    precision: str
    pools: PoolPlan | None = None
    weights: dict[str, int] = field(default_factory=dict)  # group -> bytes
    weight_dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> bytes
    kv_blocks: int = 0
    kv_tokens: int = 0
    kv_bytes: int = 0
    state_bytes: int = 0
    snapshot_bytes: int = 0
    trace_needed: int = 0
    trace_configured: int = 0
    trace_auto: bool = False  # the region was sized from the captured traces
    traces: int = 0
    dram_total: int = 0  # allocatable DRAM of the chip before the trace region
    dram_used: int = 0  # held after the workload
    dram_peak: int = 0  # high-water mark (activations included)
    dram_left: int = 0  # total - trace region - peak
    trace_reserved: int = 0  # the trace region, split over the DRAM banks
    max_context: int = 0
    max_batch: int | None = None
    # device -> host bytes of one decode step at max_batch: greedy, device-sampled (5 logprobs),
    # host-sampled (every row's logits)
    readback: dict[str, int] = field(default_factory=dict)
    limit_rule: str | None = None
    limit_message: str | None = None
    hint: str | None = None
    notes: list[str] = field(default_factory=list)
    # which checker's verdict ``ok`` is ("virtual device", or tt-metal's on a mock box), and
    # tt-metal's verdict (plan/mock.py MockVerdict as JSON) when it ran
    checker: str = "virtual device"
    mock: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class PlanError(Exception):
    """A limit tripped: ``rule`` is the DeviceLimitError / contract rule."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"[{rule}] {message}")
        self.rule, self.message = rule, message


# ---- running the plan ----------------------------------------------------------------------
def _bytes(dram: DramBudget, shape: tuple[int, ...], dtype: str, layout: str) -> int:
    return dram.per_bank(TensorInfo(shape, dtype, layout)) * dram.banks


def _weight_group(name: str, spec: ModelSpec) -> str:
    """The report group the device-weight table gives weight ``name``."""
    return slot(spec, name).weight.group


def _weight_bytes(
    spec: ModelSpec, precision: Precision, dram: DramBudget, tp: TensorParallel
) -> tuple[dict[str, int], dict[str, int]]:
    """Weight bytes per group and per dtype on one chip (its shards and the replicated ones)."""
    groups: dict[str, int] = {}
    dtypes: dict[str, int] = {}
    laid = layout_weights(spec, shape_only_weights(spec), precision, tp=tp)
    for name, hw in laid.items():
        shape = tp.chip_shape(hw)
        b = _bytes(dram, shape, hw.dtype, hw.layout)
        g = _weight_group(name, spec)
        groups[g] = groups.get(g, 0) + b
        dtypes[hw.dtype] = dtypes.get(hw.dtype, 0) + b
    return groups, dtypes


@dataclass
class _Run:
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


def _run(
    spec: ModelSpec,
    opts: TTOptions,
    place: Target,
    kv_blocks: int,
    log: OpLog,
    workload: bool = True,
    ttnn: Any = None,
    traced: bool = True,
) -> _Run:
    """The backend's startup (and the workload) as ``opts`` and ``place`` describe it, on a
    fresh shape-only chip or a mesh of them (tensor parallel): one shape-only build. ``ttnn``:
    the real module on a mock box instead (``plan/mock.py``): traced as on a card when the
    trace shim is loaded (``traced``), else every program eager, and tt-metal's own refusals
    (RuntimeError) become the PlanError."""
    board = place.board
    assert board is not None, "a plan runs on a known board"
    if ttnn is not None:
        real = _Run(None, traced=traced)
        try:
            _start(real, Ops(Recorder(ttnn, log)), spec, opts, place, kv_blocks, log, workload)
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
    run = _Run(fake)
    try:
        _start(run, Ops(Recorder(fake, log)), spec, opts, place, kv_blocks, log, workload)
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
) -> _Run:
    """The plan's startup, pools and workload on the real ``ttnn`` module (a mock box:
    ``plan/mock.py``), traced (with the trace shim) or every program eager; tt-metal's refusal
    is the PlanError."""
    place = target(spec, board, opts)
    return _run(spec, opts, place, kv_blocks, log, ttnn=ttnn, traced=traced)


def _start(
    run: _Run,
    ops: Ops,
    spec: ModelSpec,
    opts: TTOptions,
    place: Target,
    kv_blocks: int,
    log: OpLog,
    workload: bool,
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
    with watch() if real and run.traced and workload else nullcontext():
        be.allocate(
            num_kv_blocks=kv_blocks,
            block_size=opts.block_size,
            num_state_slots=opts.max_batch_size,
            num_snapshot_slots=opts.snapshot_slots,
        )
    run.traces = be.programs.num_captured
    if real:
        run.after["pools"] = ops.memory_view("DRAM").allocated_per_bank
    if not workload:
        return
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


def _hint(rule: str) -> str:
    for key, hint in HINTS.items():
        if rule.startswith(key):
            return hint
    return "see the rule in tt_serve/model/tt/virtual/rules.py; change the shapes that trip it"


def _chips(fake: VirtualTTNN | VirtualMeshTTNN) -> list[VirtualTTNN]:
    from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN

    return list(fake.chips) if isinstance(fake, VirtualMeshTTNN) else [fake]


def _kv_bytes(dram: DramBudget, spec: ModelSpec, opts: TTOptions, n: int, kv_heads: int = 0) -> int:
    """One chip's KV pools of ``n`` blocks, per bank (``kv_heads``: the chip's heads; 0: all)."""
    shape = (n, kv_heads or spec.num_kv_heads, opts.block_size, spec.head_dim)
    kv = opts.weights.kv_cache
    return 2 * spec.num_attention_layers * dram.per_bank(TensorInfo(shape, kv, "tile"))


def _width_bytes(
    dram: DramBudget, spec: ModelSpec, opts: TTOptions, buckets: int, width: int
) -> int:
    """Per bank, what follows the page-table width (``TTBackend.allocate``): the resident RoPE
    tables (cos and sin, width x block_size rows, ``TTModel.upload_rope``) and the page table of
    every program's inputs (one row for each of the ``buckets`` prefill buckets, one per decode
    row: ``runtime/inputs.py``)."""
    rope = TensorInfo((width * opts.block_size, spec.head_dim), opts.weights.activations, ROW_MAJOR)
    tables = [TensorInfo((1, width), "int32", ROW_MAJOR)] * buckets
    tables.append(TensorInfo((opts.max_batch_size, width), "int32", ROW_MAJOR))
    return 2 * dram.per_bank(rope) + sum(dram.per_bank(t) for t in tables)


def _size_kv(spec: ModelSpec, opts: TTOptions, place: Target, probe: _Run) -> int:
    """The most KV blocks that fit beside what the probe run measured, for a start with a
    ``opts.trace_region_size`` region.

    The probe ran the whole startup and workload with a ``probe_blocks`` pool (traces in
    ordinary DRAM when it had no region: ``DramBudget.peak_less_traces`` is then its peak with
    a region holding them). Its peak less its KV pool and less what follows the page-table
    width is the rest of the start; the candidate pool adds its own KV and width."""
    board = place.board
    assert board is not None and probe.backend is not None
    dram = DramBudget(board.chip, trace_region_size=opts.trace_region_size)
    blocks, kvh = probe_blocks(opts), place.tp.kv_heads
    buckets = len(probe.backend.buckets)
    per_seq = _table_blocks(spec, opts)
    peak = max(c.dram.peak_less_traces for c in _chips(probe.virtual))
    rest = (
        peak
        - _kv_bytes(dram, spec, opts, blocks, kvh)
        - _width_bytes(dram, spec, opts, buckets, probe.backend.width)
    )
    margin = int(SAFETY_FRACTION * board.chip.dram_bytes) // dram.banks

    def fits(n: int) -> bool:
        width = table_width(n, per_seq)
        need = (
            rest
            + _width_bytes(dram, spec, opts, buckets, width)
            + _kv_bytes(dram, spec, opts, n, kvh)
        )
        return need + margin <= dram.bank_bytes

    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def plan_pools(spec: ModelSpec, place: Target, opts: TTOptions) -> PoolPlan:
    """The pools the server should allocate for ``opts`` on ``place`` (KV sized from DRAM
    when ``opts.kv_blocks`` is 0, the trace region from the traces when
    ``opts.trace_region_size`` is 0). Raises PlanError naming the limit when nothing fits."""
    assert place.board is not None, "a plan needs the board"
    p = plan(spec, place.board, opts, place=place)
    if not p.ok or p.pools is None:
        raise PlanError(p.limit_rule or "plan", f"{p.limit_message} ({p.hint})")
    return p.pools


def _table_blocks(spec: ModelSpec, opts: TTOptions) -> int:
    """Blocks of one whole sequence (the widest page table any pool gives the traces; the
    backend's own ``allocate`` clamps max_model_len the same way)."""
    limit = spec.max_position_embeddings
    return -(-min(opts.max_model_len or limit, limit) // opts.block_size)


def probe_blocks(opts: TTOptions) -> int:
    """A minimal KV pool for probe runs: the padding block plus two chunks' worth, at least
    one page-table stick (``TABLE_ALIGN`` blocks)."""
    return max(TABLE_ALIGN, 2 + -(-2 * opts.prefill_chunk // opts.block_size))


def sized_trace_region(needed: int) -> int:
    """The trace region for traces of ``needed`` bytes: TRACE_HEADROOM x, whole steps."""
    want = int(needed * TRACE_HEADROOM)
    return max(1, -(-want // TRACE_REGION_STEP)) * TRACE_REGION_STEP


def plan(
    spec: ModelSpec,
    board: DeviceSpec,
    opts: TTOptions,
    ops_out: IO[str] | None = None,
    *,
    place: Target | None = None,
) -> Plan:
    """Run the startup and a short workload on the shape-only model of ``board`` as ``opts``
    describe them (``place``: the start's target, worked out here when not given).

    At most two shape-only builds: where the trace region or the KV pool is to be sized
    (``trace_region_size`` or ``kv_blocks`` 0), a probe with a ``probe_blocks`` pool and no
    trace region measures the traces and the rest of the start, then the start itself runs
    with the sizes chosen (the verdict and every figure reported); both given, that run alone."""
    result = Plan(
        ok=False,
        device=board.name,
        chips=board.num_chips,
        chip=board.chip.arch,
        precision=opts.precision,
        trace_configured=opts.trace_region_size,
    )
    mesh = opts.mesh or board.mesh
    try:
        place = place or Target.of(spec, board, opts)
        split: str | None = None
        tp = place.tp
    except ValueError as exc:  # reported below, after the weights
        split, tp = str(exc), TensorParallel(spec, 1)
    result.chips = mesh[0] * mesh[1]
    if result.chips > 1 and mesh[0] == 1:
        result.notes.append(
            f"tensor parallel over a {mesh[0]} x {mesh[1]} mesh: weights, pools and DRAM are "
            f"per chip (heads, widths and vocabulary split {tp.degree} ways; embedding, norms "
            "and router replicated); the collectives' staging buffers count in the peak"
        )
    elif result.chips > 1:
        result.notes.append(
            f"tensor parallel over a {mesh[0]} x {mesh[1]} mesh: weights, pools and DRAM are "
            f"per chip; heads (attention, GDN) split over the {mesh[1]} columns (cluster_axis "
            f"1) and every projection also over the {mesh[0]} rows (cluster_axis 0), so each "
            f"chip holds 1/{tp.degree} of each projection; MLP and vocabulary over all "
            f"{tp.degree} chips; KV, GDN states and snapshots per column, replicated over the "
            "rows; embedding and norms replicated; both axes' collectives and staging buffers "
            "count in the peak"
        )
    no_region = DramBudget(board.chip)
    result.weights, result.weight_dtypes = _weight_bytes(spec, opts.weights, no_region, tp)
    result.dram_total = no_region.bank_bytes * no_region.banks
    per_seq = _table_blocks(spec, opts)
    try:
        if split is not None:
            raise PlanError("tp.split", split)
        assert place is not None
        if opts.trace_region_size == 0 or opts.kv_blocks == 0:
            probe = _run(spec, opts, place, probe_blocks(opts), OpLog(None))
            if opts.trace_region_size == 0:
                region = sized_trace_region(sum(probe.virtual.trace_region.live.values()))
                opts = opts.replace(trace_region_size=region)
                result.trace_configured, result.trace_auto = region, True
                result.notes.append(
                    f"trace region sized from the captured traces: {region >> 20} MiB "
                    f"({TRACE_HEADROOM}x the estimate, whole {TRACE_REGION_STEP >> 20} MiB; "
                    "--trace-region-size sets it)"
                )
            if opts.kv_blocks == 0:
                kv_blocks = _size_kv(spec, opts, place, probe)
                if kv_blocks < TABLE_ALIGN:
                    raise PlanError(
                        "dram.capacity",
                        "no DRAM is left for a KV pool after weights, states, snapshots, "
                        "activations and the trace region",
                    )
                opts = opts.replace(kv_blocks=kv_blocks)
                result.notes.append(
                    f"KV pool sized from DRAM: {kv_blocks} blocks, keeping "
                    f"{SAFETY_FRACTION:.0%} of the chip's DRAM free"
                )
        kv_blocks = opts.kv_blocks
        log = OpLog(ops_out)
        run = _run(spec, opts, place, kv_blocks, log)
    except PlanError as exc:
        result.limit_rule, result.limit_message = exc.rule, exc.message
        result.hint = _hint(exc.rule)
        dram = DramBudget(board.chip, trace_region_size=opts.trace_region_size)
        weights, room = sum(result.weights.values()), dram.bank_bytes * dram.banks
        if exc.rule == "dram.capacity" and weights > room:
            smaller = "use --precision mixed or bfp4-mlp (block-float weights), "
            after = (
                f"after a {opts.trace_region_size >> 20} MiB trace region (split over the "
                "DRAM banks)"
                if opts.trace_region_size
                else "before any trace region"
            )
            result.hint = (
                f"the weights alone ({weights / 1e9:.2f} GB as {opts.precision}) exceed the "
                f"{room / 1e9:.2f} GB this chip has {after}: "
                + (smaller if opts.precision == "bfloat16" else "")
                + "a device with more DRAM per chip (p150: 32 GB), or more chips (tensor "
                "parallel: --device n300, t3k, p150x4)"
            )
        return result
    fake, be = run.virtual, run.backend
    assert be is not None and be.pools is not None
    pools, banks = be.pools, fake.dram.banks
    result.ok = True
    result.pools = PoolPlan(
        kv_blocks,
        opts.block_size,
        opts.max_batch_size,
        opts.snapshot_slots,
        opts.trace_region_size,
    )
    result.kv_blocks = kv_blocks
    result.kv_tokens = (kv_blocks - 1) * opts.block_size
    kv_chip = _kv_bytes(fake.dram, spec, opts, kv_blocks, tp.kv_heads)
    result.kv_bytes = kv_chip * banks

    def pool_bytes(ts: list[Any]) -> int:
        return sum(fake.dram.per_bank(t.info()) for t in ts) * banks

    result.state_bytes = pool_bytes(pools.conv + pools.rec + pools.conv_work + pools.rec_work)
    result.snapshot_bytes = pool_bytes(pools.snap_conv + pools.snap_rec)
    result.trace_needed = sum(fake.trace_region.live.values())
    result.traces = len(fake.trace_region.live)
    result.dram_used = fake.dram.used_per_bank * banks
    result.dram_peak = fake.dram_peak_per_bank * banks
    result.dram_left = fake.dram.bank_bytes * banks - result.dram_peak
    result.trace_reserved = opts.trace_region_size
    result.max_context = min(result.kv_tokens, per_seq * opts.block_size)
    result.readback = dict(run.readback)
    enough = sized_trace_region(result.trace_needed)
    if enough < opts.trace_region_size and not result.trace_auto:
        freed = opts.trace_region_size - enough
        result.notes.append(
            f"the traces need {result.trace_needed >> 20} MiB (an estimate, memory.trace_bytes): "
            f"--trace-region-size {enough} (or 0: sized from the traces) would free "
            f"{freed / 1e9:.2f} GB of DRAM for the KV pool"
        )
    return result


def smallest_mesh(spec: ModelSpec, opts: TTOptions, candidates: list[str]) -> Plan | None:
    """The plan on the first device of ``candidates`` (order them smallest first, e.g.
    ``["p150", "p300", "p150x4", "p150x8"]``) whose plan fits ``opts`` (its ``mesh`` is
    replaced: each candidate runs on its own mesh); None when none fits."""
    for name in candidates:
        p = plan(spec, device_spec(name), opts.replace(mesh=None))
        if p.ok:
            return p
    return None


def max_batch_that_fits(spec: ModelSpec, board: DeviceSpec, opts: TTOptions, top: int = 32) -> int:
    """The largest max_batch (1..top) whose plan succeeds, by bisection (0: none)."""

    def ok(b: int) -> bool:
        return plan(spec, board, opts.replace(max_batch_size=b)).ok

    if not ok(1):
        return 0
    lo, hi = 1, top + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
