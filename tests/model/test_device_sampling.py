"""Device sampling on the torch backend: every draw equals the host reference
(``engine.sampler.draw``) for the same logits and uniform, the draws follow the host sampler's
distribution, and through the engine a seeded request gets the same tokens on either path,
alone or in any batch, synchronous or pipelined (deviceResident, the CPU twin of the CUDA-graph
path) with grammar-constrained and penalised rows among the drawn ones."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.drive import run_all
from tests.engine.test_grammar_rows import bitmask_of
from tests.model import driver as d
from tt_serve import LLM
from tt_serve.engine import sampler
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.model import draw as model_draw
from tt_serve.model.interface import RowSampling
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.torch.outputs import greedy_ids
from tt_serve.model.torch.sampling import draw_rows, largest
from tt_serve.sequence import SamplingParams

SETTINGS: list[dict[str, Any]] = [
    dict(temperature=0.7),
    dict(temperature=1.0),
    dict(temperature=1.0, top_k=20),
    dict(temperature=0.7, top_p=0.8),
    dict(temperature=1.0, top_p=0.95),
    dict(temperature=0.7, top_k=20, top_p=0.9),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=1.5, top_k=50, top_p=0.5, min_p=0.05),
    dict(temperature=1.0, top_k=1),
]


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize(
    "setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_draws_equal_the_host_reference(setting: dict[str, Any], sync_free: bool) -> None:
    """Token for token, on a vocabulary large enough for the top-p candidate search (5,000 >
    2 x 1,024) and with rounded logits (ties at the k-th value and inside the nucleus)."""
    rng = np.random.default_rng(7)
    n = 0
    for trial in range(12):
        logits = (rng.standard_normal((8, 5000)) * rng.uniform(0.5, 4.0)).astype(np.float32)
        if trial % 3 == 0:
            logits = np.round(logits, 1)
        specs = [RowSampling(**setting, uniform=float(rng.random())) for _ in range(8)]
        got = draw_rows(torch.from_numpy(logits), specs, sync_free=sync_free).tolist()
        assert got == [sampler.draw(logits[i], specs[i]) for i in range(8)]
        n += 8
    assert n == 96


def test_bf16_ties_at_the_kth_value_stay_on_the_candidate_path() -> None:
    """Logits rounded to bf16 over a Qwen-size vocabulary tie at the k-th value for most rows;
    the ties fit in TIE_ROOM extra candidates, so the rows are drawn there (not over the whole
    vocabulary), with the kept set's ties included: the host reference's token every time."""
    from tt_serve.model.torch import sampling as rs

    rng = np.random.default_rng(11)
    logits = torch.from_numpy(rng.standard_normal((16, 248320)).astype(np.float32) * 2.0)
    logits = logits.bfloat16().float()
    specs = [RowSampling(0.7, top_k=20, top_p=0.9, uniform=float(rng.random())) for _ in range(16)]
    top = logits.topk(21, dim=-1).values
    assert (top[:, 20] == top[:, 19]).sum() >= 4, "the fixture must tie at the k-th value"
    fast, _, _ = rs._untied_topk(logits, specs)
    assert fast == list(range(16))  # every row on the candidate path
    got = draw_rows(logits, specs).tolist()
    assert got == [sampler.draw(logits[i].numpy(), specs[i]) for i in range(16)]


def test_top_p_falls_back_to_the_whole_vocabulary() -> None:
    """A flat distribution whose nucleus is wider than both candidate counts (16,384 tokens)."""
    logits = np.zeros((2, 40000), dtype=np.float32)
    logits[:, ::7] = 0.01
    specs = [RowSampling(1.0, top_p=0.9, uniform=u) for u in (0.1, 0.97)]
    got = draw_rows(torch.from_numpy(logits), specs).tolist()
    assert got == [sampler.draw(logits[i], specs[i]) for i in range(2)]


def _chi_square_z(counts: np.ndarray, probs: np.ndarray) -> float:
    """Wilson-Hilferty z of Pearson's statistic (about N(0, 1) when ``counts`` follow
    ``probs``), over cells expecting >= 5 draws."""
    n = counts.sum()
    expect = probs * n
    cells = expect >= 5
    stat = float(((counts[cells] - expect[cells]) ** 2 / expect[cells]).sum())
    dof = int(cells.sum()) - 1
    return ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))


@pytest.mark.slow
@pytest.mark.parametrize("setting", SETTINGS[:6], ids=lambda s: ",".join(map(str, s.values())))
def test_draw_frequencies_follow_the_host_distribution(
    dense_dir: Path, setting: dict[str, Any]
) -> None:
    """6,000 device draws from the tiny model's next-token logits vs the probabilities the host
    sampler's rules give: chi-square z < 4 (p ~ 3e-5; it is ~N(0, 1) when they agree)."""
    be = d.backend(dense_dir)
    logits = d.prefill_logits(be, 0, d.prompt(40, 3), [])[-1].numpy()  # next-token logits
    spec = RowSampling(**setting)
    ids, weights = model_draw._kept(logits.astype(np.float64) / spec.temperature, spec)
    probs = np.zeros(logits.shape[0])
    probs[ids] = weights / weights.sum()
    uniforms = np.random.default_rng(11).random(6000)
    specs = [RowSampling(**setting, uniform=float(u)) for u in uniforms]
    drawn = draw_rows(torch.from_numpy(np.tile(logits, (len(specs), 1))), specs).numpy()
    counts = np.bincount(drawn, minlength=logits.shape[0]).astype(np.float64)
    assert set(np.flatnonzero(counts)) <= set(ids.tolist())  # nothing outside the kept set
    assert _chi_square_z(counts, probs) < 4.0


# -- through the engine ------------------------------------------------------------------------

C, BS = 64, 16


def _llm(path: Path, **kw: Any) -> LLM:
    base: dict[str, Any] = dict(
        block_size=BS, prefill_chunk=C, kv_blocks=512, snapshot_slots=8, max_batch_size=8
    )
    return LLM(path, **{**base, **kw})


def _prompt(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(3, 4096) for _ in range(n)]


def _params(setting: dict[str, Any], seed: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=10, ignore_eos=True, seed=seed, **setting, **kw)


def test_device_and_host_paths_give_the_same_tokens(dense_dir: Path) -> None:
    """Seeded requests of every setting: device draws (ids only cross) equal host draws (the
    logits cross) token for token, and the engine reports which path picked them."""
    prompts = [_prompt(30 + 7 * i, i) for i in range(len(SETTINGS))]
    params = [_params(s, seed=100 + i) for i, s in enumerate(SETTINGS)]
    dev_llm, host_llm = _llm(dense_dir), _llm(dense_dir, device_sampling=False)
    dev = dev_llm.generate(prompts, params)
    host = host_llm.generate(prompts, params)
    assert [o.token_ids for o in dev] == [o.token_ids for o in host]
    assert all(o.picked_on_device == 10 and o.picked_on_host == 0 for o in dev)
    # top_k=1 is greedy: picked by argmax on either path
    assert all(o.picked_on_host == 10 for o in host[:-1]) and host[-1].picked_on_device == 10
    assert len({t for o in dev for t in o.token_ids}) > 40
    be = dev_llm.engine.backend
    assert isinstance(be, TorchBackend)
    hb = host_llm.engine.backend
    assert isinstance(hb, TorchBackend)
    assert be.host_bytes * 100 < hb.host_bytes  # ids only vs [vocab] fp32 per token


def test_seeded_request_is_the_same_in_any_batch(dense_dir: Path) -> None:
    m = _llm(dense_dir)
    p = _prompt(50, 1)
    sp = _params(dict(temperature=0.8, top_k=40, top_p=0.9), seed=5)
    alone = m.generate([p], sp)[0].token_ids
    others = [_prompt(20 + i, 50 + i) for i in range(5)]
    mix = [_params(SETTINGS[i], seed=i) for i in range(5)]
    batched = m.generate([*others[:2], p, *others[2:]], [*mix[:2], sp, *mix[2:]])
    assert batched[2].token_ids == alone
    assert m.generate([p], sp)[0].token_ids == alone  # and run to run


class _Allowed:
    """A grammar allowing one fixed set of tokens at every step."""

    def __init__(self, allowed: set[int], vocab: int) -> None:
        self.mask = bitmask_of(allowed, vocab)
        self.allowed = allowed

    def matcher(self) -> _Allowed:
        return self

    def fill_bitmask(self, out: np.ndarray) -> None:
        out[:] = self.mask

    def accept(self, token_id: int) -> bool:
        return token_id in self.allowed

    def error(self) -> str | None:
        return None


def _engine(be: TorchBackend, **sched: Any) -> Engine:
    # the burst prefills in lockstep unless a test says otherwise, so its decodes run back to
    # back (the pipelining these tests count)
    sched.setdefault("max_prefill_rows", 0)
    sc = SchedulerConfig(max_batch=8, max_num_batched_tokens=512, chunk=128, block_size=16, **sched)
    return Engine(
        be,
        EngineConfig(
            scheduler=sc,
            num_kv_blocks=400,
            num_snapshot_slots=8,
            max_model_len=1024,
            vocab_size=be.spec.vocab_size,
        ),
    )


def test_pipelined_sampled_batch_equals_synchronous(dense_dir: Path) -> None:
    """deviceResident (bucketed programs, eager on the CPU): a batch of seeded sampled requests
    runs ahead on drawn ids, with one grammar-constrained and one penalised row among them (both
    picked on the host, each sitting out the step after its own); tokens equal the synchronous
    engine's."""
    allowed = set(range(100, 200))
    reqs = [(_prompt(30 + i, 200 + i), _params(SETTINGS[i % 6], seed=300 + i)) for i in range(5)]
    reqs.append(
        (_prompt(33, 9), _params(dict(temperature=0.9), 7, grammar=_Allowed(allowed, 4096)))
    )
    reqs.append((_prompt(34, 8), _params(dict(temperature=0.9), 8, presence_penalty=1.5)))
    sync = run_all(_engine(TorchBackend.from_pretrained(dense_dir)), reqs)
    be = TorchBackend.from_pretrained(
        dense_dir, cuda_graphs=True, device_resident=True, max_model_len=1024
    )
    eng = _engine(be)
    piped = run_all(eng, reqs)
    assert [o.token_ids for o in piped] == [o.token_ids for o in sync]
    assert all(o.finish_reason == "length" for o in piped)
    assert set(piped[5].token_ids) <= allowed
    assert eng.num_pipelined_steps >= 5, eng.num_pipelined_steps  # drawn rows ran ahead
    assert be.static is not None and be.static.num_fed_rows > 0
    assert [o.picked_on_host for o in piped[5:]] == [10, 10]
    assert all(o.picked_on_device == 10 for o in piped[:5])


@pytest.mark.parametrize("vocab", [248_320, 151_936, 4096, 300])
def test_greedy_ids_are_argmax_ties_and_nan_included(vocab: int) -> None:
    """The sliced argmax gives argmax's ids: the first of tied maxima (in one slice, across
    slices, at the vocabulary's ends), NaN as the largest, all -inf, bf16-rounded ties."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(12, vocab, generator=g)
    x[1, [7, vocab - 1]] = 50.0  # a tie far apart: the first wins
    x[2, [vocab // 2, vocab // 2 + 1]] = 50.0  # a tie on neighbouring ids
    x[3, -1] = 60.0  # the very last id
    x[4, [3, vocab - 5]] = float("nan")  # NaN beats every number; the first NaN
    x[5] = float("-inf")
    x[6] = 1.0  # every entry tied
    x[7:] = x[7:].bfloat16().float()  # many ties at the top, as bf16 logits have
    assert torch.equal(greedy_ids(x), x.argmax(dim=-1))
    assert torch.equal(greedy_ids(x[3:4]), x[3:4].argmax(dim=-1))


@pytest.mark.parametrize("vocab", [248_320, 151_936, 4096])
def test_largest_gives_topk_values_with_ties_at_the_boundary(vocab: int) -> None:
    """The sliced top-n has topk's values (ties inside one slice, across slices, at the n-th
    place, a whole tied row, bf16-rounded logits), and each id holds its value."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(10, vocab, generator=g)
    x[1, :40] = 9.0  # many ties in the first slice, more than n
    x[2, torch.arange(0, vocab, vocab // 60)[:60]] = 9.0  # 60 ties spread over 60 slices
    x[3] = 1.0
    x[4:] = x[4:].bfloat16().float()
    for n in (1, 21, 53):
        want = x.topk(n, dim=-1).values
        vals, ids = largest(x, n)
        assert torch.equal(vals, want)
        assert torch.equal(x.gather(1, ids), vals)
        assert all(len(set(r)) == n for r in ids.tolist())
