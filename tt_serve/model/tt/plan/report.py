"""``tt-serve plan``'s output: the plan as text (or JSON) and the exit status."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

from tt_serve.model.precision import PROFILES
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import DeviceSpec
from tt_serve.model.tt.options import Target, TTOptions
from tt_serve.model.tt.plan import tiers
from tt_serve.model.tt.plan.cost_table import ShapeCosts
from tt_serve.model.tt.plan.planner import Plan, max_batch_that_fits, plan, probe_blocks


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _size(n: int) -> str:
    return (
        f"{n} B" if n < 10_000 else f"{n / 1e3:.1f} kB" if n < 10_000_000 else f"{n / 1e6:.1f} MB"
    )


def format_plan(p: Plan, req: TTOptions) -> Iterator[str]:
    yield (
        f"plan: {p.device} ({p.chips} chip{'s' if p.chips > 1 else ''}, {p.chip}), precision "
        f"{p.precision}, max_batch {req.max_batch_size}, prefill_chunk {req.prefill_chunk}, "
        f"block {req.block_size}, snapshots {req.snapshot_slots}"
    )
    for note in p.notes:
        yield f"  note: {note}"
    total_w = sum(p.weights.values())
    groups = ", ".join(f"{g} {_gb(b)}" for g, b in sorted(p.weights.items()))
    dtypes = ", ".join(f"{d} {_gb(b)}" for d, b in sorted(p.weight_dtypes.items()))
    yield f"  weights      {_gb(total_w)}  ({groups})"
    yield f"               by dtype: {dtypes}"
    if not p.ok:
        yield f"  DOES NOT FIT: [{p.limit_rule}] {p.limit_message}"
        yield f"  change: {p.hint}"
        return
    yield (
        f"  KV pool      {_gb(p.kv_bytes)}  ({p.kv_blocks} blocks x {req.block_size} = "
        f"{p.kv_tokens} tokens)"
    )
    yield f"  GDN states   {_gb(p.state_bytes)}  ({req.max_batch_size} slots + working state)"
    yield f"  snapshots    {_gb(p.snapshot_bytes)}  ({req.snapshot_slots} slots)"
    how = "sized from them" if p.trace_auto else "configured"
    yield (
        f"  traces       {_gb(p.trace_needed)} needed by {p.traces} traces, "
        f"{_gb(p.trace_configured)} {how}"
    )
    yield (
        f"  DRAM         {_gb(p.dram_total)} per chip: trace region {_gb(p.trace_reserved)} "
        f"(split over the banks), peak use {_gb(p.dram_peak)}, left {_gb(p.dram_left)}"
    )
    yield f"  context      up to {p.max_context} tokens for one sequence"
    if p.readback:
        yield "  readback     per decode step: " + ", ".join(
            f"{mode.replace('_', '-')} {_size(n)}" for mode, n in p.readback.items()
        )
    if p.max_batch is not None:
        yield f"  max_batch    up to {p.max_batch} fits"
    yield "  fits"


def streamed_per_step(p: Plan) -> int:
    """Weight bytes one decode step reads: every weight but the embedding table (one row each)."""
    return sum(b for g, b in p.weights.items() if g != "embed")


def _cost(costs: ShapeCosts | None, profile: str) -> str:
    c = costs.profiles.get(profile) if costs else None
    if c is None:
        return "not measured"
    return (
        f"top-1 {c.top1:.1%}, top-5 {c.top5:.1%} (per position), whole greedy runs equal to "
        f"the reference's {c.greedy_equal_reference:.0%}, logprob drift {c.drift_mean:.3f}/{c.drift_p99:.3f}/"
        f"{c.drift_max:.3f} (mean/p99/max)"
    )


def _provenance(costs: ShapeCosts) -> str:
    v = costs.provenance
    return (
        f"measured against the float32 reference at {v['shape']}'s shapes, {v['layers']} "
        f"layers, vocab {v['vocab']}, {v['positions']} positions, commit "
        f"{str(v.get('commit'))[:10]} (bench/precision/cost.py)"
    )


def format_quality(p: Plan, costs: ShapeCosts | None) -> Iterator[str]:
    """What the plan's precision costs in output quality (``cost_table``)."""
    yield f"  quality      {p.precision}: {_cost(costs, p.precision)}"
    if costs is not None:
        yield f"               {_provenance(costs)}"


def compare_precisions(
    spec: ModelSpec,
    board: DeviceSpec,
    req: TTOptions,
    costs: ShapeCosts | None,
    echo: Callable[[str], None],
) -> int:
    """Each profile's capacity (weights streamed per decode step, KV blocks) beside its measured
    cost; exit 3 when none fits."""
    echo(f"precision profiles on {board.name} (max_batch {req.max_batch_size}):")
    fits = 0
    for profile in PROFILES:
        p = plan(spec, board, req.replace(precision=profile))
        kv = f"{p.kv_blocks} KV blocks" if p.ok else f"does not fit [{p.limit_rule}]"
        fits += p.ok
        echo(f"  {profile:9} {_gb(streamed_per_step(p))}/step, {kv}: {_cost(costs, profile)}")
    if costs is not None:
        echo(f"  {_provenance(costs)}")
    return 0 if fits else 3


def format_mock(p: Plan) -> Iterator[str]:
    """tt-metal's verdict (plan/mock.py), under the virtual device's plan."""
    m = p.mock
    if m is None:
        yield f"  checker      {p.checker}"
        return
    yield f"  checker      {m['checker']} (and the virtual device: sizes, traces)"
    how = (
        "every program eager (no mock trace shim: scripts/setup-ttnn-venv builds it)"
        if m["eager"]
        else f"{m['traces']} trace(s) captured, replayed and released by tt-metal (the mock "
        "trace shim; a mock trace has no kernel binaries, so the region is sized here)"
    )
    yield (
        f"               {m['ops']} ttnn calls validated and allocated by tt-metal in "
        f"{m['seconds']:.1f} s; {how}"
    )
    if m["dram_banks"]:
        after = ", ".join(f"{k} {_gb(v * m['dram_banks'])}" for k, v in m["dram_after"].items())
        room = m["dram_bank_bytes"] * m["dram_banks"]
        yield (
            f"  tt-metal     DRAM {m['dram_banks']} banks x {_size(m['dram_bank_bytes'])} = "
            f"{_gb(room)} after the trace region; allocated after {after}; "
            f"largest free block {_size(m['dram_largest_free'])} per bank"
        )
        yield (
            f"  tt-metal     L1 {m['l1_banks']} banks x {_size(m['l1_bank_bytes'])}; the "
            f"prefill chunk and decode step peak at {_size(m['l1_peak'])} (graph capture)"
        )
        if m.get("kv_blocks_more") is not None and m["ok"]:
            yield (
                f"  tt-metal     KV pool: the allocator still took {m['kv_blocks_more']} blocks "
                f"on top of the plan's {m['kv_blocks']} after the workload"
            )
    if m["ok"]:
        yield "  tt-metal     fits"
        return
    where = f" ({m['where']})" if m["where"] else ""
    yield f"  tt-metal     DOES NOT FIT{where} in {m['phase'] or 'startup'}: " + m[
        "message"
    ].replace("\n", "\n               ")


def main(
    spec: ModelSpec,
    board: DeviceSpec,
    req: TTOptions,
    *,
    as_json: bool,
    ops_file: str | None,
    search_batch: bool,
    echo: Callable[[str], None],
    checker: str = "virtual",
    config: dict[str, Any] | None = None,
    agents: Sequence[tiers.AgentShape] = tiers.TARGETS,
    host_gb: float = 0.0,
    disk_gb: float = 0.0,
    costs: ShapeCosts | None = None,
) -> int:
    """Plan on the virtual device; ``checker`` "mock" (or "both") also runs the plan on a
    mock box by tt-metal itself (``config``: the model's config.json, for the child): then
    ``mock`` decides (or both must fit). A plan that fits also says where ``agents``'
    conversations stay warm with ``host_gb`` / ``disk_gb`` of host and disk tiers
    (``plan/tiers.py``). ``costs``: the measured output-quality cost of the precision profiles
    at this model's shape (``cost_table``), shown beside the plan."""
    out = open(ops_file, "w") if ops_file else None  # noqa: SIM115
    try:
        p = plan(spec, board, req, out)
    finally:
        if out is not None:
            out.close()
    if p.ok and search_batch:
        p.max_batch = max_batch_that_fits(spec, board, req)
    if checker in ("mock", "both"):
        from tt_serve.model.tt.plan import mock

        assert config is not None
        blocks = p.kv_blocks or probe_blocks(req)
        verdict = mock.check(config, board.name, mock_options(req, p), blocks)
        p.mock = verdict.to_json()
        p.checker = verdict.checker if checker == "mock" else f"{verdict.checker} + virtual device"
        if not verdict.ok:
            if checker == "mock" or p.ok:
                p.limit_rule, p.limit_message = "tt-metal", verdict.message
                p.hint = mock_hint(verdict.message)
            p.ok = False
        elif checker == "mock" and not p.ok:
            p.notes.append(
                f"the virtual device refused ([{p.limit_rule}] {p.limit_message}); tt-metal "
                "accepted the same start"
            )
            p.ok, p.limit_rule, p.limit_message, p.hint = True, None, None, None
    fits = (
        tiers.fits(
            p,
            Target.of(spec, board, req),
            req.block_size,
            agents,
            host_gb=host_gb,
            disk_gb=disk_gb,
        )
        if p.ok and p.kv_blocks
        else []
    )
    if as_json:
        doc = p.to_json()
        doc["tiers"] = [{**asdict(f), "agent_bytes": f.agent_bytes, "fits": f.fits} for f in fits]
        cost = costs.profiles.get(p.precision) if costs else None
        doc["quality"] = None if costs is None or cost is None else asdict(cost) | costs.provenance
        echo(json.dumps(doc, indent=2))
    else:
        for line in format_plan(p, req):
            echo(line)
        for line in format_quality(p, costs):
            echo(line)
        for line in tiers.format_tiers(fits, board):
            echo(line)
        for line in format_mock(p):
            echo(line)
    return 0 if p.ok else 3


def mock_options(req: TTOptions, p: Plan) -> TTOptions:
    """The start tt-metal runs: the virtual plan's trace region (a mock trace has no kernel
    binaries, so the region is sized here and only reserved there)."""
    return req.replace(trace_region_size=p.trace_configured or req.trace_region_size)


def mock_hint(message: str) -> str:
    """What to change, for tt-metal's refusals we know."""
    if "Out of Memory" in message:
        return (
            "tt-metal's allocator ran out of DRAM (or L1): use --precision mixed or bfp4-mlp, "
            "fewer --kv-blocks or --snapshot-slots, a smaller --max-batch-size, or more chips "
            "(--device n300, t3k, p150x4)"
        )
    if "clash" in message:
        return (
            "a program's circular buffers overlap L1 tensors: a smaller --max-batch-size or "
            "--prefill-chunk shrinks the sharded inputs"
        )
    return "tt-metal's own check above names the operand; change the shapes that trip it"
