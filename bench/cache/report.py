"""The prefix-cache A/B's four numbers, from a ledger, as a Markdown table.

Definitions (client-side TTFT, see bench/load/generator.py; "on"/"off" are the arm labels):

* warm/cold TTFT (``prefix4k`` phase): median TTFT of the on-arm requests that reported
  ``cached_tokens > 0`` over the median TTFT of the off-arm requests (a true cold control:
  caching disabled) on the same prompts. Target <= 0.05.
* makespan on/off (``agents`` phase). Target <= 0.15.
* cold-path cost (``nohead`` phase, all-miss): makespan on/off. Target <= 1.03.
* warm-tail speed over cold full-chunk speed (``prefix4k`` phase): median over warm on-arm
  requests of computed tokens per second of TTFT, (prompt_len - cached_tokens) / TTFT, over the
  median over off-arm requests of prompt_len / TTFT (a cold prompt of 4,096 + 64 tokens is 16
  full chunks and a 64-token tail, so this is the full-chunk rate). TTFT also includes one
  decode step and the HTTP round trip, which weigh far more on 64 tokens than on 4,160, so this
  ratio is a lower bound of the pure prefill rate ratio. Target >= 0.8.

For the two makespan rows the table also gives the ratio of the server processes' CPU seconds
over the phase (on/off), which a noisy shared machine disturbs much less than wall time.

Each number is computed per round (ledger line) that has the phase; the table shows the median
over rounds and the range.

    python -m bench.cache.report bench/runs/prefix-cache.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

from bench.load.ledger import read_ledger

Requests = list[dict[str, Any]]


def _arm(line: dict[str, Any], label: str) -> str | None:
    return next((k for k, v in line["arms"].items() if v.get("label") == label), None)


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _phase(line: dict[str, Any], label: str, phase: str) -> dict[str, Any] | None:
    arm = _arm(line, label)
    if arm is None:
        return None
    res: dict[str, Any] | None = line["results"].get(arm, {}).get(phase)
    return res


def _ok(reqs: Requests) -> Requests:
    return [r for r in reqs if r.get("error") is None and r.get("ttft")]


def warm_cold_ttft(on: dict[str, Any], off: dict[str, Any]) -> float | None:
    warm = _med([r["ttft"] for r in _ok(on["requests"]) if (r.get("cached_tokens") or 0) > 0])
    cold = _med([r["ttft"] for r in _ok(off["requests"])])
    return warm / cold if warm is not None and cold else None


def tail_speed(on: dict[str, Any], off: dict[str, Any]) -> float | None:
    warm = _med(
        [
            (r["prompt_len"] - r["cached_tokens"]) / r["ttft"]
            for r in _ok(on["requests"])
            if (r.get("cached_tokens") or 0) > 0
        ]
    )
    cold = _med([r["prompt_len"] / r["ttft"] for r in _ok(off["requests"])])
    return warm / cold if warm is not None and cold else None


def makespan_ratio(on: dict[str, Any], off: dict[str, Any]) -> float | None:
    if on["metrics"]["failed"] or off["metrics"]["failed"]:
        return None
    return float(on["metrics"]["makespan_s"]) / float(off["metrics"]["makespan_s"])


def cpu_ratio(on: dict[str, Any], off: dict[str, Any]) -> float | None:
    a, b = on.get("server_cpu_s"), off.get("server_cpu_s")
    return a / b if a is not None and b else None


Ratio = Callable[[dict[str, Any], dict[str, Any]], float | None]
TARGETS: list[tuple[str, str, Ratio, str, float]] = [
    ("warm/cold TTFT, 4,096 head + 64 suffix", "prefix4k", warm_cold_ttft, "<=", 0.05),
    ("makespan on/off, 8 agents x 3 turns, 2,048 head", "agents", makespan_ratio, "<=", 0.15),
    ("cold-path cost, nohead (all-miss) on/off", "nohead", makespan_ratio, "<=", 1.03),
    ("warm-tail / cold full-chunk tokens/s", "prefix4k", tail_speed, ">=", 0.8),
]


def ratios(lines: list[dict[str, Any]], on: str = "on", off: str = "off") -> list[dict[str, Any]]:
    """One row per target: per-round values, median, range, target, met."""
    rows = []
    for title, phase, fn, op, target in TARGETS:
        values, cpu = [], []
        for line in lines:
            a, b = _phase(line, on, phase), _phase(line, off, phase)
            if a is not None and b is not None:
                v, c = fn(a, b), cpu_ratio(a, b)
                if v is not None:
                    values.append(v)
                if c is not None and fn is makespan_ratio:
                    cpu.append(c)
        med = _med(values)
        met = None if med is None else (med <= target if op == "<=" else med >= target)
        rows.append(
            {
                "metric": title,
                "phase": phase,
                "values": values,
                "median": med,
                "cpu_median": _med(cpu),
                "target": f"{op} {target}",
                "met": met,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| metric | rounds | median | range | target | met | server CPU-s on/off |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vals = r["values"]
        rng = f"{min(vals):.3f} - {max(vals):.3f}" if vals else "N/A"
        med = f"{r['median']:.3f}" if r["median"] is not None else "N/A"
        met = {None: "N/A", True: "yes", False: "**no**"}[r["met"]]
        cpu = f"{r['cpu_median']:.3f}" if r["cpu_median"] is not None else "-"
        out.append(
            f"| {r['metric']} | {len(vals)} | {med} | {rng} | {r['target']} | {met} | {cpu} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cache.report")
    p.add_argument("ledger", nargs="+")
    p.add_argument("--on", default="on", help="label of the cache-on arm")
    p.add_argument("--off", default="off", help="label of the cache-off arm")
    a = p.parse_args(argv)
    lines = [line for path in a.ledger for line in read_ledger(path)]
    print(markdown(ratios(lines, a.on, a.off)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
