"""The deployment table: which published model fits which chip, at which batch and precision.

Runs ``tt-serve plan`` (the backend's whole startup, its traces, prefill chunks, decode steps and
snapshot copies on the shape-only device model) for every combination asked, appends one ledger
line per plan to ``bench/runs/plan-table.jsonl`` (commit, machine, the request, the verdict with
its limit rule, the pool sizes) and prints the Markdown table: "fits (KV GB)" or the rule that
stops it. Nothing here is timed for a claim: the plan is deterministic, the seconds are only
how long planning took.

    python -m bench.capacity.plan_table              # the issue's table (6 models x 2 x 3 x 3)
    python -m bench.capacity.plan_table --models qwen3.5-9b --devices p150 --batches 16
    python -m bench.capacity.plan_table --agents 8 --context 131072 \
        --devices p150 p300 p150x4 p150x8
    python -m bench.capacity.plan_table --models qwen3.6-27b \
        --devices t3k t3k:2x4 galaxy --batches 1 32
    python -m bench.capacity.plan_table --checker both  # and tt-metal's verdict on a mock box

With ``--checker both`` a cell gives both verdicts, "**DISAGREE**" where they differ. One
difference is explained in the row instead: the virtual plan refused while sizing its own KV pool
(it keeps 2% of DRAM free) and tt-metal accepted the small probe pool it was given; then the
virtual device is asked about that same pool (``virtual_same_pool_ok``), and where it accepts
too, the refusal was the margin, not a rule.

With ``--agents N --context T`` it answers the production question instead: N concurrent agents
each holding T tokens of history, prefix caching on (a KV pool of N x T tokens, two snapshot
slots per agent: its history's last boundary and the one being written), on which device of
``--devices`` (smallest first) and in which precision of ``--precisions`` (lightest
compression first) each model fits; one ledger line per plan tried.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.provenance import REPO_ROOT, git_info, machine_info
from tt_serve.config import PRECISIONS, parse_mesh
from tt_serve.model.published import SIZES, published_config
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.boards import device_spec
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.plan import planner

MODELS = (
    "qwen3.5-0.8b",
    "qwen3.5-2b",
    "qwen3.5-4b",
    "qwen3.5-9b",
    "qwen3.6-27b",
    "qwen3.6-35b-a3b",
)
DEVICES = ("n150", "p150")
BATCHES = (1, 16, 32)
PROFILES = tuple(p for p in PRECISIONS if p != "auto")
LEDGER = REPO_ROOT / "bench" / "runs" / "plan-table.jsonl"


def plan_one(
    model: str, device: str, batch: int, precision: str, checker: str = "virtual", **shape: int
) -> dict[str, Any]:
    """One plan; ``shape``: further TTOptions fields (max_model_len, kv_blocks, ...).
    ``device`` may name a mesh shape the device opens as: ``t3k:2x4``. ``checker`` "both":
    tt-metal's verdict on a mock box too (``plan/mock.py``), in ``mock_*`` fields, with
    ``agree`` saying whether the two verdicts are the same."""
    config = dict(published_config(model))
    spec = ModelSpec.from_config(config, model_id=model)
    name, _, shape_text = device.partition(":")
    mesh = parse_mesh(shape_text) if shape_text else None
    if shape_text and mesh is None:
        raise SystemExit(f"plan_table: {device!r}: the mesh must be ROWSxCOLS, e.g. t3k:2x4")
    board = device_spec(name)
    req = TTOptions(precision=precision, max_batch_size=batch, mesh=mesh, **shape)
    start = time.perf_counter()
    p = planner.plan(spec, board, req)
    mock_fields: dict[str, Any] = {}
    if checker == "both":
        from tt_serve.model.tt.plan import mock
        from tt_serve.model.tt.plan.report import mock_options

        blocks = p.kv_blocks or planner.probe_blocks(req)
        v = mock.check(config, board.name, mock_options(req, p), blocks)
        if v.ok and not p.ok and p.kv_blocks == 0:
            # The virtual plan refused while sizing its own pool (it keeps SAFETY_FRACTION of
            # DRAM free) and tt-metal ran the probe pool: the virtual device's verdict on that
            # same pool tells a rule apart from the margin.
            same = planner.plan(spec, board, req.replace(kv_blocks=blocks))
            mock_fields["virtual_same_pool_ok"] = same.ok
        mock_fields |= {
            "mock_checker": v.checker,
            "mock_ok": v.ok,
            "mock_where": v.where,
            "mock_phase": v.phase,
            "mock_message": v.message.splitlines()[-1][:400] if v.message else "",
            "mock_ops": v.ops,
            "mock_kv_blocks": blocks,
            "mock_dram_after": v.dram_after,
            "mock_dram_bank_bytes": v.dram_bank_bytes,
            "mock_seconds": v.seconds,
            "agree": v.ok == p.ok,
            "eager": v.eager,
            "traces": v.traces,
        }
    return {
        "model": model,
        "request": {"device": name, **req.to_json()},
        "ok": p.ok,
        "limit_rule": p.limit_rule,
        "weights_bytes": sum(p.weights.values()),
        "kv_bytes": p.kv_bytes,
        "kv_blocks": p.kv_blocks,
        "kv_tokens": p.kv_tokens,
        "snapshot_bytes": p.snapshot_bytes,
        "state_bytes": p.state_bytes,
        "trace_needed": p.trace_needed,
        "trace_region": p.trace_configured,
        "dram_left": p.dram_left,
        "max_context": p.max_context,
        "plan_seconds": round(time.perf_counter() - start, 2),
        **mock_fields,
    }


def cell(row: dict[str, Any]) -> str:
    text = f"fits (KV {row['kv_bytes'] / 1e9:.1f} GB)" if row["ok"] else f"`{row['limit_rule']}`"
    if "mock_ok" not in row:
        return text
    said = "fits" if row["mock_ok"] else f"`{row['mock_where'] or 'refused'}`"
    if row["agree"]:
        return f"{text} / tt-metal: {said}"
    if row.get("virtual_same_pool_ok"):  # the plan's 2% margin, not a rule: explained
        return f"{text} / tt-metal: {said} (both fit the same {row['mock_kv_blocks']}-block pool)"
    return f"{text} / tt-metal: {said} **DISAGREE**"


def table(rows: Sequence[dict[str, Any]], batches: Sequence[int]) -> list[str]:
    head = "| model | device | precision | weights | " + " | ".join(f"b={b}" for b in batches)
    out = [head + " |", "|---" * (4 + len(batches)) + "|"]
    keys: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        q = r["request"]
        mesh = q.get("mesh")
        device = q["device"] + (f":{mesh[0]}x{mesh[1]}" if mesh else "")
        keys.setdefault((r["model"], device, q["precision"]), {})[q["max_batch_size"]] = r
    for (model, device, precision), by_batch in keys.items():
        weights = next(iter(by_batch.values()))["weights_bytes"] / 1e9
        cells = [cell(by_batch[b]) if b in by_batch else "-" for b in batches]
        out.append(
            f"| {model} | {device} | {precision} | {weights:.2f} GB | " + " | ".join(cells) + " |"
        )
    return out


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    q = row["request"]
    mesh = tuple(q["mesh"]) if q.get("mesh") else None
    return (row["model"], q["device"], mesh, q["precision"], q["max_batch_size"], q["kv_blocks"])


def _blocks(row: dict[str, Any]) -> int:
    """The KV pool in blocks (older ledger lines have only its tokens: blocks - 1 of them)."""
    return int(row.get("kv_blocks") or row["kv_tokens"] // row["request"]["block_size"] + 1)


def compare(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> list[str]:
    """Row by row, each plan of ``new`` beside the last plan of the same request in ``old``:
    the verdict, the KV pool and the DRAM left, and the 2% margin the plan means to keep."""
    from tt_serve.model.tt.boards import device_spec
    from tt_serve.model.tt.plan.planner import SAFETY_FRACTION

    before = {_key(r): r for r in old}
    out = [
        "| model | device | precision | batch | verdict (old -> new) | KV blocks | DRAM left, MB | "
        "margin, MB | old commit |",
        "|---" * 9 + "|",
    ]
    for r in new:
        q, o = r["request"], before.get(_key(r))
        margin = SAFETY_FRACTION * device_spec(q["device"]).chip.dram_bytes / 1e6

        def verdict(x: dict[str, Any]) -> str:
            return "fits" if x["ok"] else str(x["limit_rule"])

        if o is None:
            was, blocks, left, commit = "-", "-", "-", "-"
        else:
            was, commit = verdict(o), o["git"]["commit"][:7]
            blocks = f"{_blocks(o)} -> {_blocks(r)}" if o["ok"] and r["ok"] else "-"
            left = (
                f"{o['dram_left'] / 1e6:.1f} -> {r['dram_left'] / 1e6:.1f}"
                if blocks != "-"
                else "-"
            )
        out.append(
            f"| {r['model']} | {q['device']} | {q['precision']} | {q['max_batch_size']} | "
            f"{was} -> {verdict(r)} | {blocks} | {left} | {margin:.1f} | {commit} |"
        )
    return out


def agents_shape(agents: int, context: int, block: int) -> dict[str, int]:
    """The TTOptions fields of ``agents`` agents holding ``context`` tokens each."""
    return {
        "max_model_len": context,
        "kv_blocks": agents * -(-context // block) + 1,  # + the padding block
        "snapshot_slots": 2 * agents,
    }


def smallest_fit(
    model: str,
    agents: int,
    context: int,
    devices: Sequence[str],
    precisions: Sequence[str],
    write: Any,
) -> dict[str, Any] | None:
    """The first (device, precision) holding the agents, devices outer (smallest box first)."""
    shape = agents_shape(agents, context, TTOptions().block_size)
    for device in devices:
        for precision in precisions:
            row = plan_one(model, device, agents, precision, **shape)
            row["agents"], row["context"] = agents, context
            write(row)
            print(f"{model} {agents}x{context} {device} {precision}: {cell(row)}", flush=True)
            if row["ok"]:
                return row
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.capacity.plan_table", description=__doc__)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=sorted(SIZES))
    ap.add_argument("--devices", nargs="+", default=list(DEVICES))
    ap.add_argument("--batches", nargs="+", type=int, default=list(BATCHES))
    ap.add_argument("--precisions", nargs="+", default=list(PROFILES), choices=PROFILES)
    ap.add_argument("--agents", type=int, default=0, help="concurrent agents (production mode)")
    ap.add_argument("--context", type=int, default=131072, help="tokens of history per agent")
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    ap.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("OLD", "NEW"),
        help="print NEW's plans beside OLD's for the same requests (two ledgers), plan nothing",
    )
    ap.add_argument(
        "--checker",
        choices=("virtual", "both"),
        default="virtual",
        help="both: each plan also run by tt-metal 0.81.1 on a mock box (needs the ttnn venv)",
    )
    a = ap.parse_args(argv)
    if a.compare:
        old, new = ([json.loads(line) for line in p.open()] for p in a.compare)
        print("\n".join(compare(old, new)))
        return 0
    provenance = {"git": git_info(), "machine": machine_info(), "timestamp": time.time()}
    rows = []
    a.ledger.parent.mkdir(parents=True, exist_ok=True)
    if a.agents:
        with a.ledger.open("a") as ledger:

            def write(row: dict[str, Any]) -> None:
                ledger.write(json.dumps({"bench": "plan_table", **provenance, **row}) + "\n")
                ledger.flush()

            print(f"| model | {a.agents} agents x {a.context} tokens |\n|---|---|")
            verdicts = []
            for model in a.models:
                fit = smallest_fit(model, a.agents, a.context, a.devices, a.precisions, write)
                where = (
                    f"{fit['request']['device']}, {fit['request']['precision']} "
                    f"(KV {fit['kv_bytes'] / 1e9:.1f} GB per chip)"
                    if fit
                    else "none of " + ", ".join(a.devices)
                )
                verdicts.append(f"| {model} | {where} |")
            print("\n".join(verdicts))
        return 0
    with a.ledger.open("a") as ledger:
        for model in a.models:
            for device in a.devices:
                for precision in a.precisions:
                    for batch in a.batches:
                        row = plan_one(model, device, batch, precision, a.checker)
                        rows.append(row)
                        line = {"bench": "plan_table", **provenance, **row}
                        ledger.write(json.dumps(line) + "\n")
                        ledger.flush()
                        print(f"{model} {device} {precision} b={batch}: {cell(row)}", flush=True)
    print("\n".join(table(rows, a.batches)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
