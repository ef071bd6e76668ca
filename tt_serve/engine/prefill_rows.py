"""How many requests prefill in one step when the torch backend chooses (``--max-prefill-rows``
0): measured from the engine's own steps.

A step of n tokens costs about a + b·n. ``a`` is what every step pays whatever its rows: the
weights read once per step (a CPU or GPU decode is bound by it), the host's per-step work; b is
a token's compute. With k requests prefilling one chunk of C tokens each, a share
a / (a + k·b·C) of a prefill step is that fixed part. One row per step gives a burst of agents
their first tokens one after another instead of all at the end; more rows amortise a. The rule
keeps the fixed part under ``SHARE`` of a prefill step with the fewest rows:

    k = ceil(a·(1 - SHARE) / (SHARE·b·C)), at least 1

and all rows (lockstep) when k reaches the batch limit. The fit is two medians, over the recent
steps below and from C/2 tokens on (decode steps and short tails against whole chunks), so a
noisy machine moves it little. Until both kinds were seen, all rows (lockstep). So that a fresh
server's first burst is not lockstep, the startup times a few steps of its own
(:func:`probe`, ``--step-probe-seconds``): a scratch sequence alternating half-chunk prefills
and one-token decodes, MIN_STEPS of each after one untimed warm-up pair. Only steps the engine
runs synchronously are timed: where decode is pipelined (torch on CUDA with device-resident
state) decode steps are not, nothing is probed, and the rule stays at lockstep, the behaviour
before it.

Measured in the agent replay (bench/runs/agent-replay.jsonl, 2 AMD EPYC cores, the fit it
ends with): at the 0.8B shape a = 0.14 s and a chunk b·C = 2.4 s (contexts of 2-4k tokens,
decode rows riding along), so k = 1; on the demo model a = 14 ms and b·C = 12 ms, so k = 11:
all of its 8 agents, where one row per step had made its replay 7 % slower. The startup
probe at the 0.8B shape: a = 0.17 s, b·C = 3.7 s, k = 1, in 10.6 s; on the demo model a = 8 ms,
b·C = 11 ms, k = 7, in 0.18 s. The cut points, and so warm == cold, do not depend on k.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tt_serve.model.interface import Backend, StateCopy, StepBatch, StepRow

log = logging.getLogger(__name__)

SHARE = 0.1
"""The largest share of a prefill step the fixed part may take."""
WINDOW = 32
"""Steps of each kind the medians look back over."""
MIN_STEPS = 4
"""Steps of each kind seen before the rule applies."""


class PrefillRows:
    """The online measure behind ``SchedulerConfig.measured_prefill_rows``."""

    def __init__(self, chunk: int, max_rows: int) -> None:
        self._chunk = chunk
        self._max_rows = max_rows
        self._small: deque[tuple[int, float]] = deque(maxlen=WINDOW)
        self._large: deque[tuple[int, float]] = deque(maxlen=WINDOW)
        self._limit = 0

    @property
    def chunk(self) -> int:
        return self._chunk

    @property
    def limit(self) -> int:
        """Requests that may prefill in the next step; 0: all of them."""
        return self._limit

    def observe(self, tokens: int, seconds: float) -> None:
        """One synchronous step of ``tokens`` tokens (a decode row counts 1) took ``seconds``."""
        if tokens < 1 or seconds <= 0:
            return
        (self._small if 2 * tokens < self._chunk else self._large).append((tokens, seconds))
        limit = self._rule()
        if limit != self._limit:
            fit = self.fit()
            assert fit is not None, "the rule moves only once it has a fit"
            log.info(
                "prefill rows per step: %s (measured: a step's fixed part %.3f s, a chunk's "
                "compute %.3f s)",
                limit or "all",
                fit[0],
                fit[1] * self._chunk,
            )
        self._limit = limit

    def fit(self) -> tuple[float, float] | None:
        """(a, b) in seconds and seconds per token, or None before both kinds were seen."""
        if len(self._small) < MIN_STEPS or len(self._large) < MIN_STEPS:
            return None
        n_s = statistics.median(n for n, _ in self._small)
        t_s = statistics.median(t for _, t in self._small)
        n_l = statistics.median(n for n, _ in self._large)
        t_l = statistics.median(t for _, t in self._large)
        b = (t_l - t_s) / (n_l - n_s)
        return max(t_s - b * n_s, 0.0), b

    def _rule(self) -> int:
        fit = self.fit()
        if fit is None:
            return 0
        a, b = fit
        if b <= 0:  # a chunk costs no more than a decode step: all host overhead
            return 0
        k = max(1, math.ceil(a * (1 - SHARE) / (SHARE * b * self._chunk)))
        return 0 if k >= self._max_rows else k


@dataclass(frozen=True)
class ProbeResult:
    """What :func:`probe` timed: steps of each kind, the seconds it took, and the rule's limit
    after them (0: all rows)."""

    small_steps: int
    large_steps: int
    seconds: float
    limit: int


def probe_blocks(chunk: int, block_size: int) -> int:
    """KV blocks :func:`probe`'s scratch sequence writes."""
    tokens = (MIN_STEPS + 1) * (max(chunk // 2, 1) + 1)
    return -(-tokens // block_size)


def probe(
    backend: Backend,
    rows: PrefillRows,
    *,
    blocks: tuple[int, ...],
    state_slot: int,
    vocab_size: int,
    budget_s: float,
    clock: Callable[[], float] | None = None,
) -> ProbeResult:
    """Time steps of both kinds on a scratch sequence and feed them to ``rows``, so the rule
    holds from the first request on.

    The sequence alternates a prefill of C/2 tokens (a "large" step: the fit's chunk side) and
    a one-token decode that samples (the LM head, as a decode row pays it), at contiguous
    positions through ``blocks`` and ``state_slot``, which the caller owns for the duration and
    which are reset afterwards (their KV is garbage no request reads: a request writes its
    blocks before it attends to them). The first pair is a warm-up, not timed (first-call
    allocations, kernel loads). A step is skipped once the time spent plus the last time of its
    kind would pass ``budget_s``; the rule then completes from the server's own steps."""
    clock = clock or time.perf_counter
    half = max(rows.chunk // 2, 1)
    start = clock()
    pos = 0
    counts = {False: 0, True: 0}  # large?
    last = {False: 0.0, True: 0.0}
    backend.copy_states([StateCopy.reset(state_slot)])
    try:
        for i in range(MIN_STEPS + 1):
            for large in (True, False):
                n = half if large else 1
                if i > 0 and clock() - start + last[large] > budget_s:
                    continue
                ids = tuple((7919 * (pos + j) + 1) % vocab_size for j in range(n))
                row = StepRow(
                    seq_id=0,
                    token_ids=ids,
                    start_pos=pos,
                    block_table=blocks,
                    state_slot=state_slot,
                    sample=not large,
                )
                t0 = clock()
                backend.execute(StepBatch((row,)))
                last[large] = clock() - t0
                pos += n
                if i > 0:
                    rows.observe(n, last[large])
                    counts[large] += 1
    finally:
        backend.copy_states([StateCopy.reset(state_slot)])
    return ProbeResult(counts[False], counts[True], clock() - start, rows.limit)
