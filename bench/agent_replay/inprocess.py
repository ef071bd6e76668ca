"""The same replay driven through an engine in this process, no HTTP: the conversations are
rendered with the model's chat template, every agent's next turn is queued as soon as its
answer is finished, and ``RequestOutput.cached_tokens`` gives each request's computed tokens.

Backends: ``torch`` (the CPU default) and ``ttnn-virtual`` (the ttnn backend on its virtual
device, ``VirtualTTNN``: the real ttnn code path on a numpy device, so it runs anywhere). The
prefill chunk C is a switch (``--chunk``; issue 37 asks for 2,048 on ttnn), and so is the
resume rule (``resume_points``), forwarded to ``SchedulerConfig`` only when given (see
:func:`scheduler_config`).

An answer is re-sent as the server would return it with tools in the request: the generated ids
decoded with special tokens kept, split at ``</think>`` when thinking is on (no tool-call parsing:
a random-weight model's output holds no call that parses).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.agent_replay.client import answer_start
from bench.agent_replay.records import TurnRecord
from bench.agent_replay.workload import Answer, Conversation, Workload, common_prefix
from tt_serve.config import ServeConfig
from tt_serve.engine.engine import Engine, EngineConfig
from tt_serve.engine.scheduler import SchedulerConfig
from tt_serve.sequence import RequestOutput, SamplingParams
from tt_serve.tokenizer import Tokenizer

BACKENDS = ("torch", "ttnn-virtual")
THINK_CLOSE = "</think>"
VIRTUAL_TRACE_REGION = 64 << 20
"""The virtual device's trace region (the tiny models' tests open the same; the fake charges
every capture to it)."""


@dataclass(frozen=True)
class EngineShape:
    """What the in-process engine is built with."""

    backend: str
    chunk: int
    max_model_len: int
    max_batch: int
    snapshot_slots: int = ServeConfig.snapshot_slots
    resume_points: str | None = None
    """``messages`` or ``chunks``; None: the scheduler's own default (today: chunks)."""


def scheduler_config(cfg: ServeConfig, resume_points: str | None) -> SchedulerConfig:
    """The scheduler config ``engine/factory.py`` derives from ``cfg``, plus the resume rule.

    The hook: ``resume_points`` is passed as ``SchedulerConfig(resume_points=...)`` only when it
    is given, so this runs against a scheduler that has no such field yet (the default rule),
    and fails loudly (TypeError) if one is asked for before it exists."""
    extra: dict[str, Any] = {} if resume_points is None else {"resume_points": resume_points}
    return SchedulerConfig(
        max_batch=cfg.resolved_max_batch_size,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        chunk=cfg.prefill_chunk,
        block_size=cfg.block_size,
        mixed_steps=cfg.mixed_steps,
        device_argmax=cfg.device_argmax,
        device_sampling=cfg.device_sampling,
        **extra,
    )


def serve_config(model: str, shape: EngineShape) -> ServeConfig:
    backend = "torch" if shape.backend == "torch" else "ttnn"
    blocks_per_seq = -(-shape.max_model_len // ServeConfig.block_size)
    return ServeConfig(
        model=model,
        backend=backend,
        prefill_chunk=shape.chunk,
        max_num_batched_tokens=max(ServeConfig.max_num_batched_tokens, shape.chunk),
        max_model_len=shape.max_model_len,
        max_batch_size=shape.max_batch,
        snapshot_slots=shape.snapshot_slots,
        # The virtual device plans nothing here: room for every row's context twice over (the
        # cached prefixes of finished turns stay in the pool), and the tests' trace region.
        kv_blocks=0 if backend == "torch" else 2 * shape.max_batch * blocks_per_seq + 1,
        trace_region_size=0 if backend == "torch" else VIRTUAL_TRACE_REGION,
    )


def build_engine(model: str, shape: EngineShape) -> Engine:
    """An engine on ``shape.backend`` for the checkpoint in ``model``, as the server builds it
    (``engine/factory.py``), with the virtual device standing in for a Tenstorrent chip."""
    from tt_serve.model.spec import ModelSpec

    if shape.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {shape.backend!r}")
    cfg = serve_config(model, shape)
    spec = ModelSpec.from_hf_dir(model)
    max_len = min(shape.max_model_len, spec.max_position_embeddings)
    if shape.backend == "torch":
        from tt_serve.model.launch import launch_backend

        launched = launch_backend(cfg, spec, max_len)
    else:
        from tt_serve.model.tt.contract.virtual_ttnn import VirtualTTNN
        from tt_serve.model.tt.launch import launch
        from tt_serve.model.tt.ops import Ops

        launched = launch(cfg, spec, max_model_len=max_len, ops=Ops(VirtualTTNN()))
    config = EngineConfig(
        scheduler=scheduler_config(cfg, shape.resume_points),
        num_kv_blocks=launched.num_kv_blocks,
        num_snapshot_slots=cfg.num_snapshot_slots,
        max_model_len=max_len,
        vocab_size=spec.vocab_size,
        eos_token_ids=frozenset(spec.eos_token_ids),
        prefix_caching=True,
    )
    return Engine(launched.backend, config)


def split_answer(ids: list[int], tok: Tokenizer, thinking: bool) -> Answer:
    """The answer as the server returns it: with thinking on, the text before ``</think>`` is
    reasoning (all of it when the model never closes the block), the rest content."""
    text = tok.decode(ids, skip_special_tokens=False)
    if not thinking:
        return Answer(content=text, token_ids=ids)
    reasoning, closed, content = text.partition(THINK_CLOSE)
    if not closed:
        return Answer(reasoning=text.strip("\n"), token_ids=ids)
    return Answer(content=content.lstrip("\n"), reasoning=reasoning.strip("\n"), token_ids=ids)


@dataclass
class _Live:
    conv: Conversation
    rec: TurnRecord
    ids: list[int]
    sent: float


def replay(
    engine: Engine,
    workload: Workload,
    mode: str,
    tok: Tokenizer,
    progress: Callable[[TurnRecord], object] | None = None,
) -> tuple[list[TurnRecord], float]:
    """Every agent's turns through ``engine``; the records (by agent, turn) and the makespan.
    ``progress`` is called with each finished request's record."""
    sizes = workload.sizes
    params = SamplingParams(max_tokens=sizes.answer, temperature=0.0, ignore_eos=True)
    im_start = tok.token_to_id("<|im_start|>")
    records: list[TurnRecord] = []
    live: dict[str, _Live] = {}
    t0 = time.perf_counter()

    def submit(conv: Conversation, prev: list[int] | None, answer: Answer | None) -> None:
        turn = conv.turn + 1
        ids = conv.prompt_ids(tok)
        rec = TurnRecord(conv.agent, turn, len(ids))
        if prev is not None and answer is not None:
            rec.answer_start = answer_start(prev, im_start)
            rec.resumable = common_prefix(ids, prev + answer.token_ids)
            if mode == "rerendered":
                rec.rerender_changed = conv.messages[-2]["content"] != answer.content
        records.append(rec)
        rid = f"a{conv.agent}-t{turn}"
        now = time.perf_counter()
        rec.start = now - t0
        engine.add_request(rid, ids, params)
        live[rid] = _Live(conv, rec, ids, now)

    def finish(item: _Live, out: RequestOutput) -> None:
        rec = item.rec
        rec.e2el = time.perf_counter() - item.sent
        if out.error is not None:
            rec.error = out.error[:300]
            return
        rec.prompt_tokens = len(out.prompt_token_ids)
        rec.cached_tokens = out.cached_tokens
        rec.completion_tokens = len(out.token_ids)
        if item.conv.turn + 1 < sizes.turns:
            answer = split_answer(list(out.token_ids), tok, workload.thinking)
            item.conv.add(answer)
            submit(item.conv, item.ids, answer)

    for a in range(sizes.agents):
        submit(workload.conversation(a, mode), None, None)
    while engine.has_unfinished():
        for out in engine.step():
            item = live.get(out.request_id)
            if item is None:
                continue
            if item.rec.ttft is None and out.token_ids:
                item.rec.ttft = time.perf_counter() - item.sent
            if out.finished:
                del live[out.request_id]
                finish(item, out)
                if progress is not None:
                    progress(item.rec)
    makespan = time.perf_counter() - t0
    records.sort(key=lambda r: (r.agent, r.turn))
    return records, makespan
