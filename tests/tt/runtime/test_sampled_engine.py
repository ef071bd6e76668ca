"""Sampled traffic through the engine on the ttnn backend (contract fake, numeric mode): device
draws pipeline with ``deviceResident`` and give the synchronous engine's tokens for the same
seeds, a row the device cannot draw (top-k 0, over ttnn's 32) or must not (penalties) is picked
on the host without stopping the others, and the engine says which path picked each token."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.drive import run_all
from tests.tt import harness as h
from tt_serve.engine.engine import Engine
from tt_serve.model.spec import ModelSpec
from tt_serve.sequence import RequestOutput, SamplingParams

pytestmark = pytest.mark.slow

N = 12
REQUESTS = [
    SamplingParams(max_tokens=N, ignore_eos=True, seed=1, temperature=0.7, top_k=20, top_p=0.9),
    SamplingParams(max_tokens=N, ignore_eos=True, seed=2, temperature=1.0, top_k=32),
    SamplingParams(max_tokens=N, ignore_eos=True, seed=3, temperature=0.7, top_k=8, min_p=0.1),
    SamplingParams(max_tokens=N, ignore_eos=True, seed=4, temperature=1.0),  # top-k 0: host
]


def _run(eng: Engine, prompts: list[list[int]]) -> list[RequestOutput]:
    return run_all(eng, list(zip(prompts, REQUESTS, strict=True)))


def test_sampled_batch_pipelines_and_equals_synchronous(dense_dir: Path) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    prompts = [h.prompt(70 + 9 * i, 40 + i) for i in range(len(REQUESTS))]
    sync = _run(h.engine(h.tt_backend(dense_dir), spec), prompts)
    be = h.tt_backend(dense_dir, device_resident=True)
    eng = h.engine(be, spec)
    piped = _run(eng, prompts)
    assert all(o.error is None and len(o.token_ids) == N for o in piped)
    assert [o.token_ids for o in piped] == [o.token_ids for o in sync]
    assert [(o.picked_on_device, o.picked_on_host) for o in piped] == [(N, 0)] * 3 + [(0, N)]
    # the host-picked row sat out every other step; the drawn rows kept running ahead
    assert eng.num_pipelined_steps >= N // 2
    assert be.device_fed_decodes > 0
    assert len({t for o in piped for t in o.token_ids}) > 20
    # the same seeds give the same tokens run to run
    again = _run(h.engine(h.tt_backend(dense_dir, device_resident=True), spec), prompts)
    assert [o.token_ids for o in again] == [o.token_ids for o in piped]
