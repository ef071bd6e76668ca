"""The engine: schedule -> execute -> update, one step at a time, single-threaded.

Only the scheduler and the prefix cache mutate bookkeeping; the backend returns token ids (or
logits for host-sampled rows). If ``execute`` raises, exactly the requests of that batch fail,
their reservations are released (nothing of that step was registered or published) and the
engine keeps serving the rest.

Pipelined decode (a ``PipelinedBackend`` with ``device_resident``): a decode step of plain
greedy requests is submitted without waiting for its ids. On the next ``step()`` the engine
submits the follow-up decode step first (rows carry ``FED_TOKEN``: the device feeds each slot
its own last id) and only then reads, applies and reports the earlier step, so host work
(reading ids, stop checks, detokenization, HTTP delivery) overlaps the device's next step.
Results apply one step late: a request that stops at step n has one discarded row in step n+1
(its KV write lands in its own reservation or in a released block that the device rewrites in
order); a request that reaches max_tokens at step n gets no row. Admission, prefill chunks,
host sampling and logprobs run synchronously: the pipeline drains for them.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tt_serve.cache import CacheStats, PrefixCache, SnapshotSave
from tt_serve.engine import sampler
from tt_serve.engine.scheduler import ScheduledStep, Scheduler, SchedulerConfig, pipelinable
from tt_serve.model.interface import (
    Backend,
    PendingOutput,
    PipelinedBackend,
    StateCopy,
    StepOutput,
)
from tt_serve.sequence import (
    FinishReason,
    Request,
    RequestError,
    RequestOutput,
    SamplingParams,
)

log = logging.getLogger(__name__)


class TextStream(Protocol):
    """Incremental detokenization plus stop-string matching for one request."""

    def push(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        """Feed new tokens; return (text safe to emit now, whether a stop string was hit)."""
        ...

    def flush(self) -> str:
        """The text held back so far (called once when the request ends without a stop)."""
        ...


TextStreamFactory = Callable[[SamplingParams], TextStream]


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerConfig
    num_kv_blocks: int
    num_snapshot_slots: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: frozenset[int] = frozenset()
    prefix_caching: bool = True
    cache_salt: bytes = b""


@dataclass
class _InFlight:
    """A submitted step whose ids have not been read yet."""

    step: ScheduledStep
    pending: PendingOutput


@dataclass
class _Tracked:
    req: Request
    rng: np.random.Generator
    stream: TextStream | None
    text: str = ""
    sent_tokens: int = 0
    stopped: bool = False  # a stop string ended the text


class Engine:
    def __init__(
        self,
        backend: Backend,
        config: EngineConfig,
        *,
        text_streams: TextStreamFactory | None = None,
    ) -> None:
        self.backend = backend
        self.config = config
        sc = config.scheduler
        self.cache = PrefixCache(
            num_blocks=config.num_kv_blocks,
            block_size=sc.block_size,
            num_snapshot_slots=config.num_snapshot_slots,
            stride=sc.chunk,
            enabled=config.prefix_caching,
            salt=config.cache_salt,
        )
        self.scheduler = Scheduler(sc, self.cache)
        backend.allocate(
            num_kv_blocks=config.num_kv_blocks,
            block_size=sc.block_size,
            num_state_slots=self.scheduler.num_state_slots,
            num_snapshot_slots=max(config.num_snapshot_slots, 1),
        )
        self._text_streams = text_streams
        self._tracked: dict[str, _Tracked] = {}
        self._seq_ids = itertools.count(1)
        self.num_failed_steps = 0
        self.num_pipelined_steps = 0  # decode steps submitted before the previous one was read
        self.prefill_tokens_computed = 0
        self.decode_tokens_computed = 0
        self._pipelined: PipelinedBackend | None = (
            backend if isinstance(backend, PipelinedBackend) and backend.device_resident else None
        )
        self._inflight: _InFlight | None = None

    # -- requests ----------------------------------------------------------------------------

    @property
    def has_tokenizer(self) -> bool:
        return self._text_streams is not None

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise RequestError (a ValueError) naming the limit; allocates nothing."""
        params.validate()
        if len(prompt_token_ids) == 0:
            raise RequestError("prompt is empty: at least one token is required")
        vocab = self.config.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token id {bad[0]!r} is outside the vocabulary [0, {vocab})")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.config.max_model_len:
            raise RequestError(
                f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) = "
                f"{total} exceeds the model's maximum context length "
                f"({self.config.max_model_len} tokens)"
            )
        need = self.cache.lifetime_tokens(len(prompt_token_ids), params.max_tokens)
        pages = -(-need // self.config.scheduler.block_size)
        if pages > self.cache.num_usable_blocks:
            raise RequestError(
                f"request needs {pages} KV blocks ({need} tokens) but the KV pool has only "
                f"{self.cache.num_usable_blocks} blocks of {self.config.scheduler.block_size} "
                f"tokens: it can never fit"
            )
        if params.stop_strings and self._text_streams is None:
            raise RequestError("stop strings need a tokenizer, and this model has none")

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        if request_id in self._tracked:
            raise RequestError(f"request id {request_id!r} is already in use")
        prompt = [int(t) for t in prompt_token_ids]
        self.validate(prompt, params)
        req = Request(
            request_id=request_id,
            seq_id=next(self._seq_ids),
            prompt_token_ids=prompt,
            params=params,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
        )
        stream = self._text_streams(params) if self._text_streams is not None else None
        self._tracked[request_id] = _Tracked(req, sampler.make_rng(params.seed), stream)
        self.scheduler.add(req)

    def abort(self, request_id: str) -> bool:
        """Finish a request now, freeing its blocks, slot and pins. False if unknown."""
        t = self._tracked.get(request_id)
        if t is None:
            return False
        self.scheduler.finish(t.req, FinishReason.ABORT)
        self._tracked.pop(request_id, None)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self._inflight is not None

    @property
    def pipelining(self) -> bool:
        """Whether decode steps are submitted ahead of reading (deviceResident backends)."""
        return self._pipelined is not None

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def cache_stats(self) -> CacheStats:
        return self.cache.stats

    # -- the step ----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        if self._inflight is not None:
            return self._step_pipelined(self._inflight)
        step = self.scheduler.schedule()
        if step is None:
            return self._collect()
        pipe = self._pipelined
        try:
            if step.pre_copies:
                self.backend.copy_states(step.pre_copies)
            if pipe is not None and _is_pipelinable(step):
                self._inflight = _InFlight(step, pipe.submit(step.batch))
                return self._collect()
            output = self.backend.execute(step.batch)
        except Exception as exc:  # the batch fails; the engine keeps serving
            self._fail_step(step, exc)
            return self._collect()
        finally:
            for rid in step.restored:
                self.cache.restore_done(rid)
        self._apply(step, output)
        return self._collect()

    def _step_pipelined(self, prev: _InFlight, *, run_ahead: bool = True) -> list[RequestOutput]:
        """Submit the follow-up of ``prev`` (if ``run_ahead`` and the scheduler has one), then
        read and apply ``prev``."""
        assert self._pipelined is not None
        self._inflight = None
        nxt: _InFlight | None = None
        refused: BaseException | None = None
        follow = (
            self.scheduler.follow_up(prev.step, prev.pending.resident_slots) if run_ahead else None
        )
        if follow is not None:
            try:
                nxt = _InFlight(follow, self._pipelined.submit(follow.batch))
                self.num_pipelined_steps += 1
            except Exception as exc:
                refused = exc
        try:
            output = prev.pending.result()
        except Exception as exc:
            self._fail_step(prev.step, exc)
            if nxt is not None:  # it fed on ids that never arrived
                self._fail_step(nxt.step, exc)
                self._discard(nxt)
            return self._collect()
        self._inflight = nxt  # set first: whatever happens below, nxt is read later
        self._apply(prev.step, output)
        outs = self._collect()  # stops of ``prev`` (tokens and strings) count before a failure
        if refused is not None and follow is not None:
            # Only requests still running lose anything: a row of one that just stopped was
            # going to be discarded anyway.
            self._fail_step(follow, refused)
            outs += self._collect()
        return outs

    def _discard(self, inflight: _InFlight) -> None:
        try:
            inflight.pending.result()
        except Exception as exc:
            log.error("discarded step failed too: %r", exc)

    def _apply(self, step: ScheduledStep, output: StepOutput) -> None:
        """Pick tokens from a step's output and record them (a failure fails that batch)."""
        try:
            tokens, logprobs = self._pick_tokens(
                step, output.token_ids, output.logprobs, output.logits
            )
        except Exception as exc:
            self._fail_step(step, exc)
            return
        self._count_tokens(step)
        saves = self.scheduler.update(step, tokens, logprobs, self.config.eos_token_ids)
        # Saves come from prefill rows only, and prefill never runs with a step in flight: a
        # save queued behind a later step would capture the state after that step.
        assert not (saves and self._inflight is not None), "snapshot save while pipelining"
        self._save_snapshots(saves)

    def drain(self) -> list[RequestOutput]:
        """Read and apply a step still in flight, submitting nothing (shutdown); outputs like
        ``step``."""
        if self._inflight is None:
            return self._collect()
        return self._step_pipelined(self._inflight, run_ahead=False)

    def _count_tokens(self, step: ScheduledStep) -> None:
        for row, req in zip(step.batch.rows, step.requests, strict=True):
            if req.finished:
                continue  # a discarded row (pipelining): its request stopped a step earlier
            if row.start_pos < req.prompt_len:
                self.prefill_tokens_computed += row.num_tokens
            else:
                self.decode_tokens_computed += row.num_tokens

    def _pick_tokens(
        self,
        step: ScheduledStep,
        device_tokens: list[int | None],
        device_logprobs: list[dict[int, float] | None],
        logits: dict[int, np.ndarray],
    ) -> tuple[list[int | None], list[dict[int, float] | None]]:
        tokens: list[int | None] = []
        lps: list[dict[int, float] | None] = []
        for i, (row, req) in enumerate(zip(step.batch.rows, step.requests, strict=True)):
            if not row.sample:
                tokens.append(None)
                lps.append(None)
                continue
            k = req.params.logprobs
            if row.want_logits:
                raw = logits[i]
                tok = sampler.sample(
                    raw,
                    req.params,
                    self._tracked[req.request_id].rng,
                    req.prompt_token_ids,
                    req.output_token_ids,
                )
                tokens.append(tok)
                lps.append(sampler.top_logprobs(raw, tok, k) if k is not None else None)
            else:
                tok_dev = device_tokens[i]
                if tok_dev is None:
                    raise RuntimeError(f"backend returned no token for sampling row {i}")
                tokens.append(int(tok_dev))
                got = device_logprobs[i] if i < len(device_logprobs) else None
                lps.append(got if k is not None else None)
        return tokens, lps

    def _fail_step(self, step: ScheduledStep, exc: BaseException) -> None:
        if all(r.finished for r in step.requests):
            return  # rows of requests that ended meanwhile: nothing to fail
        self.num_failed_steps += 1
        log.error("step failed for %d request(s): %r", len(step.requests), exc)
        self.scheduler.fail(step.requests, f"backend error: {exc}")

    def _save_snapshots(self, saves: list[tuple[SnapshotSave, int]]) -> None:
        """Copy state slots into reserved snapshot slots, then publish (or abort on error).

        Runs right after update and before the next execute, so a slot freed by a request that
        finished in this very step still holds the state being saved."""
        if not saves:
            return
        try:
            self.backend.copy_states([StateCopy.save(slot, s.snapshot_slot) for s, slot in saves])
        except Exception as exc:
            log.error("snapshot save failed: %r", exc)
            for s, _ in saves:
                self.cache.abort(s)
            return
        for s, _ in saves:
            self.cache.publish(s)

    # -- outputs -----------------------------------------------------------------------------

    def _collect(self) -> list[RequestOutput]:
        """Outputs for requests that progressed or finished since the last report."""
        outs: list[RequestOutput] = []
        for rid, t in list(self._tracked.items()):
            req = t.req
            new_tokens = req.output_token_ids[t.sent_tokens :]
            if not new_tokens and not req.finished:
                continue
            new_text = ""
            if t.stream is not None and new_tokens and not t.stopped:
                delta, stopped = t.stream.push(new_tokens)
                new_text += delta
                if stopped:
                    t.stopped = True
                    self.scheduler.finish(req, FinishReason.STOP)
            if t.stream is not None and req.finished and not t.stopped:
                new_text += t.stream.flush()
            t.text += new_text
            t.sent_tokens = len(req.output_token_ids)
            outs.append(self._make_output(t, new_tokens, new_text))
            if req.finished:
                self._tracked.pop(rid, None)
        return outs

    def _make_output(self, t: _Tracked, new_tokens: list[int], new_text: str) -> RequestOutput:
        req = t.req
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            token_ids=list(req.output_token_ids),
            text=t.text if t.stream is not None else None,
            finish_reason=req.finish_reason.value if req.finish_reason else None,
            cached_tokens=req.cached_tokens,
            logprobs=list(req.output_logprobs) if req.params.logprobs is not None else None,
            new_token_ids=list(new_tokens),
            new_text=new_text,
            error=req.error,
            arrival_time=req.arrival_time,
            first_scheduled_time=req.first_scheduled_time,
            first_token_time=req.first_token_time,
            finished_time=req.finished_time,
        )


def _is_pipelinable(step: ScheduledStep) -> bool:
    """A pure decode step of plain greedy requests (no state copies pending)."""
    return not step.pre_copies and all(
        row.num_tokens == 1 and pipelinable(req)
        for row, req in zip(step.batch.rows, step.requests, strict=True)
    )
