"""Host sampler cost per row and step, this tree's ``engine/sampler.py`` against a git revision's.

Both samplers run side by side in one process on the same float32 logits (a 248,320-entry
vocabulary, logit std 3 as the random-weight demo model gives, and a peaked shape like a trained
model's), interleaved over rounds, each setting timed as the median of ``--calls`` calls. The
revision's module is loaded from ``git show REV:tt_serve/engine/sampler.py`` into a temporary
file (nothing of it is kept). One ledger line goes to ``bench/runs/sampler-speed.jsonl``.

    python -m bench.kernels.sampler_speed --ref HEAD~1
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from bench.common.provenance import REPO_ROOT, append_ledger
from bench.common.timing import median_ms
from tt_serve.engine import sampler as current
from tt_serve.sequence import SamplingParams

VOCAB = 248320
SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "t1.0": SamplingParams(temperature=1.0),
    "t0.7-k20": SamplingParams(temperature=0.7, top_k=20),
    "t0.7-p0.9": SamplingParams(temperature=0.7, top_p=0.9),
    "t0.7-p0.9-k20": SamplingParams(temperature=0.7, top_p=0.9, top_k=20),
    "t1.0-minp0.05": SamplingParams(temperature=1.0, min_p=0.05),
}
LEDGER = REPO_ROOT / "bench" / "runs" / "sampler-speed.jsonl"


def load_revision(rev: str) -> ModuleType:
    src = subprocess.run(
        ["git", "show", f"{rev}:tt_serve/engine/sampler.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location("sampler_ref", fh.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    Path(fh.name).unlink()
    return module


def logits(kind: str) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3 if kind == "random" else 2, VOCAB)
    if kind == "peaked":
        x[rng.choice(VOCAB, 20, replace=False)] += rng.uniform(12, 18, 20)
    return x.astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kernels.sampler_speed", description=__doc__)
    ap.add_argument("--ref", default="HEAD~1", help="git revision of the reference sampler")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ledger", type=Path, default=LEDGER)
    a = ap.parse_args(argv)
    arms = {"ref": load_revision(a.ref), "this": current}
    results: dict[str, Any] = {}
    for kind in ("random", "peaked"):
        raw = logits(kind)
        for name, params in SETTINGS.items():
            samples: dict[str, list[float]] = {arm: [] for arm in arms}
            for r in range(a.rounds):
                order = list(arms) if r % 2 == 0 else list(reversed(arms))
                for arm in order:
                    mod = arms[arm]
                    rng = mod.make_rng(r)
                    samples[arm].append(
                        median_ms(
                            lambda m=mod, g=rng, x=raw, p=params: m.sample(x, p, g, [], []),
                            a.calls,
                        )
                    )
            ms = {arm: statistics.median(v) for arm, v in samples.items()}
            results[f"{kind}/{name}"] = {**ms, "speedup": ms["ref"] / ms["this"]}
            print(
                f"{kind:7s} {name:15s} ref {ms['ref']:7.2f} ms  this {ms['this']:7.2f} ms  "
                f"x{ms['ref'] / ms['this']:.1f}",
                flush=True,
            )
    append_ledger(
        a.ledger,
        "sampler_speed",
        params={"ref": a.ref, "calls": a.calls, "rounds": a.rounds, "vocab": VOCAB},
        results_ms_per_row=results,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
