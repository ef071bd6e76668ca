"""The same replay driven through an engine in this process, no HTTP: the conversations are
rendered with the model's chat template, every agent's next turn is queued as soon as its
answer is finished, and ``RequestOutput.cached_tokens`` gives each request's computed tokens.

Backends: ``torch`` (the CPU default) and ``ttnn-virtual`` (the ttnn backend on its virtual
device, ``VirtualTTNN``: the real ttnn code path on a numpy device, so it runs anywhere). The
prefill chunk C is a switch (``--chunk``; issue 37 asks for 2,048 on ttnn), and so is the
resume rule (``ServeConfig.resume_points``). The engine is built by the server's own factory.

An answer is re-sent as the server would return it with tools in the request: the generated ids
decoded with special tokens kept, split at ``</think>`` when thinking is on (no tool-call parsing:
a random-weight model's output holds no call that parses).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from bench.agent_replay.client import answer_start
from bench.agent_replay.records import TurnRecord
from bench.agent_replay.workload import Answer, Conversation, Workload, common_prefix
from tt_serve.config import ServeConfig
from tt_serve.engine.engine import Engine
from tt_serve.sequence import RequestOutput, SamplingParams
from tt_serve.tokenizer import Tokenizer

BACKENDS = ("torch", "ttnn-virtual")
SCHEDULES = ("default", "lockstep")
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
    resume_points: str = ServeConfig.resume_points
    """``messages`` or ``chunks`` (the A/B control)."""
    kv_blocks: int = 0
    """The KV pool in blocks (0: sized from memory on torch, every row twice on the virtual
    device): a pool smaller than the agents' histories makes the tiers matter."""
    host_cache_gb: float = 0.0
    """The prefix cache's host tier (0: off)."""
    schedule: str = "default"
    """``default`` (the server's step schedule) or ``lockstep`` (every prefilling request in
    every step, all-prefill and all-decode steps: the A/B control)."""


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
        kv_blocks=shape.kv_blocks
        or (0 if backend == "torch" else 2 * shape.max_batch * blocks_per_seq + 1),
        host_cache_gb=shape.host_cache_gb,
        trace_region_size=0 if backend == "torch" else VIRTUAL_TRACE_REGION,
        resume_points=shape.resume_points,
    )


def build_engine(model: str, shape: EngineShape, tok: Tokenizer) -> Engine:
    """An engine on ``shape.backend`` for the checkpoint in ``model``, built by the server's own
    factory (``engine/factory.py``: message-start ids from ``tok``, the snapshot cap), with the
    virtual device standing in for a Tenstorrent chip."""
    from tt_serve.engine.factory import build_engine as factory_engine
    from tt_serve.model.spec import ModelSpec

    if shape.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {shape.backend!r}")
    cfg = serve_config(model, shape)
    spec = ModelSpec.from_hf_dir(model)
    launched = None
    if shape.backend == "ttnn-virtual":
        from tt_serve.model.tt.launch import launch
        from tt_serve.model.tt.ops import Ops
        from tt_serve.model.tt.virtual.device import VirtualTTNN

        max_len = min(shape.max_model_len, spec.max_position_embeddings)
        launched = launch(cfg, spec, max_model_len=max_len, ops=Ops(VirtualTTNN()))
    engine = factory_engine(cfg, spec=spec, tokenizer=tok, launched=launched)
    if shape.schedule == "lockstep":
        sched = engine.scheduler
        sched.config = replace(
            sched.config, max_prefill_rows=0, measured_prefill_rows=False, mixed_steps=False
        )
        sched.prefill_rows = None
    elif shape.schedule != "default":
        raise ValueError(f"schedule must be one of {SCHEDULES}, not {shape.schedule!r}")
    return engine


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
