"""Medians over rounds per measure and side, the tt-serve / peer ratio oriented so that > 1 always
means tt-serve is better, the greedy cross-check verdict, the foreign-load summary, and the
Markdown table."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from bench.peer.measures import Sizes

SIDES = ("tt", "peer")
NOISY_CORES = 0.25
"""A measure is flagged noisy when other work took this many cores on average during it."""


@dataclass(frozen=True)
class Row:
    measure: str
    key: str
    label: str
    unit: str
    """``tok/s``, ``s`` or empty (a plain ratio)."""
    better: str
    """``higher`` or ``lower``: which value is better."""


def rows(sizes: Sizes, measures: list[str]) -> list[Row]:
    """The table rows of the selected measures, in order."""
    s = sizes
    out: list[Row] = []
    if "prefix" in measures:
        tail = f"{s.prefix_head:,}-token head + {s.prefix_suffix}-token suffix"
        out += [
            Row("prefix", "warm_over_cold", f"prefix hit: warm / cold TTFT, {tail}", "", "lower"),
            Row("prefix", "cold_ttft", "prefix hit: cold TTFT", "s", "lower"),
            Row("prefix", "warm_ttft", "prefix hit: warm TTFT", "s", "lower"),
        ]
    if "prefill" in measures:
        out.append(
            Row("prefill", "tok_s", f"cold prefill, {s.prefill:,} tokens", "tok/s", "higher")
        )
    if "decode" in measures:
        label = f"decode, batch 1 ({s.decode_prompt} + {s.decode_tokens})"
        out.append(Row("decode", "tok_s", label, "tok/s", "higher"))
    for name, shape in (("c8", s.c8), ("c32", s.c32)):
        if name in measures:
            label = f"{shape.concurrency} concurrent × ({shape.prompt} + {shape.output})"
            out += [
                Row(name, "output_tok_s", label, "tok/s", "higher"),
                Row(name, "max_ttft", f"{label}: max TTFT", "s", "lower"),
            ]
    if "sampled" in measures:
        sh = s.sampled
        label = f"{sh.concurrency} concurrent × ({sh.prompt} + {sh.output})"
        out += [
            Row(
                "sampled",
                "sampled_tok_s",
                f"sampled T 0.7 top_p 0.9 top_k 20, {label}",
                "tok/s",
                "higher",
            ),
            Row("sampled", "greedy_tok_s", f"greedy, {label}", "tok/s", "higher"),
            Row("sampled", "sampled_over_greedy", "sampled / greedy tok/s", "", "higher"),
        ]
    if "long" in measures:
        for n in s.long:
            out += [
                Row(
                    "long",
                    f"{n}.cold_ttft",
                    f"long: cold TTFT, {n:,} + {s.long_suffix}",
                    "s",
                    "lower",
                ),
                Row("long", f"{n}.warm_ttft", f"long: warm TTFT, {n:,} head", "s", "lower"),
            ]
    return out


def ratio(tt: float | None, peer: float | None, better: str) -> float | None:
    """tt-serve's advantage: tt / peer for higher-is-better values, peer / tt for lower-is-better
    ones; > 1 means tt-serve is better. None when either side is missing or not positive."""
    if tt is None or peer is None or tt <= 0 or peer <= 0:
        return None
    if better == "higher":
        return tt / peer
    if better == "lower":
        return peer / tt
    raise ValueError(f"better must be 'higher' or 'lower', not {better!r}")


def values(rounds: list[dict[str, Any]], side: str, row: Row) -> list[float]:
    """One value per round where the measure succeeded on ``side``."""
    out = []
    for r in rounds:
        entry = r["sides"][side].get(row.measure) or {}
        v = (entry.get("metrics") or {}).get(row.key)
        if v is not None:
            out.append(float(v))
    return out


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def aggregate(rounds: list[dict[str, Any]], table_rows: list[Row]) -> list[dict[str, Any]]:
    """Per row: both sides' medians, ranges and counts over rounds, and the ratio of medians."""
    out = []
    for row in table_rows:
        item: dict[str, Any] = asdict(row)
        for side in SIDES:
            xs = values(rounds, side, row)
            item[side] = median(xs)
            item[f"{side}_range"] = [min(xs), max(xs)] if xs else None
            item[f"{side}_n"] = len(xs)
        item["ratio"] = ratio(item["tt"], item["peer"], row.better)
        out.append(item)
    return out


def compare_probes(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Greedy cross-check of two probes (``servers.Probe`` as dicts): ids identical? at how many
    steps is the top-k list (text, best first) the same? the largest |logprob| difference of the
    chosen token over the steps where both chose the same id."""
    ids_a, ids_b = a["ids"], b["ids"]
    steps = max(len(ids_a), len(ids_b))
    first_diff = next(
        (i for i in range(steps) if i >= min(len(ids_a), len(ids_b)) or ids_a[i] != ids_b[i]),
        None,
    )
    tops = sum(1 for x, y in zip(a["top"], b["top"], strict=False) if x and x == y)
    diffs = [
        abs(float(la) - float(lb))
        for ia, ib, la, lb in zip(ids_a, ids_b, a["logprobs"], b["logprobs"], strict=False)
        if ia == ib and la is not None and lb is not None
    ]
    return {
        "identical": first_diff is None and steps > 0,
        "steps": steps,
        "first_difference": first_diff,
        "top_order_equal": tops,
        "max_abs_logprob_diff": max(diffs) if diffs else None,
    }


def crosscheck_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    checks = [r["crosscheck"] for r in rounds if r.get("crosscheck")]
    return {
        "rounds": len(checks),
        "identical_rounds": sum(1 for c in checks if c["identical"]),
        "steps": max((c["steps"] for c in checks), default=0),
        "top_order_equal_min": min((c["top_order_equal"] for c in checks), default=None),
        "top_order_equal_max": max((c["top_order_equal"] for c in checks), default=None),
    }


def load_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest foreign load and steal per side, and every (round, side, measure) where other
    work took more than NOISY_CORES cores on average."""
    out: dict[str, Any] = {"noisy": []}
    for side in SIDES:
        foreign, steal = [], []
        for r in rounds:
            for name, entry in r["sides"][side].items():
                load = entry.get("load") or {}
                if load.get("foreign_cores") is not None:
                    foreign.append(load["foreign_cores"])
                    if load["foreign_cores"] > NOISY_CORES:
                        out["noisy"].append(
                            {
                                "round": r["round"],
                                "side": side,
                                "measure": name,
                                "foreign_cores": round(load["foreign_cores"], 3),
                            }
                        )
                if load.get("steal_s") is not None:
                    steal.append(load["steal_s"])
        out[side] = {
            "max_foreign_cores": max(foreign, default=None),
            "median_foreign_cores": median(foreign),
            "max_steal_s": max(steal, default=None),
        }
    return out


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "tok/s":
        return f"{v:,.0f} tok/s" if v >= 100 else f"{v:.1f} tok/s"
    if unit == "s":
        return f"{v:.3f} s"
    return f"{v:.3f}"


def _cell(item: dict[str, Any], side: str) -> str:
    text = fmt(item[side], item["unit"])
    rng = item[f"{side}_range"]
    if rng and item[f"{side}_n"] > 1:
        lo, hi = (fmt(x, item["unit"]).removesuffix(" tok/s").removesuffix(" s") for x in rng)
        text += f" ({lo}–{hi})"
    return text


def markdown(
    agg: list[dict[str, Any]],
    cross: dict[str, Any],
    load: dict[str, Any],
    peer_label: str = "llama.cpp",
) -> str:
    """The table (medians, with the range over rounds) and the cross-check and noise lines."""
    head = (
        f"| measure | better | tt-serve | {peer_label} | ratio (> 1: tt-serve better) | rounds |\n"
        "|---|---|---|---|---|---|\n"
    )
    lines = []
    for it in agg:
        r = "-" if it["ratio"] is None else f"{it['ratio']:.2f}×"
        n = f"{it['tt_n']} / {it['peer_n']}"
        lines.append(
            f"| {it['label']} | {it['better']} | {_cell(it, 'tt')} | {_cell(it, 'peer')} "
            f"| {r} | {n} |"
        )
    lo, hi = cross["top_order_equal_min"], cross["top_order_equal_max"]
    top = "-" if lo is None else (f"{lo}" if lo == hi else f"{lo}–{hi}")
    notes = [
        f"Greedy cross-check: token ids identical in {cross['identical_rounds']} of "
        f"{cross['rounds']} rounds; top-5 order equal at {top} of {cross['steps']} steps.",
    ]
    for side, name in (("tt", "tt-serve"), ("peer", peer_label)):
        s = load.get(side) or {}
        mx = s.get("max_foreign_cores")
        st = s.get("max_steal_s")
        notes.append(
            f"Foreign load during {name}'s measures: max "
            f"{'-' if mx is None else f'{mx:.2f}'} cores, max steal "
            f"{'-' if st is None else f'{st:.2f}'} s."
        )
    noisy = load.get("noisy") or []
    if noisy:
        bad = ", ".join(f"r{n['round']} {n['side']} {n['measure']}" for n in noisy[:12])
        more = f" and {len(noisy) - 12} more" if len(noisy) > 12 else ""
        notes.append(f"Noisy (> {NOISY_CORES} foreign cores): {bad}{more}.")
    return head + "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
