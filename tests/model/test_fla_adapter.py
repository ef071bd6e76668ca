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


def _chunk_api(  # type: ignore[no-untyped-def]
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None
):
    """fla 0.6.0's ``chunk_gated_delta_rule`` signature, computed with the reference."""
    assert cu_seqlens is None and output_final_state and initial_state is not None
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    outs, states = [], []
    for b in range(q.shape[0]):
        o, s = chunk_gated_delta(
            q[b].float() * scale, k[b].float(), v[b].float(), g[b], beta[b], initial_state[b]
        )
        outs.append(o)
        states.append(s)
    return torch.stack(outs), torch.stack(states)


def _recurrent_api(  # type: ignore[no-untyped-def]
    q,
    k,
    v,
    g=None,
    gk=None,
    gv=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
):
    """fla 0.6.0's ``fused_recurrent_gated_delta_rule`` signature (g, gk, gv, beta: a beta
    passed fourth lands in gk), computed with the reference."""
    assert gk is None and gv is None, "a per-key or per-value gate was passed"
    assert g is not None and beta is not None and output_final_state
    assert q.shape[1] == 1 and cu_seqlens is None
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, s = recurrent_gated_delta_step(
        q[:, 0].float() * scale, k[:, 0].float(), v[:, 0].float(), g[:, 0], beta[:, 0],
        initial_state,
    )  # fmt: skip
    return o[:, None], s


def _linear_gates(q, k, v, g, beta, **kw):  # type: ignore[no-untyped-def]
    """A kernel that takes g as a decay factor instead of its log (a convention misread)."""
    return _chunk_api(q, k, v, g.exp(), beta, **kw)


def _nan(q, k, v, g, beta, **kw):  # type: ignore[no-untyped-def]
    o, s = _chunk_api(q, k, v, g, beta, **kw)
    return o * float("nan"), s


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
    for bad in (_linear_gates, _nan):
        wrong = fla.FlaKernels(bad, fns[1], dtype=torch.float32)
        worst = fla.self_check(wrong, chunk_gated_delta, recurrent_gated_delta_step, cpu)
        assert not worst <= fla.AGREEMENT, bad.__name__
    # at a layer's own head shapes (fla takes other paths past 64-wide heads)
    assert fla.self_check(f, chunk_gated_delta, recurrent_gated_delta_step, cpu, (2, 128, 128)) == 0


def test_only_cuda_uses_fla(fake_fla: types.ModuleType) -> None:
    refs = (chunk_gated_delta, recurrent_gated_delta_step)
    assert fla.kernels(torch.device("cpu"), torch.bfloat16, (2, 64, 64), *refs) is None
    w = GdnWeights.random(64, (1, 2, 64, 64), seed=3)
    assert gdn.fla_kernels(torch.zeros(1), w) is None


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
        monkeypatch.setattr(gdn, "fla_kernels", lambda x, w, use=use: f if use else None)
        conv, rec = torch.zeros(3, 256, 3), torch.zeros(3, 2, 64, 64)
        conv[1:], rec[1:] = 0.5, 0.01
        outs.append((gdn.gdn_forward(x, w, plan, conv, rec, fused=False), conv, rec))
    (a, ca, ra), (b, cb, rb) = outs
    assert calls.count("chunk") == 2 and calls.count("recurrent") == 1
    for p, q in ((a, b), (ca, cb), (ra, rb)):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
