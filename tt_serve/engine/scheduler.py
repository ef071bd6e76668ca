"""Continuous batching with chunked prefill at resume points.

Every prefill chunk of a request ends at one of its resume points (``cache/resume.py``: the
multiples of the chunk size C, the starts of chat messages, the last grid point before the
prompt end, all chosen from the prompt's own tokens) or at the prompt end, and prefix-cache hits
start at those points only. A warm run therefore cuts the computation at exactly the places a
cold run does, which is what makes warm == cold hold by construction on a deterministic backend.

Admission is FCFS through the prefix cache's lifetime accounting: a request is admitted only when
every page it can ever need is reserved, so a running request never waits for memory and nothing
is ever preempted. A request whose shared prefix is being computed right now by another request
waits for that computation instead of repeating it.

Two step shapes: mixed steps (decode rows ride in the prefill steps; the server's choice for
torch on the CPU, where a step reads the weights once whatever its rows) and all-prefill /
all-decode steps (``ServeConfig.mixed_steps``: ttnn traces need them, and CUDA's decode
graphs). In the latter a decode step runs after at most ``max_prefill_streak`` consecutive
prefill steps, bounding decode stalls.

Prefill rows: at most ``max_prefill_rows`` requests advance their prompt in one step (0: all;
with ``measured_prefill_rows``, as many as ``engine/prefill_rows.py`` measures the backend's
steps to want), the earliest admitted first (``prefill_order`` "arrival"; "shortest" takes the
fewest remaining prompt tokens first), one chunk each. The server keeps arrival: shortest-first
gave a burst's first-token p50 0.223 against 0.247 s on the demo model (one row,
bench/runs/prefill-order.jsonl), but under steady load it can starve a long prompt for good.
Where a step costs in proportion to its tokens (the CPU at the 0.8B shape; the graphed CUDA and
ttnn prefill, which replay one row at a time) a burst of agents' turns then gets its first
tokens one after another instead of all at the end, at nearly the same throughput; where a
step's fixed part dominates (a tiny model, an eager GPU step that batches rows) rows at once
amortise it. The cost of one row: a long prompt
admitted first holds the others' first tokens until its prefill ends (head-of-line blocking;
a cap above 1 trades it back). A request's chunks stay its own resume segments (one row per
request per step), so the cut points, and warm == cold, do not depend on this choice.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from tt_serve.cache import (
    PAD_BLOCK,
    Admission,
    PrefixCache,
    ResumeRule,
    SnapshotSave,
    TierPolicy,
    Tiers,
    TierStats,
    UnitRead,
    UnitWrite,
)

__all__ = ["ScheduledStep", "Scheduler", "SchedulerConfig", "TierPolicy", "TierStats", "UnitWrite"]
from tt_serve.config.serve_config import RESUME_POINTS, ServeConfig
from tt_serve.engine.prefill_rows import PrefillRows
from tt_serve.model.interface import RowSampling, StateCopy, StepBatch, StepRow
from tt_serve.sequence import FinishReason, Request, RequestError, RequestStatus

_D = ServeConfig()  # the defaults are ServeConfig's, stated there once
PREFILL_ORDERS = ("arrival", "shortest")


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int = _D.resolved_max_batch_size
    max_num_batched_tokens: int = _D.max_num_batched_tokens
    chunk: int = _D.prefill_chunk
    block_size: int = _D.block_size
    mixed_steps: bool = True
    # False: greedy rows ask for logits and the engine picks argmax on the host (the control arm
    # of the device-argmax A/B).
    device_argmax: bool = _D.device_argmax
    # False: every temperature / top-k / top-p / min-p row asks for logits and is drawn on the
    # host (the control arm of the device-sampling A/B).
    device_sampling: bool = _D.device_sampling
    max_prefill_streak: int = 2
    # Requests advancing their prompt in one step (0: all of them, the budget permitting), and
    # which first: "arrival" (admission order) or "shortest" (fewest prompt tokens left).
    max_prefill_rows: int = 0
    prefill_order: str = "arrival"
    # The cap measured from the engine's own step times instead (``PrefillRows``; the torch
    # backend's default), max_prefill_rows then ignored.
    measured_prefill_rows: bool = False
    # Where prompts are cut (and hits resume): "messages" adds message starts and the prompt
    # end to the chunk multiples; "chunks" is the chunk-only control arm.
    resume_points: str = _D.resume_points
    message_start_ids: frozenset[int] = frozenset()  # the tokenizer's <|im_start|>
    # Bytes of tier restores written into the device per step while other requests run (the
    # rest in later steps; the restoring request waits): a 128k-token unit never lands in one
    # step. With nothing else to run, a restore is written whole.
    restore_bytes_per_step: int = 16 << 20

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {self.max_batch}")
        if self.chunk % self.block_size:
            raise ValueError(
                f"chunk ({self.chunk}) must be a multiple of block_size ({self.block_size})"
            )
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_prefill_rows < 0:
            raise ValueError(f"max_prefill_rows must be >= 0, got {self.max_prefill_rows}")
        if self.prefill_order not in PREFILL_ORDERS:
            raise ValueError(
                f"prefill_order must be one of {PREFILL_ORDERS}, got {self.prefill_order!r}"
            )
        if self.resume_points not in RESUME_POINTS:
            raise ValueError(
                f"resume_points must be one of {RESUME_POINTS}, got {self.resume_points!r}"
            )

    @property
    def resume_rule(self) -> ResumeRule:
        return ResumeRule(
            chunk=self.chunk,
            grid=self.block_size,
            boundary_ids=self.message_start_ids,
            messages=self.resume_points == "messages",
        )


@dataclass
class _PendingWrite:
    """A tier restore being written into the device piece by piece (``Scheduler._plan_writes``)."""

    request_id: str
    write: UnitWrite
    done: int = 0  # blocks in pieces planned so far
    started: bool = False  # the first piece (with the snapshot) is planned
    planned_all: bool = False  # the last piece is planned
    seconds: float = 0.0  # device write time of the pieces applied

    @property
    def unwritten(self) -> tuple[int, ...]:
        return self.write.blocks[self.done :]


@dataclass
class ScheduledStep:
    """What one engine step runs: the batch and its requests (row-aligned), the state copies to
    apply before execute (``pre_copies``) and, once ``update`` has run, the snapshot saves to
    apply after it (``update`` returns them). ``commit`` closes the step: it publishes or aborts the
    saves and releases the snapshots pinned for ``restored`` requests."""

    batch: StepBatch
    requests: list[Request]
    pre_copies: list[StateCopy] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    saves: list[SnapshotSave] = field(default_factory=list)
    # Restores from a tier (request id, bytes to write), applied before ``pre_copies``.
    unit_writes: list[tuple[str, UnitWrite]] = field(default_factory=list)


class Scheduler:
    """The prefix cache's one client: admission, step planning, results, request ends."""

    def __init__(
        self,
        config: SchedulerConfig,
        cache: PrefixCache,
        *,
        uniform: Callable[[Request], float],
        device_top_k: int = 0,
    ) -> None:
        """``uniform(req)``: the next uniform of the request's own generator (one per token the
        device draws; the engine's host sampler takes its uniforms from the same generator).
        ``device_top_k``: the largest top-k the backend draws on the device (0: any, rows
        without a top-k included); other non-argmax rows are drawn on the host."""
        self.config = config
        self.cache = cache
        self._uniform = uniform
        self._device_top_k = device_top_k
        self._rule = config.resume_rule
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # One GDN state slot per possible running row, 0 .. max_batch - 1 (low ones first).
        self._free_slots: list[int] = list(range(config.max_batch - 1, -1, -1))
        self._prefill_streak = 0
        self._queued_copies: list[StateCopy] = []
        self._queued_restored: list[str] = []
        self._queued_writes: list[tuple[str, UnitWrite]] = []
        self._pending_writes: list[_PendingWrite] = []
        # The head of the queue did not fit and nothing was released since: admission would
        # fail again, so it need not drain a pipelined decode.
        self._admission_blocked = False
        self.prefill_rows = (
            PrefillRows(config.chunk, config.max_batch) if config.measured_prefill_rows else None
        )

    @classmethod
    def with_cache(
        cls,
        config: SchedulerConfig,
        *,
        num_kv_blocks: int,
        num_snapshot_slots: int,
        prefix_caching: bool,
        salt: bytes,
        uniform: Callable[[Request], float],
        device_top_k: int = 0,
        snapshots_per_conversation: int = 0,
        host_cache_bytes: int = 0,
        disk_cache_dir: str | None = None,
        disk_cache_bytes: int = 0,
        cache_fingerprint: bytes = b"",
        tier_policy: TierPolicy | None = None,
    ) -> Scheduler:
        """A scheduler over a new prefix cache of these sizes (the cache is its alone), with
        the host / disk tiers asked for (``Tiers.open``: ValueError for an unusable folder)."""
        tiers = None
        if prefix_caching:
            tiers = Tiers.open(
                block_size=config.block_size,
                host_bytes=host_cache_bytes,
                disk_dir=disk_cache_dir,
                disk_bytes=disk_cache_bytes,
                fingerprint=cache_fingerprint,
                policy=tier_policy,
            )
        cache = PrefixCache(
            num_blocks=num_kv_blocks,
            block_size=config.block_size,
            num_snapshot_slots=num_snapshot_slots,
            stride=config.chunk,
            enabled=prefix_caching,
            salt=salt,
            snapshots_per_conversation=snapshots_per_conversation,
            tiers=tiers,
        )
        return cls(config, cache, uniform=uniform, device_top_k=device_top_k)

    @property
    def num_state_slots(self) -> int:
        return self.config.max_batch

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Raise RequestError when a request could never be admitted (its lifetime KV exceeds
        the whole pool)."""
        need = self.cache.lifetime_tokens(prompt_len, max_tokens)
        bs = self.config.block_size
        pages = -(-need // bs)
        if pages > self.cache.num_usable_blocks:
            raise RequestError(
                f"request needs {pages} KV blocks ({need} tokens) but the KV pool has only "
                f"{self.cache.num_usable_blocks} blocks of {bs} tokens: it can never fit"
            )

    @contextlib.contextmanager
    def scratch(self, num_blocks: int) -> Iterator[tuple[tuple[int, ...], int] | None]:
        """Fresh KV blocks and a free state slot for work outside any request (the startup
        probe), returned to their pools on exit; None when either is short."""
        pool = self.cache.block_pool
        if not self._free_slots or num_blocks > pool.num_allocatable:
            yield None
            return
        blocks = pool.allocate(num_blocks)
        slot = self._free_slots.pop()
        try:
            yield tuple(blocks), slot
        finally:
            self._free_slots.append(slot)
            pool.release(blocks)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: Request) -> None:
        req.resume = self._rule.points(req.prompt_token_ids)
        p = req.params
        req.grammar_open = p.grammar is not None and p.grammar_after_token is None
        self.waiting.append(req)

    # -- admission ---------------------------------------------------------------------------

    def _admit(self) -> None:
        deferred: list[Request] = []
        self._admission_blocked = False
        while self.waiting and self._free_slots and len(self.running) < self.config.max_batch:
            req = self.waiting[0]
            prompt, points = req.prompt_token_ids, req.resume
            memo = req.block_hashes
            computing = self.cache.inflight_boundary(prompt, points, memo)  # 0 when idle
            if computing and computing > self.cache.match(prompt, points):
                # Another request is computing this prefix now: wait for its snapshot rather
                # than compute the same head twice. Others behind it may still go.
                deferred.append(self.waiting.popleft())
                continue
            res = self.cache.admit(req.request_id, prompt, req.params.max_tokens, points, memo)
            if res.admission is Admission.READING:
                # Its hit is being read from disk: the step runs without it, others may go.
                deferred.append(self.waiting.popleft())
                continue
            if res.admission is Admission.LATER:
                self._admission_blocked = True
                break
            self.waiting.popleft()
            if res.admission is Admission.NEVER:
                self.finish(req, FinishReason.ERROR, error=res.reason)
                continue
            req.status = RequestStatus.RUNNING
            req.state_slot = self._free_slots.pop()
            req.block_table = res.block_table
            req.cached_tokens = res.cached_tokens
            req.num_computed = res.cached_tokens
            req.first_scheduled_time = time.monotonic()
            if res.unit_write is not None:
                self._pending_writes.append(_PendingWrite(req.request_id, res.unit_write))
            if res.restore_snapshot is not None:
                self._queued_copies.append(StateCopy.restore(res.restore_snapshot, req.state_slot))
                self._queued_restored.append(req.request_id)
            else:
                self._queued_copies.append(StateCopy.reset(req.state_slot))
            self.running.append(req)
        self.waiting.extendleft(reversed(deferred))

    # -- step planning -----------------------------------------------------------------------

    def _prefill_row(self, req: Request, budget: int, force: bool) -> StepRow | None:
        start = req.num_computed
        assert req.resume is not None, "points are set when the request is added"
        end = req.resume.next_end(start)
        if end - start > budget and not force:
            return None
        last = end == req.prompt_len
        return self._sampled(
            req,
            StepRow(
                seq_id=req.seq_id,
                token_ids=tuple(req.prompt_token_ids[start:end]),
                start_pos=start,
                block_table=req.block_table,
                state_slot=req.state_slot,
                sample=last,
                want_logits=last and self.host_picks(req),
                top_logprobs=req.params.logprobs or 0,
            ),
        )

    def _decode_row(self, req: Request) -> StepRow:
        return self._sampled(
            req,
            StepRow(
                seq_id=req.seq_id,
                token_ids=(req.all_token_ids[-1],),
                start_pos=req.num_tokens - 1,
                block_table=req.block_table,
                state_slot=req.state_slot,
                sample=True,
                want_logits=self.host_picks(req),
                top_logprobs=req.params.logprobs or 0,
            ),
        )

    def _sampled(self, req: Request, row: StepRow) -> StepRow:
        """The row with its device draw (this token's uniform) when the device draws it. Called
        only for rows that will run: each call consumes one uniform of the request."""
        p = req.params
        if not row.sample or row.want_logits or p.argmax:
            return row
        s = RowSampling(p.temperature, p.top_k, p.top_p, p.min_p, self._uniform(req))
        return replace(row, sampling=s)

    def host_picks(self, req: Request) -> bool:
        """Whether the host picks this request's next token from the logits: device argmax or
        device sampling is off, penalties (host only), a grammar constrains it (its bitmask is
        applied on the host), or the backend cannot draw its top-k."""
        p = req.params
        if not self.config.device_argmax or p.has_penalties or req.grammar_open:
            return True
        if p.argmax:
            return False
        limit = self._device_top_k
        return not self.config.device_sampling or (limit > 0 and not 1 <= p.top_k <= limit)

    def _may_pick_on_host(self, req: Request) -> bool:
        """``host_picks`` for a token after one whose id is still unknown: a gated grammar may
        open on that id."""
        p = req.params
        return self.host_picks(req) or (p.grammar is not None and p.grammar_after_token is not None)

    def schedule(self) -> ScheduledStep | None:
        """Plan the next step, or None when nothing can run."""
        self._admit()
        held = self._plan_writes()
        decodes = [r for r in self.running if r.prefill_done]
        prefills = [r for r in self.running if not r.prefill_done and id(r) not in held]
        rows: list[StepRow] = []
        reqs: list[Request] = []
        run_decode = bool(decodes)
        run_prefill = bool(prefills)
        if not self.config.mixed_steps and decodes and prefills:
            # All-prefill or all-decode: prefill first, but never starve decodes for long.
            run_decode = self._prefill_streak >= self.config.max_prefill_streak
            run_prefill = not run_decode
        if run_decode:
            for r in decodes:
                rows.append(self._decode_row(r))
                reqs.append(r)
        budget = self.config.max_num_batched_tokens - len(rows)
        if run_prefill:
            if self.config.prefill_order == "shortest":
                prefills.sort(key=lambda r: r.prompt_len - r.num_computed)  # stable: ties FCFS
            cap = self.max_prefill_rows
            if cap:
                prefills = prefills[:cap]
            for r in prefills:
                row = self._prefill_row(r, budget, force=not rows)
                if row is None:
                    break
                rows.append(row)
                reqs.append(r)
                budget -= row.num_tokens
                if budget <= 0:
                    break
        if not rows and not self._queued_writes:
            return None
        if run_prefill and decodes and not run_decode:
            self._prefill_streak += 1
        else:
            self._prefill_streak = 0
        step = ScheduledStep(
            _batch(rows),
            reqs,
            self._queued_copies,
            self._queued_restored,
            unit_writes=self._queued_writes,
        )
        self._queued_copies, self._queued_restored, self._queued_writes = [], [], []
        return step

    def _plan_writes(self) -> set[int]:
        """Queue this step's pieces of the pending tier restores and return the running
        requests (by id()) that must wait: those holding a block still unwritten after it.

        Each restore's first piece carries its snapshot (a state copy from its slot may run in
        the same step), then its blocks in order, within ``restore_bytes_per_step`` over all
        restores while some request that does not wait would run; everything at once when
        none would, or when the restoring request has ended (its blocks and slot are no
        longer held: the rest must land before an admission could reuse them)."""
        if not self._pending_writes:
            return set()
        pending = {b for w in self._pending_writes for b in w.unwritten}
        free = any(r.prefill_done or pending.isdisjoint(r.block_table) for r in self.running)
        budget = self.config.restore_bytes_per_step
        ids = {r.request_id for r in self.running}
        for w in self._pending_writes:
            if w.planned_all:
                continue  # its last piece is in a step not yet applied
            first = not w.started
            n = len(w.unwritten)
            paced = free and w.request_id in ids
            if paced:
                room = budget - (len(w.write.snapshot or b"") if first else 0)
                n = min(n, max(room, 0) // len(w.write.block_data[w.done])) if n else 0
                if n == 0 and not first:
                    continue
            piece = replace(
                w.write,
                blocks=w.write.blocks[w.done : w.done + n],
                block_data=w.write.block_data[w.done : w.done + n],
                snapshot=w.write.snapshot if first else None,
            )
            self._queued_writes.append((w.request_id, piece))
            w.done += n
            w.started = True
            w.planned_all = w.done == len(w.write.blocks)
            if paced:
                budget -= piece.nbytes
        unwritten = {b for w in self._pending_writes for b in w.unwritten}
        return {id(r) for r in self.running if not unwritten.isdisjoint(r.block_table)}

    @property
    def max_prefill_rows(self) -> int:
        """Requests that may prefill in the next step (0: all of them)."""
        if self.prefill_rows is not None:
            return self.prefill_rows.limit
        return self.config.max_prefill_rows

    def observe_step(self, batch: StepBatch, seconds: float) -> None:
        """A step ran synchronously in ``seconds`` (feeds the measured prefill rows)."""
        if self.prefill_rows is not None:
            self.prefill_rows.observe(batch.num_tokens, seconds)

    def follow_up(self, prev: ScheduledStep, resident: frozenset[int]) -> ScheduledStep | None:
        """The decode step to submit while ``prev`` (a submitted, unread decode step) runs.

        Per running request: one whose token ``prev`` picks on the device gets a fed row
        (``model/interface.py``) at the position after ``prev``'s; one whose token ``prev`` leaves
        to the host gets no row (its id is unknown until ``prev`` is read) and rejoins the step
        after with that id; one ``prev`` skipped gets its ordinary decode row. None when the
        next step needs the host: a request is waiting and could be admitted now, a prefill is
        pending, a device-picked id was not left on the device, or no row would run. A request
        ``prev`` finishes by length gets no row (its lifetime reservation ends there); one
        ``prev`` finishes by a stop token or string gets a row whose result the engine
        discards.
        """
        if (
            self.waiting
            and self._free_slots
            and len(self.running) < self.config.max_batch
            and not self._admission_blocked
        ):
            return None
        in_prev = {id(r): row for r, row in zip(prev.requests, prev.batch.rows, strict=True)}
        plan: list[tuple[Request, bool]] = []  # (request, fed)
        for req in self.running:
            if not req.prefill_done:
                return None
            before = in_prev.get(id(req))
            if before is None:
                plan.append((req, False))
                continue
            if before.want_logits or len(req.output_token_ids) + 1 >= req.params.max_tokens:
                continue
            if req.state_slot not in resident:
                return None
            plan.append((req, True))
        if not any(fed for _, fed in plan):
            return None
        # Rows are built only now: a device-drawn row consumes its request's next uniform.
        rows = [self._fed_row(req) if fed else self._decode_row(req) for req, fed in plan]
        return ScheduledStep(_batch(rows), [req for req, _ in plan])

    def _fed_row(self, req: Request) -> StepRow:
        host = self._may_pick_on_host(req)
        return self._sampled(
            req,
            StepRow(
                seq_id=req.seq_id,
                token_ids=(),
                start_pos=req.num_tokens,
                block_table=req.block_table,
                state_slot=req.state_slot,
                sample=True,
                want_logits=host,
                top_logprobs=req.params.logprobs or 0,
                fed=True,
            ),
        )

    # -- results -----------------------------------------------------------------------------

    def update(
        self,
        step: ScheduledStep,
        tokens: list[int | None],
        logprobs: list[dict[int, float] | None],
        eos_token_ids: frozenset[int],
    ) -> list[StateCopy]:
        """Record a successful step: computed positions, registrations, sampled tokens, stops.

        Returns the snapshot saves (state slot -> reserved snapshot slot) to copy now, before
        anything else runs on those slots; ``commit`` then publishes or aborts them."""
        now = time.monotonic()
        copies: list[StateCopy] = []
        for row, req, tok, lp in zip(step.batch.rows, step.requests, tokens, logprobs, strict=True):
            if req.finished:
                continue
            req.num_computed = row.end_pos
            save = self.cache.on_computed(
                req.request_id,
                req.all_token_ids,
                req.num_computed,
                snapshot_ok=req.num_computed <= req.prompt_len,
            )
            if save is not None:
                step.saves.append(save)
                copies.append(StateCopy.save(req.state_slot, save.snapshot_slot))
            if tok is None:
                continue
            req.output_token_ids.append(tok)
            if lp is not None:
                req.output_logprobs.append(lp)
            if req.first_token_time is None:
                req.first_token_time = now
            if not req.grammar_open and tok == req.params.grammar_after_token:
                req.grammar_open = req.params.grammar is not None
            reason = _stop_reason(req, tok, eos_token_ids)
            if reason is not None:
                self.finish(req, reason)
        return copies

    def commit(self, step: ScheduledStep, *, error: str | None = None, saved: bool = True) -> None:
        """Close a step. ``error``: execute failed, so its running requests fail (nothing of it
        was registered). ``saved``: the post-step copies ran, so the saves are published
        (else aborted: their slots return to the pool). Restore pins are released either way:
        the restore copies were issued before execute."""
        if error is not None:
            self.fail(step.requests, error)
        for save in step.saves:
            if saved and error is None:
                self.cache.publish(save)
            else:
                self.cache.abort(save)
        for rid in step.restored:
            self.cache.restore_done(rid)

    # -- tiers -------------------------------------------------------------------------------

    def take_unit_reads(self) -> list[UnitRead]:
        """Units published since the last call, to read from the device before the next
        ``schedule`` (``PrefixCache.take_unit_reads``)."""
        return self.cache.take_unit_reads()

    def store_unit(
        self, read: UnitRead, snapshot: bytes, blocks: list[bytes], seconds: float
    ) -> None:
        """The bytes of a unit read in ``seconds`` go to the tiers."""
        self.cache.store_unit(read, snapshot, blocks)
        tiers = self.cache.tiers
        if tiers is not None:
            tiers.record_writethrough(seconds)

    def narrow_unit_read(self, read: UnitRead) -> UnitRead | None:
        """``read`` cut to the blocks the tiers lack now (``PrefixCache.narrow_unit_read``)."""
        return self.cache.narrow_unit_read(read)

    def _pending_of(self, rid: str, piece: UnitWrite) -> _PendingWrite | None:
        for w in self._pending_writes:
            if w.request_id == rid and w.write.snapshot_slot == piece.snapshot_slot:
                return w
        return None

    def unit_failed(self, rid: str, piece: UnitWrite, error: str) -> list[Request]:
        """A piece of a restore's write failed: every running request holding one of the
        unit's blocks or restoring from its snapshot slot ends with ``error`` (they would read
        what the write left), then the cache forgets the unit and its other pieces are not
        written. Returns the requests ended."""
        w = self._pending_of(rid, piece)
        write = piece
        if w is not None:
            self._pending_writes.remove(w)
            write = w.write
        written = set(write.blocks)
        restoring = set(self.cache.restoring_from(write.snapshot_slot))
        hit = [
            r
            for r in self.running
            if written.intersection(r.block_table) or r.request_id in restoring
        ]
        for req in hit:
            self.finish(req, FinishReason.ERROR, error=error)
        self.cache.drop_unit(write)
        return hit

    def unit_restored(self, rid: str, piece: UnitWrite, seconds: float) -> None:
        """A piece of a tier restore is on the device after ``seconds`` of writing; the last
        one completes the restore (counted in the metrics, its waiting requests run)."""
        w = self._pending_of(rid, piece)
        if w is None:
            return
        w.seconds += seconds
        if w.planned_all and (not piece.blocks or piece.blocks[-1] == w.write.blocks[-1]):
            self._pending_writes.remove(w)
            tiers = self.cache.tiers
            if tiers is not None:
                full = w.write
                tiers.record_restore(
                    full.tier, full.tokens, full.nbytes, full.fetch_seconds + w.seconds
                )

    def fail(self, requests: list[Request], error: str) -> None:
        for req in requests:
            if not req.finished:
                self.finish(req, FinishReason.ERROR, error=error)

    def finish(
        self,
        req: Request,
        reason: FinishReason,
        error: str | None = None,
        *,
        bad_request: bool = False,
    ) -> None:
        """Finish a request and return everything it holds to the pools. Idempotent.
        ``bad_request``: the error is the request's own (e.g. its grammar failed)."""
        if req.finished:
            return
        self._admission_blocked = False  # a slot, blocks or the head of the queue moved
        if req.status is RequestStatus.WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        elif req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            self.cache.release(req.request_id)
            self._free_slots.append(req.state_slot)
            req.state_slot = -1
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.error = error
        req.bad_request = bad_request
        req.finished_time = time.monotonic()


def _batch(rows: list[StepRow]) -> StepBatch:
    """The rows as a batch, block tables padded with PAD_BLOCK to one width."""
    width = max(len(r.block_table) for r in rows)
    return StepBatch(tuple(_pad_row(r, width) for r in rows))


def _pad_row(row: StepRow, width: int) -> StepRow:
    if len(row.block_table) == width:
        return row
    return replace(row, block_table=row.block_table + (PAD_BLOCK,) * (width - len(row.block_table)))


def _stop_reason(req: Request, tok: int, eos_token_ids: frozenset[int]) -> FinishReason | None:
    p = req.params
    n = len(req.output_token_ids)
    if n >= p.min_tokens:
        if not p.ignore_eos and tok in eos_token_ids:
            return FinishReason.STOP
        if p.stop_token_ids and tok in p.stop_token_ids:
            return FinishReason.STOP
    if n >= p.max_tokens:
        return FinishReason.LENGTH
    return None
