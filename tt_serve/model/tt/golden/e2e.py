"""End to end with golden math: the tt runtime on the virtual device, every op with a golden
computed by it (``GoldenTier`` in ``golden`` mode, trace replays included), against the torch
reference backend with the same weights.

One scenario drives both backends through the ``Backend`` protocol: a prompt prefilled in
chunks over a paged KV pool (last chunk's logits compared), a GDN snapshot saved after the
first chunk and restored into another slot that continues with other tokens over the shared
prefix blocks (logits compared), greedy decode of both rows batched (device argmax; ids
compared), a device-sampled step (``RowSampling``; ids compared) and a last decode step's logits.

Tolerance (``logits_bound``): two fp32 evaluations of the same math differ only by rounding
order; each step of the longest accumulation chain adds at most EPS relative error, and the
errors of independent orders add like a random walk, EPS·(FLOOR_ULPS + sqrt(n)) on the scale of
the largest logit. The chain crosses every layer's projections (a ``hidden``-long reduction) and
its MLP's down projection (``intermediate``, or the expert width plus the shared expert's), and
the LM head (``hidden``): n = layers·(hidden + mlp) + hidden. It depends on shapes only.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tt_serve.model.interface import RowSampling, StateCopy, StepBatch, StepRow
from tt_serve.model.spec import ModelSpec
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.tt.boards import ChipSpec
from tt_serve.model.tt.golden.formats import BlockFloatLedger
from tt_serve.model.tt.golden.tier import GoldenTier
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.ops import Ops
from tt_serve.model.tt.options import TTOptions
from tt_serve.model.tt.runtime.build import build_backend
from tt_serve.model.tt.virtual.device import P150, VirtualTTNN
from tt_serve.model.tt.virtual.mesh import VirtualMeshTTNN

EPS = 2.0**-23  # fp32 machine epsilon
FLOOR_ULPS = 4
BLOCK, CHUNK = 64, 128
TRACE_REGION = 64 << 20


def logits_bound(spec: ModelSpec, scale: float) -> float:
    """The largest |logit| difference two fp32 rounding orders may give (module docstring)."""
    if spec.num_experts:
        mlp = spec.moe_intermediate_size + spec.shared_expert_intermediate_size
    else:
        mlp = spec.intermediate_size
    n = spec.num_layers * (spec.hidden_size + mlp) + spec.hidden_size
    return EPS * (FLOOR_ULPS + math.sqrt(n)) * scale


@dataclass
class Result:
    """What one end-to-end run found."""

    max_logit_diff: float = 0.0
    max_logit: float = 0.0
    tolerance: float = 0.0
    greedy_equal: bool = True
    sampled_equal: bool = True
    tokens: list[int] = field(default_factory=list)
    ref_tokens: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.max_logit_diff <= self.tolerance and self.greedy_equal and self.sampled_equal

    def row(self) -> dict[str, Any]:
        return {
            "max_logit_diff": self.max_logit_diff,
            "max_logit": self.max_logit,
            "tolerance": self.tolerance,
            "greedy_equal": self.greedy_equal,
            "sampled_equal": self.sampled_equal,
            "ok": self.ok,
        }


def formats_kw(precision: str) -> dict[str, Any]:
    """The virtual device's formats mode (stored values rounded to their dtype) where this
    build has it; an empty dict where it does not (values stay fp32)."""
    params = inspect.signature(VirtualTTNN.__init__).parameters
    return {"card_formats": True} if "card_formats" in params and precision != "float32" else {}


@dataclass
class Harness:
    """A tt backend on a (mesh of) virtual chip(s) with the golden tier installed."""

    tier: GoldenTier
    ledger: BlockFloatLedger
    backend: Any
    fake: Any


def build(
    spec: ModelSpec,
    weights: dict[str, torch.Tensor],
    *,
    mode: str = "golden",
    mesh: int = 1,
    precision: str = "mixed",
    rounded: bool = False,
    chip: ChipSpec = P150,
) -> Harness:
    """The tt backend of ``spec`` on one chip or a 1 x ``mesh`` mesh (tensor parallel), the
    tier in ``mode``; ``rounded`` asks for the formats mode (``formats_kw``)."""
    kw = formats_kw(precision) if rounded else {}
    fake: Any
    if mesh == 1:
        fake = VirtualTTNN(require_sdpa_program_config=True, chip=chip, **kw)
        ops = Ops(fake)
        ops.open_device(0, trace_region_size=TRACE_REGION, l1_small_size=0)
        tp = TensorParallel(spec, 1)
    else:
        fake = VirtualMeshTTNN(num_devices=mesh, chip=chip, require_sdpa_program_config=True, **kw)
        ops = Ops(fake)
        ops.open_mesh((1, mesh), trace_region_size=TRACE_REGION, l1_small_size=0)
        tp = TensorParallel.for_mesh(spec, (1, mesh))
    tier, ledger = GoldenTier(mode), BlockFloatLedger()
    tier.install(fake)
    for chip in getattr(fake, "chips", [fake]):
        ledger.install(chip)
    options = TTOptions(precision=precision, prefill_chunk=CHUNK, traced_prefill=True)
    backend = build_backend(spec, weights, ops=ops, options=options, tp=tp)
    return Harness(tier, ledger, backend, fake)


def _prompt(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(3, vocab, (n,), generator=g)]


def run(
    spec: ModelSpec, weights: dict[str, torch.Tensor], backend: Any, *, steps: int = 8
) -> Result:
    """The scenario of the module docstring on ``backend`` and on ``TorchBackend``."""
    ref = TorchBackend(spec, weights)
    res = Result()
    runs = [_scenario(b, spec, steps) for b in (backend, ref)]
    (tt_logits, tt_ids), (ref_logits, ref_ids) = runs
    for a, b in zip(tt_logits, ref_logits, strict=True):
        res.max_logit_diff = max(res.max_logit_diff, float(np.abs(a - b).max()))
        res.max_logit = max(res.max_logit, float(np.abs(b).max()))
    res.tolerance = logits_bound(spec, res.max_logit)
    res.tokens, res.ref_tokens = tt_ids[:-1], ref_ids[:-1]
    res.greedy_equal = tt_ids[:-1] == ref_ids[:-1]
    res.sampled_equal = tt_ids[-1] == ref_ids[-1]
    return res


def _scenario(b: Any, spec: ModelSpec, steps: int) -> tuple[list[np.ndarray], list[int]]:
    b.allocate(num_kv_blocks=16, block_size=BLOCK, num_state_slots=2, num_snapshot_slots=2)
    vocab = spec.vocab_size
    p, alt = _prompt(200, 1, vocab), _prompt(72, 2, vocab)
    ta, tb = (1, 2, 3, 4), (1, 2, 5, 6)  # row B shares row A's first two blocks (the prefix)
    logits: list[np.ndarray] = []
    b.copy_states([StateCopy.reset(0), StateCopy.reset(1)])
    b.execute(StepBatch((StepRow(1, tuple(p[:CHUNK]), 0, ta, 0, False),)))
    b.copy_states([StateCopy.save(0, 0)])
    out = b.execute(StepBatch((StepRow(1, tuple(p[CHUNK:]), CHUNK, ta, 0, True, True),)))
    logits.append(out.logits[0])
    b.copy_states([StateCopy.restore(0, 1)])
    out = b.execute(StepBatch((StepRow(2, tuple(alt), CHUNK, tb, 1, True, True),)))
    logits.append(out.logits[0])
    nxt = [int(np.argmax(logits[0])), int(np.argmax(logits[1]))]
    ids: list[int] = []
    pos = [len(p), CHUNK + len(alt)]
    for _ in range(steps):  # batched greedy decode, device argmax
        rows = tuple(StepRow(s + 1, (nxt[s],), pos[s], (ta, tb)[s], s, True) for s in range(2))
        out = b.execute(StepBatch(rows))
        nxt = [int(t) for t in out.token_ids]
        ids.extend(nxt)
        pos = [x + 1 for x in pos]
    out = b.execute(StepBatch((StepRow(1, (nxt[0],), pos[0], ta, 0, True, True),)))
    logits.append(out.logits[0])
    sampling = RowSampling(temperature=0.8, top_k=20, top_p=0.9, uniform=0.37)
    out = b.execute(StepBatch((StepRow(2, (nxt[1],), pos[1], tb, 1, True, sampling=sampling),)))
    ids.append(int(out.token_ids[0]))
    return logits, ids
