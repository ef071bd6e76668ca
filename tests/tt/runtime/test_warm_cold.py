"""Warm == cold on the contract fake, sharp enough to see a restore bug: a prefix-cache hit resumes
from a GDN snapshot with only a few prompt tokens after it, and the warm run's logprobs (not only
its greedy tokens) must equal those of a run with prefix caching off. Two injected admission bugs
(resume one token off the hit, restore another snapshot slot) must make the comparison fail.

Why the tokens-only tests (test_tt_backend.py) miss them: the tiny models' GDN state fades within a
few dozen tokens, so after a 45-token suffix a wrong state leaves the greedy tokens alone. Here
the suffix is 4 tokens; resuming one token early still leaves all the tokens unchanged (measured),
only the logprobs move (by ~0.4).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests import numerics as nm
from tests.tt import harness as h
from tt_serve.engine.scheduler import Scheduler
from tt_serve.model.interface import Backend, CopyKind, StateCopy
from tt_serve.model.spec import ModelSpec
from tt_serve.sequence import Request, RequestOutput, SamplingParams

SUFFIX = 4  # prompt tokens after the hit: too few for a wrong GDN state to fade
PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=20)


@pytest.fixture(scope="module")
def warm_prompts() -> list[list[int]]:
    """A 400-token head (snapshots at 128, 256 and 384), then two prompts that hit it at 256 and
    at 384, each followed by ``SUFFIX`` new tokens."""
    head = h.prompt(400, 1)
    return [head, head[:256] + h.prompt(SUFFIX, 2), head[:384] + h.prompt(SUFFIX, 3)]


def _cold(backend: Backend, spec: ModelSpec, prompts: list[list[int]]) -> list[RequestOutput]:
    """The hit prompts on an engine with prefix caching off: every token computed."""
    return h.outputs(h.engine(backend, spec, prefix_caching=False), prompts[1:], PARAMS)


@pytest.fixture(scope="module")
def tt_cold(dense_dir: Path, warm_prompts: list[list[int]]) -> list[RequestOutput]:
    return _cold(h.tt_backend(dense_dir), ModelSpec.from_hf_dir(dense_dir), warm_prompts)


@pytest.fixture(scope="module")
def torch_cold(dense_dir: Path, warm_prompts: list[list[int]]) -> list[RequestOutput]:
    return _cold(h.torch_backend(dense_dir), ModelSpec.from_hf_dir(dense_dir), warm_prompts)


def warm(path: Path, prompts: list[list[int]]) -> list[RequestOutput]:
    """The prompts one after another on the tt backend with prefix caching on; the outputs of
    the last two (the hits)."""
    return h.outputs(h.engine(h.tt_backend(path), ModelSpec.from_hf_dir(path)), prompts, PARAMS)[1:]


def lp_tol(path: Path) -> float:
    """Logprobs of two evaluations of the same logits in another rounding order (numerics.py)."""
    dims = nm.model_dims(path)
    return nm.logprob_bound(nm.logits_bound(nm.LOGIT_SCALE, dims), nm.LOGIT_SCALE, dims.vocab)


def mismatch(got: RequestOutput, want: RequestOutput, atol: float) -> str | None:
    """How ``got`` differs from ``want``: an error, other tokens, other top-20 candidates, or a
    logprob further than ``atol`` (0: bitwise) from the reference's; None when they agree."""
    if got.error is not None or want.error is not None:
        return f"error: {got.error or want.error}"
    if got.token_ids != want.token_ids:
        return f"tokens {got.token_ids} != {want.token_ids}"
    assert got.logprobs is not None and want.logprobs is not None
    for i, (g, w) in enumerate(zip(got.logprobs, want.logprobs, strict=True)):
        if atol == 0 and g.keys() != w.keys():
            return f"token {i}: top-20 candidates differ"
        # Within a nonzero tolerance two near-tied candidates may trade the 20th place.
        diff = max(abs(g[k] - w[k]) for k in g.keys() & w.keys())
        if not diff <= atol:  # NaN fails too
            return f"token {i}: a logprob is off by {diff:.3g} (> {atol:.3g})"
    return None


def test_warm_logprobs_equal_cold_bitwise(
    dense_dir: Path, warm_prompts: list[list[int]], tt_cold: list[RequestOutput]
) -> None:
    """A hit at 256 and one at 384, each resumed from its snapshot with 4 prompt tokens left,
    give bit for bit the tokens and top-20 logprobs of the cache-off run. Warm == cold by
    construction (scheduler.py): the same chunk cuts, so the same bucket programs on the same
    values, and a snapshot copy is exact; the fake computes in fp32 with numpy, deterministically.
    Measured: 0.0 difference."""
    got = warm(dense_dir, warm_prompts)
    assert [o.cached_tokens for o in got] == [256, 384]
    assert [o.cached_tokens for o in tt_cold] == [0, 0]
    for g, w in zip(got, tt_cold, strict=True):
        assert mismatch(g, w, atol=0) is None
        assert w.logprobs is not None and all(len(lp) >= 20 for lp in w.logprobs)
    assert len({t for o in got for t in o.token_ids}) >= 6, "degenerate output: vacuous check"


def test_warm_logprobs_match_torch_cold(
    dense_dir: Path, warm_prompts: list[list[int]], torch_cold: list[RequestOutput]
) -> None:
    """The same warm hits against the torch backend with prefix caching off (another
    implementation, no restore path shared with the code under test): same tokens, logprobs
    within the derived fp32 bound for two evaluation orders (numerics.py; 2.0e-4 at the tiny
    models' logit scale), measured 1.0e-5. A wrong restore moves them by ~0.4 or more."""
    got = warm(dense_dir, warm_prompts)
    assert [o.cached_tokens for o in torch_cold] == [0, 0]
    for g, w in zip(got, torch_cold, strict=True):
        assert mismatch(g, w, atol=lp_tol(dense_dir)) is None


def _admitted_hits(sched: Scheduler, alter: Callable[[Request, int, StateCopy], None]) -> list[str]:
    """Wrap ``sched._admit`` (the product code is left as it is) so that every admission that
    restores a snapshot is then altered by ``alter(request, index of its restore among the queued
    copies, the restore)``. Returns the ids of the altered requests, filled as they are admitted."""
    admit, altered = sched._admit, []

    def admit_then_alter() -> None:
        before = len(sched._queued_copies)
        admit()
        for i, copy in enumerate(sched._queued_copies[before:], before):
            if copy.kind is CopyKind.RESTORE:
                req = next(r for r in sched.running if r.state_slot == copy.slot)
                alter(req, i, copy)
                altered.append(req.request_id)

    sched._admit = admit_then_alter  # type: ignore[method-assign]
    return altered


def resume_early(sched: Scheduler) -> list[str]:
    """M1: the hit length off by one, ``num_computed = cached_tokens - 1``."""

    def alter(req: Request, i: int, copy: StateCopy) -> None:
        req.num_computed = req.cached_tokens - 1

    return _admitted_hits(sched, alter)


def resume_late(sched: Scheduler) -> list[str]:
    """M1, the other way: ``num_computed = cached_tokens + 1``."""

    def alter(req: Request, i: int, copy: StateCopy) -> None:
        req.num_computed = req.cached_tokens + 1

    return _admitted_hits(sched, alter)


def restore_next_slot(sched: Scheduler) -> list[str]:
    """M2: restore from ``(snapshot + 1) % n``. With the pool handing out slots 0, 1, 2 to the
    snapshots at 128, 256, 384, the hit at 256 gets the state at 384 and the hit at 384 an
    unsaved slot."""
    n = sched.cache.num_snapshot_slots

    def alter(req: Request, i: int, copy: StateCopy) -> None:
        sched._queued_copies[i] = StateCopy.restore((copy.snapshot + 1) % n, copy.slot)

    return _admitted_hits(sched, alter)


Mutation = Callable[[Scheduler], list[str]]


@pytest.mark.parametrize("mutate", [resume_early, resume_late, restore_next_slot])
def test_restore_bugs_are_caught(
    dense_dir: Path,
    warm_prompts: list[list[int]],
    tt_cold: list[RequestOutput],
    torch_cold: list[RequestOutput],
    mutate: Mutation,
) -> None:
    """The comparisons above fail, on both hits and against both cold references, when the
    scheduler's admission resumes a hit one token early or late (M1) or restores another
    snapshot slot (M2): they can tell a broken restore from a correct one. Resuming early keeps
    every greedy token (measured; only logprobs show it); resuming late starts a prefill chunk
    off the 64-token grid, which the tt backend refuses, and the error is the mismatch."""
    eng = h.engine(h.tt_backend(dense_dir), ModelSpec.from_hf_dir(dense_dir))
    altered = mutate(eng.scheduler)
    got = h.outputs(eng, warm_prompts, PARAMS)[1:]
    assert altered == ["r1", "r2"], "the mutation must reach both hits"
    for g, w_tt, w_torch in zip(got, tt_cold, torch_cold, strict=True):
        assert mismatch(g, w_tt, atol=0) is not None
        assert mismatch(g, w_torch, atol=lp_tol(dense_dir)) is not None
