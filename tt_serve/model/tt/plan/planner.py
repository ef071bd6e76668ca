"""Deployment planning for the ttnn backend: the backend's whole startup and a short workload on
the shape-only device model (``VirtualTTNN(shape_only=True)``), no device and no weights needed.

The plan runs what ``serve`` would run: the weights converted by the normal weight path (device
tensors of the profile's dtypes, from shape-only arrays), every pool and persistent buffer
allocated, every trace captured, then prefill chunks, decode steps and one snapshot
save/restore/reset. Every rule of ``virtual/rules_*.py`` and ``virtual/dram.py`` applies at real
size: a ``DeviceLimitError`` (``dram.capacity``, ``trace.region``, an op's core-grid rule, ...) is
the verdict, reported with its rule and what to change.

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

from dataclasses import asdict, dataclass, field
from typing import IO, TYPE_CHECKING, Any

from tt_serve.model.precision import Precision
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import DeviceSpec, device_spec
from tt_serve.model.tt.layout import ROW_MAJOR
from tt_serve.model.tt.layout.checkpoint import layout_weights
from tt_serve.model.tt.layout.host import shape_only_weights
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.layout.table import slot
from tt_serve.model.tt.options import Target, TTOptions
from tt_serve.model.tt.plan import startup
from tt_serve.model.tt.plan.oplog import OpLog
from tt_serve.model.tt.plan.startup import PlanError, Run
from tt_serve.model.tt.runtime.backend import TABLE_ALIGN, table_width
from tt_serve.model.tt.virtual.dram import DramBudget
from tt_serve.model.tt.virtual.rules_base import TensorInfo

if TYPE_CHECKING:  # the virtual devices hold torch tensors; a mock run (plan/mock.py) has no torch
    pass

SAFETY_FRACTION = 0.02
"""DRAM kept free when the KV pool is sized from memory (allocator fragmentation, buffers the
device model does not see): 2% of the chip's DRAM, about 0.6 GB on a P150 and 0.24 GB on an N150."""
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


def _hint(rule: str) -> str:
    for key, hint in HINTS.items():
        if rule.startswith(key):
            return hint
    return "see the rule in tt_serve/model/tt/virtual/rules_*.py; change the shapes that trip it"


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


def _size_kv(spec: ModelSpec, opts: TTOptions, place: Target, probe: Run) -> int:
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
    peak = probe.virtual.dram_peak_less_traces
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
    per_seq = _table_blocks(spec, opts)
    no_region = DramBudget(board.chip)
    result.weights, result.weight_dtypes = _weight_bytes(spec, opts.weights, no_region, tp)
    result.dram_total = no_region.bank_bytes * no_region.banks
    try:
        if split is not None:
            raise PlanError("tp.split", split)
        assert place is not None
        if opts.trace_region_size == 0 or opts.kv_blocks == 0:
            probe = startup.run(spec, opts, place, probe_blocks(opts), OpLog(None))
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
        run = startup.run(spec, opts, place, kv_blocks, log)
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
