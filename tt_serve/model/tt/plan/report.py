"""``tt-serve plan``'s output: the plan as text (or JSON) and the exit status."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.plan.planner import Plan, PlanRequest, max_batch_that_fits, plan


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _size(n: int) -> str:
    return (
        f"{n} B" if n < 10_000 else f"{n / 1e3:.1f} kB" if n < 10_000_000 else f"{n / 1e6:.1f} MB"
    )


def format_plan(p: Plan, req: PlanRequest) -> Iterator[str]:
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
        f"(every bank), peak use {_gb(p.dram_peak)}, left {_gb(p.dram_left)}"
    )
    yield f"  context      up to {p.max_context} tokens for one sequence"
    if p.readback:
        yield "  readback     per decode step: " + ", ".join(
            f"{mode.replace('_', '-')} {_size(n)}" for mode, n in p.readback.items()
        )
    if p.max_batch is not None:
        yield f"  max_batch    up to {p.max_batch} fits"
    yield "  fits"


def main(
    spec: ModelSpec,
    req: PlanRequest,
    *,
    as_json: bool,
    ops_file: str | None,
    search_batch: bool,
    echo: Callable[[str], None],
) -> int:
    out = open(ops_file, "w") if ops_file else None  # noqa: SIM115
    try:
        p = plan(spec, req, out)
    finally:
        if out is not None:
            out.close()
    if p.ok and search_batch:
        p.max_batch = max_batch_that_fits(spec, req)
    if as_json:
        echo(json.dumps(p.to_json(), indent=2))
    else:
        for line in format_plan(p, req):
            echo(line)
    return 0 if p.ok else 3
