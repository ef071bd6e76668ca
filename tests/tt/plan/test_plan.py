"""``tt-serve plan``: the 9B config-only folder on p150 fits; bf16 9B on n150 is refused."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tt_serve.model.precision import Precision
from tt_serve.model.published import write_published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import device_spec
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.plan import planner, startup

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def q9(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_published_config("qwen3.5-9b", tmp_path_factory.mktemp("q9plan"))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tt_serve.cli", "plan", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


def test_plan_9b_p150_sizes_kv_from_dram(q9: Path) -> None:
    spec = ModelSpec.from_hf_dir(q9)
    board = device_spec("p150")
    req = TTOptions(precision="mixed", max_batch_size=16)
    p = planner.plan(spec, board, req)
    assert p.ok, f"[{p.limit_rule}] {p.limit_message}"
    weights = sum(p.weights.values())
    # Parameters per group (qwen-configs.md), bytes per the profile: bfloat16 2 B,
    # bfloat8_b 1088 B per 1024-element tile, bfloat4_b 576 B.
    per = {"bfloat16": 2.0, "bfloat8_b": 1088 / 1024, "bfloat4_b": 576 / 1024}
    prec = Precision.named("mixed")
    params = {
        "attention": (8 * (4096 * (8192 + 2 * 1024) + 4096 * 4096), prec.attention),
        "gdn": (24 * (4096 * (8192 + 4096 + 64) + 4096 * 4096), prec.gdn),
        "mlp": (32 * 3 * 4096 * 12288, prec.mlp),
        "lm_head": (248320 * 4096, prec.lm_head),
        "embed": (248320 * 4096, "bfloat16"),
    }
    # GDN conv taps: 4 x [1, 1, 1, 8192] bf16 TILE per layer, each padded to 32 rows
    taps = 24 * 4 * 32 * 8192 * 2
    for group, (n, dtype) in params.items():
        want = n * per[dtype] + (taps if group == "gdn" else 0)
        assert abs(p.weights[group] - want) / want < 0.01, group
    expected = sum(n * per[dtype] for n, dtype in params.values()) + taps
    assert abs(weights - expected) / expected < 0.01
    assert p.kv_blocks > 1000 and p.pools is not None and p.pools.num_kv_blocks == p.kv_blocks
    total = weights + p.kv_bytes + p.state_bytes + p.snapshot_bytes + p.trace_reserved
    assert total <= p.dram_total
    assert p.dram_left >= 0 and p.trace_needed <= p.trace_configured
    assert p.max_context == 262144  # the KV pool holds a full-length sequence


def test_plan_refuses_bf16_9b_on_n150(q9: Path) -> None:
    proc = _cli("--model", str(q9), "--device", "n150", "--precision", "bfloat16")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "DOES NOT FIT: [dram.capacity]" in proc.stdout
    assert "exceed" in proc.stdout and "--precision mixed" in proc.stdout  # what to change


def test_plan_json_and_ops(q9: Path, tmp_path: Path) -> None:
    ops = tmp_path / "ops.jsonl"
    args = ("--model", str(q9), "--device", "p150", "--max-batch-size", "1", "--kv-blocks", "64")
    proc = _cli(*args, "--json", "--ops", str(ops))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["ok"] and plan["kv_blocks"] == 64 and plan["pools"]["num_state_slots"] == 1
    lines = [json.loads(line) for line in ops.read_text().splitlines()]
    assert {x["phase"] for x in lines} >= {"startup", "capture", "prefill", "decode", "copy"}
    rec = [x for x in lines if x["op"].endswith("fused_recurrent_gated_delta_rule")]
    assert rec and rec[0]["tensors"]["initial_state"]["dtype"] == "float32"
    assert all(set(x) == {"op", "tensors", "kwargs", "phase"} for x in lines)


def test_plan_multichip_is_per_chip(q9: Path) -> None:
    """A 2-chip device is planned tensor parallel: per-chip weights are half the split ones
    plus the replicated embedding and norms."""
    spec = ModelSpec.from_hf_dir(q9)
    p = planner.plan(spec, device_spec("p300"), TTOptions(max_batch_size=1, kv_blocks=64))
    one = planner.plan(spec, device_spec("p150"), TTOptions(max_batch_size=1, kv_blocks=64))
    assert p.ok and p.chips == 2 and any("1 x 2 mesh" in n for n in p.notes)
    split = sum(v for k, v in one.weights.items() if k not in ("embed", "norms"))
    assert sum(p.weights.values()) < one.weights["embed"] + one.weights["norms"] + split / 1.9


def test_plan_pools_from_serve_config(q9: Path) -> None:
    from tt_serve.config import ServeConfig

    spec = ModelSpec.from_hf_dir(q9)
    cfg = ServeConfig(model=str(q9), backend="ttnn", max_batch_size=1, kv_blocks=64)
    opts = TTOptions.from_config(cfg)
    pools = planner.plan_pools(spec, startup.target(spec, device_spec("p150"), opts), opts)
    assert pools.num_kv_blocks == 64 and pools.num_state_slots == 1
    assert pools.num_snapshot_slots == cfg.snapshot_slots
    bad = TTOptions.from_config(ServeConfig(model=str(q9), backend="ttnn", precision="bfloat16"))
    with pytest.raises(planner.PlanError, match=r"dram\.capacity"):
        planner.plan_pools(spec, startup.target(spec, device_spec("n150"), bad), bad)


@pytest.mark.parametrize(
    ("board", "mesh"), [("p150", ""), ("p100", ""), ("n150", ""), ("p300", "1x2")]
)
def test_a_ttnn_start_plans_once_and_builds_once(
    dense_dir: Path, monkeypatch: pytest.MonkeyPatch, board: str, mesh: str
) -> None:
    """``serve --backend ttnn`` with kv_blocks and trace_region_size 0: the box is identified by
    its ClusterType before anything opens, one planner call sizes the trace region and the KV
    pool on that box (P100 and P150 told apart: they share a grid, not a DRAM size), and the
    backend is built once on the device itself; every other build is the planner's, on the
    shape-only virtual device. The pools equal what ``tt-serve plan`` computes for the box."""
    from tests.tt import harness as h
    from tt_serve.config import ServeConfig
    from tt_serve.model.tt.boards import device_spec
    from tt_serve.model.tt.launch import launch
    from tt_serve.model.tt.ops import Ops
    from tt_serve.model.tt.runtime.backend import TTBackend

    builds: list[bool] = []  # shape-only (the planner's virtual device) per TTBackend built
    init = TTBackend.__init__

    def counted(self: TTBackend, *a: Any, **kw: Any) -> None:
        builds.append(bool(kw["ops"].ttnn.shape_only))
        init(self, *a, **kw)

    monkeypatch.setattr(TTBackend, "__init__", counted)
    dev = device_spec(board)
    chips = dev.num_chips
    fake = h.mesh_fake(chips, chip=dev.chip) if chips > 1 else h.fake(chip=dev.chip)
    spec = ModelSpec.from_hf_dir(dense_dir)
    cfg = ServeConfig(
        model=str(dense_dir),
        backend="ttnn",
        block_size=64,
        max_batch_size=4,
        device_ids=tuple(range(chips)),
        mesh=mesh,
    )
    launched = launch(cfg, spec, max_model_len=1024, ops=Ops(fake))
    assert builds.count(False) == 1, "the backend is built once on the device"
    assert builds.count(True) == 2, "the planner's: one probe, then the start as sized"
    assert len(builds) == 3 and builds[-1] is False, "planned first, then built"
    opts = TTOptions.from_config(cfg, max_model_len=1024)
    want = planner.plan_pools(spec, startup.target(spec, dev, opts), opts)
    assert launched.num_kv_blocks == want.num_kv_blocks
    assert launched.backend.ops.trace_region_size == want.trace_region_size > 0
    assert launched.num_kv_blocks > 1000  # device DRAM, not a host-RAM quarter of a tiny model
    launched.backend.close()


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, TTOptions]]:
    """(shape-only, options) of every TTBackend built from here on."""
    from tt_serve.model.tt.runtime.backend import TTBackend

    builds: list[tuple[bool, TTOptions]] = []
    init = TTBackend.__init__

    def counted(self: TTBackend, *a: Any, **kw: Any) -> None:
        builds.append((bool(kw["ops"].ttnn.shape_only), kw["options"]))
        init(self, *a, **kw)

    monkeypatch.setattr(TTBackend, "__init__", counted)
    return builds


@pytest.mark.parametrize(
    ("kv_blocks", "region", "want"), [(0, 0, 2), (64, 0, 2), (0, 64 << 20, 2), (64, 64 << 20, 1)]
)
def test_a_plan_builds_at_most_twice(
    dense_dir: Path, monkeypatch: pytest.MonkeyPatch, kv_blocks: int, region: int, want: int
) -> None:
    """``tt-serve plan``: one shape-only build when every size is given; where the trace region
    or the KV pool is sized, one probe build measures both, and the start as sized is checked
    by a second (it was four: a trace probe, two KV probes and the check)."""
    builds = _count_builds(monkeypatch)
    spec = ModelSpec.from_hf_dir(dense_dir)
    opts = TTOptions(
        precision="mixed", max_batch_size=4, kv_blocks=kv_blocks, trace_region_size=region
    )
    p = planner.plan(spec, device_spec("p150"), opts)
    assert p.ok, p.limit_message
    assert len(builds) == want and all(shape_only for shape_only, _ in builds)
    assert p.kv_blocks == (kv_blocks or p.kv_blocks) > 0


def test_the_kv_pool_keeps_the_safety_margin_exactly(dense_dir: Path) -> None:
    """The KV pool sized from one probe leaves the chip's ``SAFETY_FRACTION`` free at the
    start's measured peak, to within one KV block: the probe's rest of the start plus what
    follows the page-table width (``_width_bytes``) is what the sized start then holds."""
    spec = ModelSpec.from_hf_dir(dense_dir)
    board = device_spec("n150")
    p = planner.plan(spec, board, TTOptions(precision="mixed", max_batch_size=4))
    assert p.ok, p.limit_message
    margin = int(planner.SAFETY_FRACTION * board.chip.dram_bytes)
    block = p.kv_bytes // p.kv_blocks
    assert margin <= p.dram_left < margin + block + 8 * 4096


def test_an_option_reaches_both_builds(dense_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A field added to the start's options reaches the planner's builds and the real build
    unchanged: every build of a start takes the one ``TTOptions`` (a subclass with a new
    field stands in for an option added tomorrow)."""
    from tests.tt import harness as h
    from tt_serve.config import ServeConfig
    from tt_serve.model.tt.launch import launch
    from tt_serve.model.tt.ops import Ops

    extended = dataclasses.make_dataclass(
        "Extended",
        [("new_knob", int, dataclasses.field(default=0))],
        bases=(TTOptions,),
        frozen=True,
    )
    base = TTOptions.from_config

    def from_config(cfg: ServeConfig, **kw: Any) -> TTOptions:
        return extended(**dataclasses.asdict(base(cfg, **kw)), new_knob=7)  # type: ignore[no-any-return]

    monkeypatch.setattr(TTOptions, "from_config", staticmethod(from_config))
    builds = _count_builds(monkeypatch)
    spec = ModelSpec.from_hf_dir(dense_dir)
    cfg = ServeConfig(
        model=str(dense_dir),
        backend="ttnn",
        max_batch_size=4,
        device_resident=True,
        prefill_chunk=128,
    )
    launched = launch(cfg, spec, max_model_len=1024, ops=Ops(h.fake()))
    assert [shape_only for shape_only, _ in builds] == [True, True, False]
    for _, opts in builds:
        assert isinstance(opts, extended) and opts.new_knob == 7  # type: ignore[attr-defined]
        assert opts.device_resident and opts.prefill_chunk == 128 and opts.max_model_len == 1024
    # the sized start is what the planner checked and what the device got
    assert builds[1][1] == builds[2][1]
    assert launched.num_kv_blocks == builds[2][1].kv_blocks
    launched.backend.close()


def test_trace_region_is_sized_from_the_captured_traces(q9: Path) -> None:
    """trace_region_size 0 (the default): a first startup with no region (tt-metal keeps trace
    buffers in DRAM then) measures the traces; the region is 1.5x that in whole 16 MiB."""
    spec = ModelSpec.from_hf_dir(q9)
    board = device_spec("p150")
    req = TTOptions(precision="mixed", kv_blocks=512)
    assert req.trace_region_size == 0
    p = planner.plan(spec, board, req)
    assert p.ok and p.trace_auto, p.limit_message
    assert p.trace_configured % (16 << 20) == 0
    assert p.trace_needed * 1.5 <= p.trace_configured < p.trace_needed * 1.5 + (16 << 20)
    assert p.pools is not None and p.pools.trace_region_size == p.trace_configured
    fixed = planner.plan(spec, board, req.replace(trace_region_size=p.trace_configured))
    assert fixed.ok and not fixed.trace_auto and fixed.trace_needed == p.trace_needed


def test_old_256_mib_trace_region_refuses_qwen36_prefill_buckets(q9: Path) -> None:
    """Review finding 7: the old fixed 256 MiB region cannot hold the decode trace plus traced
    prefill buckets 64..4096 at max_batch 32 (by memory.trace_bytes, an estimate until measured
    on a card): the capture of the last bucket fails at end_trace_capture. Sized from the
    traces, the same configuration starts."""
    spec = ModelSpec.from_hf_dir(q9)
    board = device_spec("p150")
    req = TTOptions(
        precision="bfp4-mlp",
        max_batch_size=32,
        prefill_chunk=4096,
        traced_prefill=True,
        kv_blocks=1024,
        trace_region_size=256 << 20,
    )
    old = planner.plan(spec, board, req)
    assert not old.ok and old.limit_rule == "trace.region", old.limit_message
    assert "--trace-region-size" in (old.hint or "")
    new = planner.plan(spec, board, req.replace(trace_region_size=0))
    assert new.ok and new.traces == 8 and new.trace_configured > 256 << 20


def test_prefill_attention_is_head_major_at_9b_dims(q9: Path) -> None:
    """Review finding 10: prefill q/k/v are normed, rotated and written head-major
    ([1, heads, T, 256]); no prefill tensor keeps 4 KV heads (or cos/sin's 1) on the tile-row
    axis, which pads them to 32 rows per token. Decode keeps rows outermost."""
    import io

    spec = ModelSpec.from_hf_dir(q9)
    log = io.StringIO()
    board = device_spec("p150")
    req = TTOptions(max_batch_size=2, kv_blocks=64, trace_region_size=1 << 30)
    assert planner.plan(spec, board, req, log).ok
    calls = [json.loads(line) for line in log.getvalue().splitlines()]
    prefill = [c for c in calls if c["phase"] == "prefill"]
    chunk = req.prefill_chunk
    fills = [c for c in prefill if c["op"] == "ttnn.experimental.paged_fill_cache"]
    assert fills and {tuple(c["tensors"]["1"]["shape"]) for c in fills} == {(1, 4, chunk, 256)}
    shapes = {tuple(t["shape"]) for c in prefill for t in c["tensors"].values()}
    assert (1, 4, chunk, 256) in shapes and (1, 16, chunk, 256) in shapes  # k, q head-major
    assert (1, 1, chunk, 256) in shapes  # cos/sin broadcast over heads
    assert not {(1, chunk, 4, 256), (1, chunk, 1, 256)} & shapes
    norms = [c for c in prefill if c["op"] == "ttnn.rms_norm"]
    assert {tuple(c["tensors"]["0"]["shape"]) for c in norms} >= {(1, 4, chunk, 256)}
    # decode runs as a replay: its ops are logged where the decode trace is captured
    updates = [c for c in calls if c["op"] == "ttnn.experimental.paged_update_cache"]
    assert updates and {tuple(c["tensors"]["1"]["shape"]) for c in updates} == {(1, 2, 4, 256)}


def test_plan_smallest_names_the_first_device_that_fits() -> None:
    """bf16 9B: the weights alone overflow one N150; the N300 (tensor parallel over 2 chips)
    is the smallest of the list that holds it. A list where nothing fits exits 3."""
    r = _cli("--model", "qwen3.5-9b", "--smallest", "n150,n300", "--max-batch-size", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("n150: does not fit: [dram.capacity]")
    assert lines[1] == "n300: fits; the smallest of n150, n300 that does"
    assert "1 x 2 mesh" in r.stdout and "fits" in lines[-1]
    none = _cli("--model", "qwen3.5-9b", "--smallest", "n150", "--max-batch-size", "1")
    assert none.returncode == 3 and none.stdout.splitlines()[-1] == "none of n150 fits"
    bad = _cli("--model", "qwen3.5-9b", "--smallest", "n150,nope")
    assert bad.returncode == 2 and "nope" in bad.stderr


def test_compare_precisions_puts_each_profile_s_capacity_beside_its_cost() -> None:
    """Lighter weights read less per step and leave more KV; each line carries the measured
    cost from the committed table, and the plain plan prints its own profile's."""
    r = _cli("--model", "qwen3.5-0.8b", "--compare-precisions", "--max-batch-size", "1")
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:4]}
    assert list(rows) == ["bfloat16", "mixed", "bfp4-mlp"]
    per_step = [float(ln.split()[1]) for ln in rows.values()]
    blocks = [int(ln.split("GB/step, ")[1].split()[0]) for ln in rows.values()]
    assert per_step == sorted(per_step, reverse=True) and blocks == sorted(blocks)
    assert all("top-1" in ln and "logprob drift" in ln for ln in rows.values())
    assert "measured against the float32 reference at qwen3.5-0.8b" in r.stdout
    plain = _cli("--model", "qwen3.5-0.8b", "--precision", "mixed", "--max-batch-size", "1")
    assert "quality      mixed: top-1" in plain.stdout, plain.stdout
