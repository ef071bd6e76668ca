"""Computed tokens against the issue's bound, per turn and overall, and the Markdown tables.

The target (issue 37): from turn 2 on, every request computes at most ``1.1 x added + 64``
prompt tokens, where ``added`` = this prompt's tokens - the same agent's previous prompt's (the
previous answer as re-sent, the tool result, the template tokens around both). A cache that
resumes at the start of the previous answer's message, snapped down to a 64-token block,
computes ``added`` plus at most 63 tokens plus the part of the generation prompt it re-renders;
one that resumes only at multiples of a chunk C computes up to C - 1 more.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

import numpy as np

from bench.agent_replay.records import TurnRecord

SLACK = 1.1
FIXED = 64
NOISY_CORES = 0.25
"""A run is listed as noisy when other work took this many cores on average during it (the
computed tokens do not depend on it; TTFT and makespan do)."""


def bound(added: int) -> float:
    """The most a turn may compute: ``1.1 x added + 64``."""
    return SLACK * added + FIXED


def fill_added(records: list[TurnRecord]) -> None:
    """Set ``added`` on every turn after an agent's first whose both prompts are known."""
    by_agent: dict[int, dict[int, TurnRecord]] = {}
    for r in records:
        by_agent.setdefault(r.agent, {})[r.turn] = r
    for turns in by_agent.values():
        for t, r in turns.items():
            prev = turns.get(t - 1)
            if prev is not None and prev.prompt_tokens is not None and r.prompt_tokens is not None:
                r.added = r.prompt_tokens - prev.prompt_tokens


def within(r: TurnRecord) -> bool | None:
    """Whether a later turn met the bound; None for a first turn or an unmeasured one."""
    if r.added is None or r.computed is None:
        return None
    return r.computed <= bound(r.added)


def _pct(xs: list[float], p: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=float), p)) if xs else None


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def group_stats(recs: list[TurnRecord]) -> dict[str, Any]:
    """Stats of a group of requests (one turn, or all turns from 2 on)."""
    ok = [r for r in recs if r.ok]
    computed = [float(r.computed) for r in ok if r.computed is not None]
    added = [float(r.added) for r in ok if r.added is not None]
    verdicts = [v for v in (within(r) for r in ok) if v is not None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    return {
        "requests": len(recs),
        "failed": len(recs) - len(ok),
        "prompt_p50": _median([float(r.prompt_tokens) for r in ok if r.prompt_tokens is not None]),
        "cached_p50": _median([float(r.cached_tokens) for r in ok if r.cached_tokens is not None]),
        "computed_p50": _median(computed),
        "computed_max": max(computed, default=None),
        "added_p50": _median(added),
        "bound_p50": None if not added else bound(int(statistics.median(added))),
        "within": len([v for v in verdicts if v]),
        "judged": len(verdicts),
        "within_frac": (sum(verdicts) / len(verdicts)) if verdicts else None,
        "excess_max": max(
            (
                float(r.computed) - bound(r.added)
                for r in ok
                if r.added is not None and r.computed is not None
            ),
            default=None,
        ),
        "ttft_p50": _pct(ttft, 50),
        "ttft_p99": _pct(ttft, 99),
    }


def summarize(records: list[TurnRecord], makespan: float) -> dict[str, Any]:
    """Per turn and overall (turns >= 2) stats, the makespan, client-render checks, and every
    request's record."""
    fill_added(records)
    turns = sorted({r.turn for r in records})
    later = [r for r in records if r.turn >= 2]
    ok = [r for r in records if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    changed = [r.rerender_changed for r in records if r.rerender_changed is not None]
    return {
        "per_turn": {str(t): group_stats([r for r in records if r.turn == t]) for t in turns},
        "later_turns": group_stats(later),
        "ttft_p50": _pct(ttft, 50),
        "ttft_p99": _pct(ttft, 99),
        "makespan_s": makespan,
        "requests": len(records),
        "failed": len(records) - len(ok),
        "render_mismatches": sum(
            1 for r in ok if r.prompt_tokens is not None and r.prompt_tokens != r.rendered_tokens
        ),
        "rerender_changed_frac": (sum(changed) / len(changed)) if changed else None,
        "errors": sorted({r.error for r in records if r.error})[:5],
        "records": [{**asdict(r), "computed": r.computed} for r in records],
    }


def _n(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _frac(s: dict[str, Any]) -> str:
    if not s["judged"]:
        return "-"
    return f"{s['within']}/{s['judged']} ({100 * s['within_frac']:.0f} %)"


def markdown(arms: dict[str, dict[str, Any]]) -> str:
    """Per (arm, turn) rows, then one overall row per arm."""
    head = (
        "| arm | turn | prompt p50 | cached p50 | computed p50 | computed max | added p50 "
        "| bound p50 | within bound | TTFT p50 | TTFT p99 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for arm, s in arms.items():
        for t, g in s["per_turn"].items():
            lines.append(
                f"| {arm} | {t} | {_n(g['prompt_p50'])} | {_n(g['cached_p50'])} "
                f"| {_n(g['computed_p50'])} | {_n(g['computed_max'])} | {_n(g['added_p50'])} "
                f"| {_n(g['bound_p50'])} | {_frac(g)} | {_s(g['ttft_p50'])} | {_s(g['ttft_p99'])} |"
            )
    over = (
        "| arm | within bound (turns >= 2) | computed p50 / max (turns >= 2) | added p50 "
        "| TTFT p50 / p99 (all) | makespan | failed |\n|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for arm, s in arms.items():
        g = s["later_turns"]
        rows.append(
            f"| {arm} | {_frac(g)} | {_n(g['computed_p50'])} / {_n(g['computed_max'])} "
            f"| {_n(g['added_p50'])} | {_s(s['ttft_p50'])} / {_s(s['ttft_p99'])} s "
            f"| {s['makespan_s']:.1f} s | {s['failed']} of {s['requests']} |"
        )
    foreign = {arm: (s.get("load") or {}).get("foreign_cores") for arm, s in arms.items()}
    noisy = [f"{arm} ({f:.2f})" for arm, f in foreign.items() if f is not None and f > NOISY_CORES]
    note = f"\nNoisy (> {NOISY_CORES} foreign cores): {', '.join(noisy)}.\n" if noisy else ""
    return head + "\n".join(lines) + "\n\n" + over + "\n".join(rows) + "\n" + note
