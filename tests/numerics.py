"""Derived fp32 tolerances for tests that compare two evaluations of the same math.

Two correct fp32 evaluations of one value differ only by rounding. When they round in a different
order (another prefill split, batch size, bucket padding, BLAS kernel, CPU or thread count), each
of the n accumulations on the longest dependency chain adds a relative error of at most EPS; the
two orders make those errors independent, so the difference grows like a random walk,
EPS·sqrt(n), on the scale of the largest magnitude involved. FLOOR_ULPS ulps cover the last
roundings when n is small. These bounds depend only on shapes and on the values' own scale, never
on a number measured on one CPU, and stay orders of magnitude below what a real bug (a wrong
state, position, row or formula) does to the same values.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

EPS = 2.0**-23  # fp32 machine epsilon, torch.finfo(torch.float32).eps
FLOOR_ULPS = 4

# Upper bound on |logit| for the tiny test models (tests/tiny_models.py: the context-sensitive init
# gives logit std ≈ 3, largest seen 17). Only for tests that see logprobs but not logits;
# test_hf_parity checks every tiny model against it.
LOGIT_SCALE = 20.0


@dataclass(frozen=True)
class Dims:
    layers: int
    hidden: int
    vocab: int


def model_dims(path: Path) -> Dims:
    """Depth, width and vocabulary of a checkpoint folder (flat or release layout)."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    return Dims(text["num_hidden_layers"], text["hidden_size"], text["vocab_size"])


def reorder_bound(scale: float, n: int) -> float:
    """|a - b| for two fp32 evaluations, rounded in a different order, of a value of magnitude at
    most ``scale`` whose longest accumulation chain has ``n`` steps."""
    return EPS * (FLOOR_ULPS + math.sqrt(n)) * scale


def logits_bound(scale: float, dims: Dims) -> float:
    """Logits of a model evaluated in two orders: the chain crosses every layer's width-``hidden``
    reductions, n = layers·hidden (the layers' errors add like a random walk too).

    Against it, splitting a prefill off the chunk grid measured 0.17 (AMD EPYC) and 0.26 (Intel
    Xeon) of this bound on the 4-layer, hidden-256 test model (1.05e-5, 1.57e-5 at max|logit| 16).
    """
    return reorder_bound(scale, dims.layers * dims.hidden)


def softmax_rounding(vocab: int, lp_scale: float) -> float:
    """Rounding of an fp32 log_softmax over ``vocab`` entries: log S of a sum of ``vocab`` terms
    in [0, 1] (S ≥ 1, so EPS·sqrt(vocab) absolute), plus ulps of a result of size ``lp_scale``."""
    return EPS * (math.sqrt(vocab) + FLOOR_ULPS * max(1.0, lp_scale))


def logprob_bound(logit_bound: float, logit_scale: float, vocab: int) -> float:
    """Logprobs of logits that may differ by ``logit_bound``: lp_i = x_i - logsumexp(x) moves by at
    most 2·max|Δx| (logsumexp is 1-Lipschitz in the max norm), plus the log_softmax rounding
    (|lp| ≤ max x - min x ≤ 2·logit_scale)."""
    return 2 * logit_bound + softmax_rounding(vocab, 2 * logit_scale)
