"""Agents resuming at message starts (cache/resume.py), warm == cold bit for bit, on the torch
backend and on the tt backend over the contract fake.

Conversations are ChatML in token ids: every message opens with IM (the engine's message-start
id), the system prompt is shared by concurrent agents, and each turn re-sends the whole history
plus the model's answer (verbatim, or re-rendered: the client drops its first two tokens, as a
client stripping reasoning does) and a tool result. Every warm answer is compared with the same
prompt run on an engine with prefix caching off: tokens and top-20 logprobs, bitwise (both
backends compute deterministically in fp32; the cuts are the same by construction). The two
injected restore bugs of test_warm_cold.py (resume one token early, restore another snapshot
slot) must make the comparison fail here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.tt import harness as h
from tests.tt.runtime.test_warm_cold import mismatch, restore_next_slot, resume_early
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import Scheduler, SchedulerConfig
from tt_serve.model.interface import Backend
from tt_serve.model.spec import ModelSpec
from tt_serve.sequence import RequestOutput, SamplingParams

IM, END, NL = 5, 6, 7
ROLE = {"system": 8, "user": 9, "assistant": 10, "tool": 11}
ANSWER = 6
PARAMS = SamplingParams(max_tokens=ANSWER, temperature=0.0, ignore_eos=True, logprobs=20)


def text(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(12, 4096, (n,), generator=g)]


def message(role: str, body: list[int]) -> list[int]:
    return [IM, ROLE[role], NL, *body, END, NL]


GEN_PROMPT = [IM, ROLE["assistant"], NL]


@dataclass
class Agent:
    history: list[int]
    prompts: list[list[int]] = field(default_factory=list)


def make_engine(
    backend: Backend, spec: ModelSpec, *, caching: bool = True, snapshots: int = 16, cap: int = 0
) -> Engine:
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_batch=4,
            chunk=h.CHUNK,
            block_size=h.BLOCK,
            mixed_steps=False,
            message_start_ids=frozenset({IM}),
        ),
        num_kv_blocks=48,
        num_snapshot_slots=snapshots,
        max_model_len=1024,
        vocab_size=spec.vocab_size,
        prefix_caching=caching,
        snapshots_per_conversation=cap,
    )
    return Engine(backend, config)


def converse(
    eng: Engine, *, agents: int, turns: int, rerender: bool
) -> tuple[list[Agent], list[RequestOutput]]:
    """Agents taking turns concurrently: each turn, every agent's prompt is queued at once and
    the engine runs until all answered. Returns the agents and every output, in order."""
    system = message("system", text(150, 0))
    crew = [Agent(system + message("user", text(20 + 9 * a, 10 + a))) for a in range(agents)]
    outs: list[RequestOutput] = []
    for t in range(turns):
        for a, agent in enumerate(crew):
            agent.prompts.append(agent.history + GEN_PROMPT)
            eng.add_request(f"a{a}t{t}", agent.prompts[-1], PARAMS)
        done: dict[str, RequestOutput] = {}
        while eng.has_unfinished():
            for o in eng.step():
                if o.finished:
                    done[o.request_id] = o
        for a, agent in enumerate(crew):
            o = done[f"a{a}t{t}"]
            assert o.error is None, o.error
            outs.append(o)
            answer = o.token_ids[2:] if rerender else o.token_ids
            agent.history = agent.prompts[-1] + answer + [END, NL]
            agent.history += message("tool", text(50 + 7 * t, 100 * a + t))
    return crew, outs


def cold(eng: Engine, prompts: list[list[int]]) -> list[RequestOutput]:
    return h.outputs(eng, prompts, PARAMS)


BACKENDS: dict[str, Callable[[Path], Backend]] = {"torch": h.torch_backend, "tt": h.tt_backend}


@pytest.mark.parametrize(
    "rerender", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["verbatim", "rerendered"]
)
@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_agents_resume_at_message_starts_warm_equals_cold(
    dense_dir: Path, kind: str, rerender: bool
) -> None:
    spec = ModelSpec.from_hf_dir(dense_dir)
    make = BACKENDS[kind]
    warm = make_engine(make(dense_dir), spec)
    crew, got = converse(warm, agents=3, turns=3, rerender=rerender)
    prompts = [p for t in range(3) for p in (agent.prompts[t] for agent in crew)]
    want = cold(make_engine(make(dense_dir), spec, caching=False), prompts)
    for g, w, p in zip(got, want, prompts, strict=True):
        assert w.cached_tokens == 0
        assert mismatch(g, w, atol=0) is None, (len(p), g.cached_tokens)
    st = warm.stats()
    assert st.resumes_message >= 6, st  # every later turn resumes at a message start
    for agent, outs in zip(crew, [got[a::3] for a in range(3)], strict=True):
        for t in range(1, 3):
            answer_start = len(agent.prompts[t - 1]) - len(GEN_PROMPT)
            added = len(agent.prompts[t]) - len(agent.prompts[t - 1])
            computed = len(agent.prompts[t]) - outs[t].cached_tokens
            assert outs[t].cached_tokens >= answer_start // h.BLOCK * h.BLOCK
            assert computed <= 1.1 * added + h.BLOCK
    assert len({t for o in got for t in o.token_ids}) >= 10, "degenerate output: vacuous check"


@pytest.mark.slow
@pytest.mark.parametrize(("snapshots", "cap"), [(2, 0), (16, 2)], ids=["pool-2", "cap-2"])
def test_warm_equals_cold_under_snapshot_eviction(
    dense_dir: Path, snapshots: int, cap: int
) -> None:
    """Two snapshot slots for three agents, or two per conversation: states are evicted all
    the time, hits are fewer, and every answer is still the cold run's."""
    spec = ModelSpec.from_hf_dir(dense_dir)
    warm = make_engine(h.tt_backend(dense_dir), spec, snapshots=snapshots, cap=cap)
    crew, got = converse(warm, agents=3, turns=3, rerender=False)
    prompts = [p for t in range(3) for p in (agent.prompts[t] for agent in crew)]
    want = cold(make_engine(h.tt_backend(dense_dir), spec, caching=False), prompts)
    for g, w in zip(got, want, strict=True):
        assert mismatch(g, w, atol=0) is None
    st = warm.scheduler.cache.stats
    assert st.snapshot_evictions > 0 and st.snapshot_restores > 0, st
    if cap:
        assert st.snapshot_cap_evictions > 0 and st.snapshots_per_conversation_peak == cap, st


@pytest.mark.parametrize(
    "mutate", [resume_early, pytest.param(restore_next_slot, marks=pytest.mark.slow)]
)
def test_resume_bugs_are_caught(dense_dir: Path, mutate: Callable[[Scheduler], list[str]]) -> None:
    """The same conversation with admission resuming one token early, or restoring another
    snapshot slot: some answer differs from the cold run (logprobs compared, not only
    tokens)."""
    spec = ModelSpec.from_hf_dir(dense_dir)
    warm = make_engine(h.tt_backend(dense_dir), spec)
    altered = mutate(warm.scheduler)
    crew, got = converse(warm, agents=2, turns=3, rerender=False)
    assert len(altered) >= 4, "the mutation must reach the hits"
    prompts = [p for t in range(3) for p in (agent.prompts[t] for agent in crew)]
    want = cold(make_engine(h.tt_backend(dense_dir), spec, caching=False), prompts)
    bad = [mismatch(g, w, atol=0) for g, w in zip(got, want, strict=True)]
    assert sum(b is not None for b in bad) >= len(altered) // 2, bad
