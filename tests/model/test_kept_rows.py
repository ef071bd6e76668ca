"""Only the tokens whose hidden states are read leave the stack (``HybridModel.run_layers``' keep).

The last layer of a step computes its output (attention queries or GDN output, MLP, final norm)
for the kept tokens alone; every token still writes its K/V and recurrent state. These tests
hold the kept rows to the every-token computation and the pools to bitwise equality.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests import tiny_models as tm
from tests.model import driver as d
from tt_serve.model.interface import StepBatch
from tt_serve.model.ref import attention as attn_mod
from tt_serve.model.ref.plan import StepPlan
from tt_serve.model.torch.backend import TorchBackend


@pytest.fixture(scope="module")
def gdn_last_dir(ckpt_root: Path) -> Path:
    """Three GDN layers and no attention: the last layer is a GDN one."""
    return tm.make_dense(ckpt_root / "gdn-last", seed=5, layers=3)


def _pools(be: TorchBackend) -> list[torch.Tensor]:
    p = be.pools
    assert p is not None
    return [*p.k, *p.v, *p.conv, *p.rec]


def _steps() -> list[StepBatch]:
    """Three steps: two fresh prefill chunks (one sampled), then a second chunk over history
    beside a chunk that is not sampled and a decode row."""
    a, b, c = d.prompt(70, seed=11), d.prompt(50, seed=12), d.prompt(20, seed=13)
    return [
        StepBatch((d.row(0, a[:40], 0), d.row(1, b[:30], 0, sample=False), d.row(2, c, 0))),
        StepBatch((d.row(0, a[40:], 40), d.row(1, b[30:], 30, sample=False), d.row(2, [5], 20))),
        StepBatch((d.row(0, [7], 70), d.row(1, [9], 50), d.row(2, [6], 21))),
    ]


def _kept(batch: StepBatch) -> list[int]:
    out, end = [], 0
    for r in batch.rows:
        end += r.num_tokens
        if r.sample:
            out.append(end - 1)
    return out


@pytest.mark.parametrize("name", ["dense_dir", "moe_dir", "next_dir", "gdn_last_dir"])
def test_kept_rows_equal_every_row(name: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(name)
    every, kept = d.backend(path), d.backend(path)
    for batch in _steps():
        keep = _kept(batch)
        with torch.no_grad():
            plan = StepPlan.build(batch, d.BLOCK, torch.device("cpu"))
            assert every.pools is not None and kept.pools is not None
            want = every.model.hidden_states(plan, every.pools)[keep]
            got = kept.model.hidden_states(plan, kept.pools, keep)
        assert got.shape == want.shape
        # Only the attention of a lone last query sums in another order (~1e-7 here).
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        for x, y in zip(_pools(every), _pools(kept), strict=True):
            assert torch.equal(x, y)


def test_unread_chunk_only_writes_its_kv(dense_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    chunk, last = attn_mod.attend_chunk, attn_mod.attend_last
    monkeypatch.setattr(attn_mod, "attend_chunk", lambda *a: calls.append("chunk") or chunk(*a))
    monkeypatch.setattr(attn_mod, "attend_last", lambda *a: calls.append("last") or last(*a))
    be = d.backend(dense_dir)
    p = d.prompt(60, seed=14)
    out = be.execute(StepBatch((d.row(0, p[:32], 0, sample=False),)))
    assert out.token_ids == [None] and calls == []
    out = be.execute(StepBatch((d.row(0, p[32:], 32),)))
    assert out.token_ids[0] is not None and calls == ["last"]
    # the logits path still attends with every query
    be.execute_all_logits(StepBatch((d.row(1, p, 0),)))
    assert calls == ["last", "chunk"]
