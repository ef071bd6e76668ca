"""``tt-serve check-numerics``: a published model cut to a few layers, run end to end with
golden math on the virtual device (one chip, or the device's mesh: tensor parallel with the CCL
goldens), every op also computed by our virtual math; prints the per-op table and the result
against the torch reference. Runs in the ttnn venv (Python 3.12 with ttnn 0.81.1 and torch).

Pass/fail, both bounds derived from shapes (see ``e2e.py`` for the logits):

* per op, the normwise relative difference between the golden and our math stays within
  EPS·(FLOOR_ULPS + sqrt(n)), n the longest accumulation chain one op has (the hidden or MLP
  width of a projection, or context·head_dim of attention and of the GDN state carried along
  the sequence); integer outputs (ids) must be equal;
* end to end, max |logit diff| within ``e2e.logits_bound``, greedy and sampled ids equal;
* every device tensor declared bfloat8_b / bfloat4_b holds representable values
  (``formats.py``), checked on a second build whose stored values the virtual device rounds to
  their dtypes (its formats mode, where this build has it; otherwise the command says so).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tt_serve.model.precision import PROFILES
from tt_serve.model.tt.golden.formats import mock_cluster_env

if TYPE_CHECKING:
    from tt_serve.model.spec import ModelSpec

DEFAULT_VOCAB = 8192  # the LM head only: no per-layer shape depends on it (248320 published)
DEFAULT_EXPERTS = 16  # MoE: the routed experts kept (256 published); top-k stays 8
CONTEXT = 210  # the scenario's longest sequence (e2e._scenario)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tt-serve check-numerics",
        description="Run a published model's first layers on the virtual device with ttnn's "
        "golden math (every op also by our own math) and compare with the torch backend. "
        "Needs the ttnn venv (scripts/setup-ttnn-venv).",
    )
    p.add_argument("--model", default="qwen3.5-0.8b", help="a published model name")
    p.add_argument("--layers", type=int, default=4, help="the first N layers (default 4)")
    p.add_argument("--device", default="p150", help="board: its chip, and its chips as a 1xN mesh")
    p.add_argument("--precision", default="mixed", choices=PROFILES, help="weight dtypes profile")
    p.add_argument(
        "--vocab", type=int, default=DEFAULT_VOCAB, help="LM head rows (published: 248320)"
    )
    p.add_argument("--experts", type=int, default=DEFAULT_EXPERTS, help="MoE: routed experts kept")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


def op_tolerance(spec: ModelSpec) -> float:
    """The largest normwise relative difference two fp32 evaluations of one op may show: the
    random-walk rounding bound EPS·(FLOOR_ULPS + sqrt(n)) of ``e2e.logits_bound``, n the longest
    chain one op accumulates (a projection's width, or attention and the GDN state along the
    scenario's context, CONTEXT positions of a head dim each)."""
    from tt_serve.model.tt.golden.e2e import EPS, FLOOR_ULPS

    mlp = spec.moe_intermediate_size if spec.num_experts else spec.intermediate_size
    n = max(spec.hidden_size, mlp, CONTEXT * max(spec.head_dim, spec.linear_key_head_dim))
    return EPS * (FLOOR_ULPS + math.sqrt(n))


def run_check(a: argparse.Namespace) -> dict[str, Any]:
    """The check as a JSON-able dict (``ok`` says whether it passed)."""
    mock_cluster_env()
    from tt_serve.model.tt.boards import device_spec
    from tt_serve.model.tt.golden import e2e
    from tt_serve.model.tt.golden.model import cut_spec, draw_weights

    board = device_spec(a.device)
    spec = cut_spec(a.model, layers=a.layers, vocab=a.vocab, experts=a.experts)
    weights = draw_weights(spec)
    h = e2e.build(spec, weights, mesh=board.num_chips, precision=a.precision, chip=board.chip)
    res = e2e.run(spec, weights, h.backend)
    tol = op_tolerance(spec)
    table = h.tier.table()
    for row in table:
        row["ok"] = row["golden"] is None or (
            row["max_rel"] <= tol and row["mismatches"] == 0 and row["checked"] == row["calls"]
        )
    # The math runs on fp32 values (the torch reference's); the formats check builds again
    # with stored values rounded to their dtypes, where this virtual device can.
    rounded = bool(e2e.formats_kw(a.precision))
    bad = []
    if rounded:
        hf = e2e.build(
            spec,
            weights,
            mesh=board.num_chips,
            precision=a.precision,
            chip=board.chip,
            rounded=True,
        )
        bad = hf.ledger.unrepresentable(hf.tier.ttnn)
    ok = res.ok and all(r["ok"] for r in table) and not bad
    return {
        "model": a.model,
        "layers": a.layers,
        "device": a.device,
        "chips": board.num_chips,
        "precision": a.precision,
        "vocab": a.vocab,
        "experts": spec.num_experts,
        "op_tolerance": tol,
        "ops": table,
        "no_golden": sorted(r["op"] for r in table if r["golden"] is None),
        "end_to_end": res.row() | {"tokens": res.tokens, "ref_tokens": res.ref_tokens},
        "formats": {
            "values_rounded": rounded,
            "block_float_tensors": len(h.ledger),
            "unrepresentable": bad,
        },
        "ok": ok,
    }


def render(out: dict[str, Any]) -> str:
    lines = [
        f"check-numerics {out['model']} ({out['layers']} layers, vocab {out['vocab']}) on "
        f"{out['device']} ({out['chips']} chip(s)), precision {out['precision']}",
        f"{'op':34s} {'calls':>6s} {'golden':>6s} {'max abs':>10s} {'max rel':>10s}",
    ]
    for r in out["ops"]:
        g = "yes" if r["golden"] else "no"
        if r["golden"] is None:
            lines.append(f"{r['op']:34s} {r['calls']:6d} {g:>6s} {'-':>10s} {'-':>10s}")
            continue
        flag = "" if r["ok"] else "  FAIL"
        lines.append(
            f"{r['op']:34s} {r['calls']:6d} {g:>6s} {r['max_abs']:10.3g} {r['max_rel']:10.3g}{flag}"
        )
    e = out["end_to_end"]
    lines += [
        f"per-op tolerance (relative): {out['op_tolerance']:.3g}",
        f"no golden in ttnn 0.81.1: {', '.join(out['no_golden']) or 'none'}",
        f"end to end vs torch reference: max |logit diff| {e['max_logit_diff']:.3g} "
        f"(max |logit| {e['max_logit']:.3g}, tolerance {e['tolerance']:.3g}), greedy equal: "
        f"{e['greedy_equal']}, sampled equal: {e['sampled_equal']}",
    ]
    f = out["formats"]
    if f["values_rounded"]:
        lines.append(
            f"block floats: {f['block_float_tensors']} tensors, "
            f"{len(f['unrepresentable'])} not representable"
        )
    else:
        lines.append(
            f"block floats: {f['block_float_tensors']} tensors declared; values are not rounded "
            "(this virtual device has no formats mode), so representability is not checked"
        )
    lines.append("OK" if out["ok"] else "FAILED")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    a = parser().parse_args(list(argv))
    out = run_check(a)
    print(json.dumps(out) if a.json else render(out))
    return 0 if out["ok"] else 1
