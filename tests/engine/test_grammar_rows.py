"""Constrained rows in the engine: the bitmask step of the host sampler, a grammar's tokens
only, the gate that opens on a token, grammar errors failing one request, and what a
constrained row costs the rest of the batch (device argmax kept, pipelining paused)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.engine.fake_backend import FakeBackend, PipelinedFakeBackend
from tests.engine.test_engine_pipeline import drive, make
from tt_serve.engine import sampler
from tt_serve.sequence import SamplingParams

V = 1000


def bitmask_of(allowed: set[int], vocab: int = V) -> np.ndarray:
    bits = np.zeros(-(-vocab // 32) * 32, dtype=np.uint8)
    bits[list(allowed)] = 1
    return np.packbits(bits, bitorder="little").view(np.int32)


class SetGrammar:
    """Allows the tokens of ``allowed[i]`` at step i (the last set repeats); counts uses."""

    def __init__(self, allowed: list[set[int]]) -> None:
        self.allowed = allowed
        self.matchers: list[SetMatcher] = []

    def matcher(self) -> SetMatcher:
        m = SetMatcher(self.allowed)
        self.matchers.append(m)
        return m


class SetMatcher:
    def __init__(self, allowed: list[set[int]]) -> None:
        self.allowed, self.pos, self.accepted = allowed, 0, []  # type: list[set[int]], int, list[int]

    def _now(self) -> set[int]:
        return self.allowed[min(self.pos, len(self.allowed) - 1)]

    def fill_bitmask(self, out: np.ndarray) -> None:
        out[:] = bitmask_of(self._now())

    def accept(self, token_id: int) -> bool:
        ok = token_id in self._now()
        self.pos += 1
        self.accepted.append(token_id)
        return ok

    def error(self) -> str | None:
        return "empty set" if not self._now() else None


def test_apply_token_bitmask() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(V).astype(np.float32)
    allowed = {0, 31, 32, 500, 999}
    out = sampler.apply_token_bitmask(logits, bitmask_of(allowed))
    assert set(np.flatnonzero(np.isfinite(out))) == allowed
    assert np.array_equal(out[sorted(allowed)], logits[sorted(allowed)])
    # a mask shorter than the logits bans the rest
    assert not np.isfinite(sampler.apply_token_bitmask(logits, bitmask_of({1}, 64))[64:]).any()
    for params in (
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_p=0.5, top_k=3, min_p=0.1),
        SamplingParams(temperature=2.0, repetition_penalty=5.0, frequency_penalty=2.0),
    ):
        for seed in range(20):
            tok = sampler.sample(
                logits, params, sampler.make_rng(seed), [500], [31, 31], bitmask_of(allowed)
            )
            assert tok in allowed


def test_constrained_row_keeps_other_rows_on_device_argmax() -> None:
    grammar = SetGrammar([{7, 11, 13}])
    eng = make(FakeBackend(), max_batch=4)
    arrivals = [
        (
            0,
            "g",
            list(range(1, 40)),
            SamplingParams(max_tokens=12, temperature=0.0, grammar=grammar),
        ),
        (0, "a", list(range(5, 50)), SamplingParams(max_tokens=12, temperature=0.0)),
        (0, "b", list(range(9, 70)), SamplingParams(max_tokens=12, temperature=0.0)),
    ]
    res = drive(eng, arrivals)
    assert set(res["g"][0]) <= {7, 11, 13} and len(res["g"][0]) == 12
    assert grammar.matchers[0].accepted == res["g"][0]
    stats = eng.stats()
    # only the constrained row went to the host; both greedy rows stayed on device argmax
    assert stats.sampled_rows_host == 12 and stats.sampled_rows_device == 24
    # and their tokens are those of a run without the constrained request
    alone = drive(make(FakeBackend(), max_batch=4), arrivals[1:])
    assert res["a"] == alone["a"] and res["b"] == alone["b"]


def test_gate_opens_on_its_token() -> None:
    eng = make(FakeBackend())
    free = drive(
        eng, [(0, "r", list(range(3, 30)), SamplingParams(max_tokens=10, temperature=0.0))]
    )
    toks = free["r"][0]
    gate = toks[3]
    grammar = SetGrammar([{5}])
    params = SamplingParams(
        max_tokens=10, temperature=0.0, grammar=grammar, grammar_after_token=gate
    )
    got = drive(make(FakeBackend()), [(0, "r", list(range(3, 30)), params)])["r"][0]
    cut = toks.index(gate) + 1
    assert got[:cut] == toks[:cut] and got[cut:] == [5] * (10 - cut)
    assert grammar.matchers[0].accepted == got[cut:]


def test_gate_opens_on_a_fed_id_while_pipelining() -> None:
    """Pipelined: the gated row's next token follows an id still on the device, so its fed rows
    ask for logits (the gate may have opened); a greedy neighbour keeps running ahead."""
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    free = drive(make(FakeBackend()), [(0, "r", list(range(3, 30)), greedy)])["r"][0]
    gate = free[3]
    grammar = SetGrammar([{5}])
    params = replace(greedy, grammar=grammar, grammar_after_token=gate)
    arrivals = [
        (0, "r", list(range(3, 30)), params),
        (0, "n", list(range(40, 60)), SamplingParams(max_tokens=30, temperature=0.0)),
    ]
    sync = drive(make(FakeBackend(), max_batch=4), arrivals)
    eng = make(PipelinedFakeBackend(), max_batch=4)
    piped = drive(eng, arrivals)
    assert piped["r"][0] == sync["r"][0] and piped["n"][0] == sync["n"][0]
    cut = free.index(gate) + 1
    assert piped["r"][0][cut:] == [5] * (12 - cut)
    assert eng.stats().pipelined_decode_steps >= 20


def test_grammar_error_fails_only_its_request() -> None:
    dead = SetGrammar([{4}, set()])  # allows one token, then nothing
    eng = make(FakeBackend())
    res = drive(
        eng,
        [
            (0, "x", [1, 2, 3], SamplingParams(max_tokens=6, temperature=1.0, grammar=dead)),
            (0, "ok", [4, 5, 6], SamplingParams(max_tokens=6, temperature=0.0)),
        ],
    )
    assert res["x"][0] == [4] and res["x"][1] == "error" and "grammar" in (res["x"][3] or "")
    assert res["ok"][1] == "length" and len(res["ok"][0]) == 6


@pytest.mark.parametrize("constrained", [False, True])
def test_a_constrained_row_does_not_stop_pipelining(constrained: bool) -> None:
    """The host-picked (grammar) row sits out the step after each of its own and rejoins with
    its id; the greedy row runs ahead on fed ids throughout."""
    eng = make(PipelinedFakeBackend(), max_batch=4)
    arrivals = [(0, "a", list(range(1, 20)), SamplingParams(max_tokens=40, temperature=0.0))]
    if constrained:
        g = SamplingParams(max_tokens=10, temperature=0.0, grammar=SetGrammar([{9}]))
        arrivals.append((0, "g", list(range(2, 21)), g))
    res = drive(eng, arrivals)
    assert len(res["a"][0]) == 40
    n = eng.stats().pipelined_decode_steps
    if constrained:
        assert res["g"][0] == [9] * 10
    assert n >= 35
