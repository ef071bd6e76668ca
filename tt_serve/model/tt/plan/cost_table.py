"""The measured output-quality cost of each precision profile, as ``tt-serve plan`` shows it.

The numbers are data, not code: ``bench/precision/cost.py --write-table`` measures them (each
profile on the virtual device with the card's storage formats, against the float32 reference, at
a published model's layer shapes) and writes ``tt_serve/model/precision_cost.json`` with its
provenance (commit, shape, layers, vocabulary, prompts, positions). This module only reads and
merges that file; a missing file or shape reads as "not measured".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE_PATH = Path(__file__).resolve().parent.parent / "precision_cost.json"
METRICS = ("greedy_equal_reference", "greedy_equal_bfloat16", "top1", "top5", "logprob_drift")


@dataclass(frozen=True)
class ProfileCost:
    """One profile's measured agreement with the float32 reference (fractions in [0, 1]) and
    drift of the reference token's logprob (nats)."""

    greedy_equal_reference: float
    greedy_equal_bfloat16: float | None
    top1: float
    top5: float
    drift_mean: float
    drift_p99: float
    drift_max: float

    @staticmethod
    def from_row(row: dict[str, Any]) -> ProfileCost:
        d = row["logprob_drift"]
        return ProfileCost(
            row["greedy_equal_reference"],
            row.get("greedy_equal_bfloat16"),
            row["top1"],
            row["top5"],
            d["mean"],
            d["p99"],
            d["max"],
        )


@dataclass(frozen=True)
class ShapeCosts:
    """The costs measured at one shape, and how they were measured."""

    shape: str
    provenance: dict[str, Any]
    profiles: dict[str, ProfileCost]


def load_table(path: Path = TABLE_PATH) -> dict[str, ShapeCosts]:
    """Every measured shape (lower-case published name) -> its costs; {} without the file."""
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {
        shape: ShapeCosts(
            shape,
            entry["provenance"],
            {p: ProfileCost.from_row(r) for p, r in entry["profiles"].items()},
        )
        for shape, entry in raw.items()
    }


def nearest(table: dict[str, ShapeCosts], shape: str, hidden: int) -> ShapeCosts | None:
    """The costs measured at ``shape``, else at the measured shape of the closest hidden size
    (the provenance says which), else None."""
    if shape.lower() in table:
        return table[shape.lower()]
    sized = [(abs(int(c.provenance.get("hidden", 0)) - hidden), s) for s, c in table.items()]
    return table[min(sized)[1]] if sized else None


def merge_shape(
    path: Path, shape: str, provenance: dict[str, Any], profiles: dict[str, dict[str, Any]]
) -> None:
    """Write ``shape``'s measurement into the table file, keeping the other shapes'."""
    raw = json.loads(path.read_text()) if path.exists() else {}
    keep = {p: {k: v for k, v in r.items() if k in METRICS} for p, r in profiles.items()}
    raw[shape.lower()] = {"provenance": provenance, "profiles": keep}
    path.write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
