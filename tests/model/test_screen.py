"""The int8 screen of the LM head (``torch/screen.py``): its bound holds for every token, its picks
(argmax, top-k draws with top-p and min-p) are the full fp32 head's, a candidate's logit has the
same bits whatever shares the call, and the rows it cannot serve go back to the full head."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.model import driver as d
from tt_serve.model.interface import RowSampling, StepRow
from tt_serve.model.ref.layers import cpu_bf16
from tt_serve.model.torch import screen as sc
from tt_serve.model.torch.backend import TorchBackend
from tt_serve.model.torch.model import LmHead
from tt_serve.model.torch.outputs import pick_on_device, pick_screened, screens

pytestmark = pytest.mark.skipif(not sc.available(), reason="no exact int8 GEMM on this CPU")

# vocab 49,152 has 512-way slices (the sliced candidate search); 5,003 is prime (the plain one)
VOCABS = (49152, 5003)
# The fast loop (make test-fast) runs a few of the parameter sets below; make test runs them all.
SLOW = pytest.mark.slow
FAST_SHAPES = {(49152, 7), (5003, 33)}


def _head(vocab: int, hidden: int = 64, seed: int = 0) -> LmHead:
    g = torch.Generator().manual_seed(seed)
    return LmHead(torch.randn(vocab, hidden, generator=g) * hidden**-0.5)


def _rows(n: int, sampling: dict[str, float] | None, seed: int = 0) -> list[StepRow]:
    g = torch.Generator().manual_seed(seed)
    return [
        d.row(
            i,
            [1],
            1,
            sampling=None
            if sampling is None
            else RowSampling(uniform=float(torch.rand((), generator=g)), **sampling),  # type: ignore[arg-type]
        )
        for i in range(n)
    ]


def _every(s: sc.ScreenedHead, x: torch.Tensor, dots: bool = False) -> torch.Tensor:
    """Every exact logit (``_dots``: before a bf16 head's rounding) of rows x: [R, vocab]."""
    r, vocab = x.shape[0], s.weight.shape[0]
    at, cols = torch.arange(r).repeat_interleave(vocab), torch.arange(vocab).repeat(r)
    return (s._dots if dots else s._exact)(x, at, cols).reshape(r, vocab)


def _hidden(n: int, hidden: int = 64, seed: int = 1, outlier: float = 0.0) -> torch.Tensor:
    x = torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed))
    if outlier:
        x[0, 3] = outlier
    return x


@pytest.fixture(params=["native", "onednn"])
def gemv(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The int8 GEMV the screen runs: the C kernel where it is compiled and the head's shape
    blocks (vocab 49,152, rows <= NATIVE_ROWS), or oneDNN's everywhere."""
    if request.param == "onednn":
        monkeypatch.setattr(sc, "NATIVE_ROWS", 0)
    return str(request.param)


@pytest.mark.parametrize("vocab", [pytest.param(49152, marks=SLOW), 5003])
def test_bound_holds_for_every_token(vocab: int, gemv: str) -> None:
    head = _head(vocab)
    s = head.screened
    assert s is not None
    for x in (_hidden(5), _hidden(3, outlier=30.0), _hidden(1, seed=4) * 1e-3):
        approx, act, wgt = s._approx(x)
        exact = _every(s, x)
        gap = (exact.double() - approx.double()).abs()
        bound = s.token_bound(act, wgt)
        assert bool((gap <= bound).all()), float((gap - bound).max())
        assert bool((gap > 0).any())  # the int8 logits are approximate, the bound is not idle
        # each token's bound is at most the bound of the row's worst token (per-token norms)
        assert bool((bound <= (act * s.w_norm + wgt * s.err_norm)[:, None] * (1 + 1e-6)).all())


@pytest.mark.parametrize(
    ("vocab", "n"),
    [
        shape if shape in FAST_SHAPES else pytest.param(*shape, marks=SLOW)
        for shape in itertools.product(VOCABS, (1, 7, 33))
    ],
)
@pytest.mark.parametrize(
    "sampling",
    [
        None,
        dict(temperature=0.7, top_k=20, top_p=0.9),
        pytest.param(dict(temperature=1.0, top_k=1), marks=SLOW),
        pytest.param(dict(temperature=1.0, top_k=50, min_p=0.05), marks=SLOW),
        pytest.param(dict(temperature=1.5, top_k=5, top_p=0.5), marks=SLOW),
    ],
)
def test_picks_equal_the_full_head(
    vocab: int, n: int, sampling: dict[str, float] | None, gemv: str
) -> None:
    head = _head(vocab)
    assert head.screened is not None
    for seed in range(3):
        x, rows = _hidden(n, seed=seed), _rows(n, sampling, seed=seed)
        got = pick_screened(head.screened, x, rows)
        assert got is not None
        assert torch.equal(got, pick_on_device(head(x), rows))


@pytest.mark.parametrize("vocab", VOCABS)
def test_candidates_hold_every_token_of_the_top_n(vocab: int) -> None:
    """Rows of very different norms (a real head's are): each token is screened against its
    own bound, which still keeps every token that can be among the n largest, and keeps fewer
    than the bound of the head's largest row would."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(vocab, 64, generator=g) * 64**-0.5
    w *= torch.exp(torch.randn(vocab, 1, generator=g))  # norms over about e^±2
    head = LmHead(w)
    s = head.screened
    assert s is not None
    x = torch.randn(6, 64, generator=g)
    n = [1, 2, 5, 20, 50, 20]
    cands = s.candidates(x, n)
    assert cands is not None
    every = _every(s, x)
    approx, act, wgt = s._approx(x)
    start = narrowed = 0
    for r, count in enumerate(cands.counts):
        cols = cands.cols[start : start + count]
        start += count
        assert torch.equal(cands.vals[start - count : start], every[r, cols])
        nth = every[r].topk(n[r]).values[-1]
        assert bool(torch.isin(torch.nonzero(every[r] >= nth)[:, 0], cols).all())
        floor = float(every[r, cols].topk(n[r]).values[-1])
        worst = float(act[r] * s.w_norm + wgt[r] * s.err_norm)
        widest = int((approx[r].double() >= floor - worst).sum())
        assert count <= widest
        narrowed += widest - count
    assert narrowed > 0


def test_a_batch_of_greedy_and_drawn_rows_picks_each_row_as_alone() -> None:
    """Greedy rows and draws of different k, top-p and min-p share one call: each row's token
    is the full head's, and the same as when the row is picked alone."""
    head = _head(49152)
    s = head.screened
    assert s is not None
    kinds: list[dict[str, float] | None] = [
        None,
        dict(temperature=0.7, top_k=20, top_p=0.9),
        None,
        dict(temperature=1.0, top_k=3),
        dict(temperature=1.3, top_k=50, min_p=0.05),
    ]
    x = _hidden(len(kinds), seed=7)
    rows = [_rows(1, k, seed=n)[0] for n, k in enumerate(kinds)]
    got = pick_screened(s, x, rows)
    assert got is not None
    assert torch.equal(got, pick_on_device(head(x), rows))
    for n, r in enumerate(rows):
        assert torch.equal(got[n : n + 1], pick_screened(s, x[n : n + 1], [r]))


def test_ties_keep_the_first_maximum_and_the_tied_top_k() -> None:
    w = torch.randn(8192, 32, generator=torch.Generator().manual_seed(2)) * 0.1
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(3))
    for t in (4000, 77, 5000, 8191):  # one best row, copied to several tokens
        w[t] = x[0] * 0.5
    head = LmHead(w)
    assert head.screened is not None
    got = pick_screened(head.screened, x, _rows(3, None))
    assert got is not None and int(got[0]) == 77
    assert torch.equal(got, pick_on_device(head(x), _rows(3, None)))
    drawn = _rows(3, dict(temperature=1.0, top_k=2))  # the k-th value is tied 4 ways
    got = pick_screened(head.screened, x, drawn)
    assert got is not None and int(got[0]) in (77, 4000, 5000, 8191)
    assert torch.equal(got, pick_on_device(head(x), drawn))


def test_a_candidate_has_the_same_bits_whatever_shares_the_call() -> None:
    head = _head(49152)
    s = head.screened
    assert s is not None
    x = _hidden(9)
    alone = s.candidates(x[4:5], [20])
    batch = s.candidates(x, [1, 5, 20, 50, 20, 1, 3, 20, 7])
    assert alone is not None and batch is not None
    start = sum(batch.counts[:4])
    cols = batch.cols[start : start + batch.counts[4]]
    vals = batch.vals[start : start + batch.counts[4]]
    # Which tokens are candidates depends on the batch (one activation scale per call), a
    # candidate's logit does not.
    every = s._exact(x[4:5], torch.zeros(49152, dtype=torch.long), torch.arange(49152))
    assert torch.equal(every[cols], vals) and torch.equal(every[alone.cols], alone.vals)
    assert bool(torch.isin(cols, alone.cols).any())


def test_rows_with_too_many_candidates_get_every_logit(monkeypatch: pytest.MonkeyPatch) -> None:
    head = _head(49152)
    assert head.screened is not None
    monkeypatch.setattr(sc, "MAX_CANDIDATES", 3)
    x = _hidden(4, outlier=40.0)
    for sampling in (None, dict(temperature=0.7, top_k=20, top_p=0.9)):
        rows = _rows(4, sampling)
        cands = head.screened.candidates(x, [1 if sampling is None else 20] * 4)
        assert cands is not None and 49152 in cands.counts
        got = pick_screened(head.screened, x, rows)
        assert got is not None and torch.equal(got, pick_on_device(head(x), rows))


def test_non_finite_hidden_states_go_to_the_full_head() -> None:
    head = _head(5003)
    assert head.screened is not None
    x = _hidden(2)
    x[1, 0] = float("nan")
    assert pick_screened(head.screened, x, _rows(2, None)) is None


def test_which_rows_the_screen_serves() -> None:
    base = _rows(1, None)[0]
    drawn = _rows(1, dict(temperature=0.7, top_k=20))[0]
    full = _rows(1, dict(temperature=0.7, top_p=0.9))[0]  # needs every logit
    assert screens(base, 4096) and screens(drawn, 4096)
    assert not screens(full, 4096)
    assert not screens(_rows(1, dict(temperature=0.7, top_k=4096))[0], 4096)  # k >= vocab: all
    assert not screens(_rows(1, dict(temperature=0.7, top_k=sc.MAX_TOP_K + 1))[0], 10**6)
    from dataclasses import replace

    assert not screens(replace(base, top_logprobs=2), 4096)
    assert not screens(replace(base, want_logits=True), 4096)


def test_which_heads_are_screened() -> None:
    w = torch.randn(4096, 32)
    assert LmHead(w).screened is not None
    assert LmHead(w, screen=False).screened is None
    # bf16 where the CPU multiplies bf16 natively (elsewhere bf16 is not served on the CPU)
    assert (LmHead(w.to(torch.bfloat16)).screened is not None) == cpu_bf16()
    assert LmHead(w.double()).screened is None


@pytest.mark.skipif(not cpu_bf16(), reason="no native bf16 matmul on this CPU")
@pytest.mark.parametrize(
    "sampling", [None, dict(temperature=0.7, top_k=20, top_p=0.9), dict(temperature=1.0, top_k=3)]
)
def test_a_bf16_head_picks_what_its_gemm_picks(sampling: dict[str, float] | None) -> None:
    """bf16 logits are the GEMM's fp32 sums rounded to bf16; the screen rounds its exact
    logits the same way, so a token whose sum is a little smaller but rounds to the same bf16
    value wins as the first maximum (and is kept by a top-k)."""
    vocab = 49152
    w = torch.randn(vocab, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    x = _hidden(7).bfloat16()
    best = int(LmHead(w, screen=False)(x[:1]).argmax())
    twin = w[best].clone()  # one element a bf16 ulp off: a sum that rounds to the same value
    twin[:1] = (twin[:1].view(torch.int16) - 1).view(torch.bfloat16)  # the next bf16 value
    w[3] = twin
    head = LmHead(w)
    s = head.screened
    assert s is not None
    dots = s._dots(x.float(), torch.zeros(2, dtype=torch.long), torch.tensor([3, best]))
    assert float(dots[0]) != float(dots[1])
    for seed in range(4):
        xs = x if seed == 0 else _hidden(7, seed=seed).bfloat16()
        rows = _rows(7, sampling, seed=seed)
        full = head(xs)  # [7, vocab] fp32 holding bf16 values
        got = pick_screened(s, xs, rows)
        assert got is not None
        assert torch.equal(got, pick_on_device(full, rows))
        if seed == 0 and sampling is None:
            assert float(full[0, 3]) == float(full[0, best]) and int(got[0]) == 3
        approx, act, wgt = s._approx(xs.float())
        exact = _every(s, xs.float(), dots=True)
        assert bool(((exact.double() - approx.double()).abs() <= s.token_bound(act, wgt)).all())


@SLOW
def test_backend_tokens_equal_with_and_without_the_screen(tied_dir, dense_dir) -> None:  # type: ignore[no-untyped-def]
    """Greedy and seeded top-k decode through the engine, fp32 and bf16: the same tokens
    either way."""
    from tt_serve import LLM
    from tt_serve.sequence import SamplingParams

    prompts = [[5 + (7 * i + 3 * j) % 4000 for j in range(20 + 9 * i)] for i in range(4)]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=3),
        SamplingParams(max_tokens=12, temperature=0.8, top_k=5, seed=4, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2),
    ]
    dtypes = ["float32", "bfloat16"] if cpu_bf16() else ["float32"]
    for ckpt, dtype in itertools.product((tied_dir, dense_dir), dtypes):
        outs = {}
        for on in (True, False):
            llm = LLM(ckpt, dtype=dtype)
            backend = llm.engine.backend
            assert isinstance(backend, TorchBackend)
            if not on:
                backend.model.lm_head.screened = None
            else:
                assert backend.model.lm_head.screened is not None
            outs[on] = [o.token_ids for o in llm.generate(prompts, params)]
        assert outs[True] == outs[False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [[1], [20], [1, 5, 20, 1, 50], [1024, 1], [3] * 17])
def test_the_c_search_finds_what_the_torch_search_finds(
    dtype: torch.dtype, n: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """native.c's screen_best + screen_candidates against the torch ops of ``_search``: the same
    candidates, in the same order, for every row (fp32 thresholds mirrored exactly), wide rows
    included."""
    if dtype == torch.bfloat16 and not cpu_bf16():
        pytest.skip("bf16 heads are screened where the CPU multiplies bf16 natively")
    g = torch.Generator().manual_seed(len(n))
    w = torch.randn(49152, 64, generator=g) * 64**-0.5
    w *= torch.exp(torch.randn(49152, 1, generator=g) * 0.5)
    s = LmHead(w.to(dtype)).screened
    if s is None or s.search is None:
        pytest.skip("the C kernels are not compiled here")
    x = torch.randn(len(n), 64, generator=g)
    x[0, 3] = 25.0  # an outlier row: many candidates
    for cap in (sc.MAX_CANDIDATES, 30):  # 30: some rows go wide
        monkeypatch.setattr(sc, "MAX_CANDIDATES", cap)
        got = s._chunk(x, n)
        search, s.search = s.search, None
        try:
            want = s._chunk(x, n)
        finally:
            s.search = search
        assert got[2] == want[2]
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        if max(n) >= 20:  # the bound is not idle: more candidates than the n best
            assert sum(want[2]) > sum(n)
