"""PNG charts from a ledger: per phase, each arm's TTFT p50 and makespan (bar = median over
rounds, whiskers = min..max over rounds) and its prefix-cache hit rate (N/A arms are left out).

    python -m bench.load.plot bench/runs/prefix-cache.jsonl --out bench/out/prefix-cache.png
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.load.ledger import read_ledger

DEFAULT_OUT = Path("bench/out")


def series(lines: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """phase -> arm label -> {"ttft_p50": [...], "makespan": [...], "hit_rate": [...]}."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for line in lines:
        for arm, phases in line["results"].items():
            label = f"{arm}: {line['arms'][arm].get('label', arm)}"
            for phase, res in phases.items():
                s = out.setdefault(phase, {}).setdefault(
                    label, {"ttft_p50": [], "makespan": [], "hit_rate": []}
                )
                ttft = res["metrics"]["ttft_s"]["p50"]
                if ttft is not None:
                    s["ttft_p50"].append(float(ttft))
                s["makespan"].append(float(res["metrics"]["makespan_s"]))
                if res.get("hit_rate") is not None:
                    s["hit_rate"].append(float(res["hit_rate"]))
    return out


def plot(lines: list[dict[str, Any]], out: Path, title: str = "") -> Path:
    """Write the chart; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(lines)
    if not data:
        raise ValueError("the ledger has no results")
    cols = (("ttft_p50", "TTFT p50 (s)"), ("makespan", "makespan (s)"), ("hit_rate", "hit rate"))
    fig, axes = plt.subplots(
        len(data), len(cols), figsize=(4.2 * len(cols), 3.0 * len(data)), squeeze=False
    )
    for row, (phase, arms) in enumerate(sorted(data.items())):
        labels = sorted(arms)
        for col, (key, name) in enumerate(cols):
            ax = axes[row][col]
            meds, lo, hi = [], [], []
            for label in labels:
                vals = arms[label][key]
                m = statistics.median(vals) if vals else 0.0
                meds.append(m)
                lo.append(m - min(vals) if vals else 0.0)
                hi.append(max(vals) - m if vals else 0.0)
            ax.bar(range(len(labels)), meds, yerr=[lo, hi], capsize=4, color=["C0", "C1"])
            ax.set_xticks(range(len(labels)), labels)
            ax.set_title(f"{phase}: {name}", fontsize=9)
            if key == "hit_rate":
                ax.set_ylim(0, 1)
                for i, label in enumerate(labels):
                    if not arms[label][key]:
                        ax.text(i, 0.02, "N/A", ha="center")
    rounds = len(lines)
    fig.suptitle(f"{title} ({rounds} round{'s' if rounds != 1 else ''}; whiskers: min..max)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load.plot")
    p.add_argument("ledger")
    p.add_argument("--out", default=None, help="PNG path (default bench/out/<ledger>.png)")
    a = p.parse_args(argv)
    lines = read_ledger(a.ledger)
    out = Path(a.out) if a.out else DEFAULT_OUT / f"{Path(a.ledger).stem}.png"
    print(plot(lines, out, title=Path(a.ledger).stem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
