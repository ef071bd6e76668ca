"""The flash-linear-attention adapter (``model/kernels/fla.py``) on the CPU.

fla's Triton kernels need a GPU, so here a stand-in module with fla's API (``[B, T, H, K]``
inputs, log-space gates, ``scale``, ``initial_state [B, H, K, V]``) computes with the reference
functions: that pins the adapter's layout and argument conventions and the GDN layer's
dispatch, and shows the self-check rejecting a kernel that reads a convention differently. On a
GPU the self-check compares the real kernels with the reference at first use
(``bench/gpu/side_by_side.sh`` reports whether fla ran)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import torch

from tt_serve.model.interface import StepBatch, StepRow
from tt_serve.model.kernels import fla
from tt_serve.model.ref import gdn
from tt_serve.model.ref.gdn import GdnWeights, chunk_gated_delta, recurrent_gated_delta_step
from tt_serve.model.ref.plan import StepPlan


def _chunk_api(q, k, v, g, beta, *, scale, initial_state, output_final_state):  # type: ignore[no-untyped-def]
    outs, states = [], []
    for b in range(q.shape[0]):
        o, s = chunk_gated_delta(
            q[b].float() * scale, k[b].float(), v[b].float(), g[b], beta[b], initial_state[b]
        )
        outs.append(o)
        states.append(s)
    assert output_final_state
    return torch.stack(outs), torch.stack(states)


def _recurrent_api(q, k, v, g, beta, *, scale, initial_state, output_final_state):  # type: ignore[no-untyped-def]
    assert q.shape[1] == 1 and output_final_state
    o, s = recurrent_gated_delta_step(
        q[:, 0].float() * scale, k[:, 0].float(), v[:, 0].float(), g[:, 0], beta[:, 0],
        initial_state,
    )  # fmt: skip
    return o[:, None], s


def _linear_gates(q, k, v, g, beta, **kw):  # type: ignore[no-untyped-def]
    """A kernel that takes g as a decay factor instead of its log (a convention misread)."""
    return _chunk_api(q, k, v, g.exp(), beta, **kw)


@pytest.fixture
def fake_fla() -> Iterator[types.ModuleType]:
    mod = types.ModuleType("fla.ops.gated_delta_rule")
    mod.chunk_gated_delta_rule = _chunk_api  # type: ignore[attr-defined]
    mod.fused_recurrent_gated_delta_rule = _recurrent_api  # type: ignore[attr-defined]
    names = ("fla", "fla.ops", "fla.ops.gated_delta_rule")
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update({"fla": types.ModuleType("fla"), "fla.ops": types.ModuleType("fla.ops")})
    sys.modules["fla.ops.gated_delta_rule"] = mod
    yield mod
    for n, m in saved.items():
        if m is None:
            sys.modules.pop(n, None)
        else:
            sys.modules[n] = m


def test_the_adapter_passes_fla_what_the_reference_takes(fake_fla: types.ModuleType) -> None:
    fns = fla._import()
    assert fns is not None
    f = fla.FlaKernels(*fns, dtype=torch.float32)
    cpu = torch.device("cpu")
    assert fla.self_check(f, chunk_gated_delta, recurrent_gated_delta_step, cpu) == 0.0
    wrong = fla.FlaKernels(_linear_gates, fns[1], dtype=torch.float32)
    worst = fla.self_check(wrong, chunk_gated_delta, recurrent_gated_delta_step, cpu)
    assert worst > fla.AGREEMENT


def test_only_cuda_uses_fla(fake_fla: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    refs = (chunk_gated_delta, recurrent_gated_delta_step)
    assert fla.kernels(torch.device("cpu"), torch.bfloat16, *refs) is None
    assert gdn.fla_kernels(torch.zeros(1)) is None


def test_the_gdn_layer_runs_its_spans_and_decode_rows_through_fla(
    fake_fla: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step with two prefill spans (one from a nonzero state) and a decode row: the layer
    through the adapter equals the torch kernels, state pools included."""
    fns = fla._import()
    assert fns is not None
    calls: list[str] = []

    def counted(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **kw):  # type: ignore[no-untyped-def]
            calls.append(name)
            return fn(*a, **kw)

        return wrapper

    f = fla.FlaKernels(counted("chunk", fns[0]), counted("recurrent", fns[1]), dtype=torch.float32)
    w = GdnWeights.random(64, (1, 2, 64, 64), seed=3)
    x = torch.randn(12, 64, generator=torch.Generator().manual_seed(4))
    rows = tuple(
        StepRow(seq, tuple(range(n)), start, tuple(range(4)), slot, sample=False)
        for seq, n, slot, start in ((0, 7, 0, 0), (1, 4, 1, 7), (2, 1, 2, 5))
    )
    plan = StepPlan.build(StepBatch(rows), 64, x.device)
    outs = []
    for use in (False, True):
        monkeypatch.setattr(gdn, "fla_kernels", lambda x, use=use: f if use else None)
        conv, rec = torch.zeros(3, 256, 3), torch.zeros(3, 2, 64, 64)
        conv[1:], rec[1:] = 0.5, 0.01
        outs.append((gdn.gdn_forward(x, w, plan, conv, rec, fused=False), conv, rec))
    (a, ca, ra), (b, cb, rb) = outs
    assert calls.count("chunk") == 2 and calls.count("recurrent") == 1
    for p, q in ((a, b), (ca, cb), (ra, rb)):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
