"""PendingStep: a step the tt backend has submitted; ``result`` waits for its device picks.

``submit`` leaves at most one group of device reads in flight per step, started right after the
decode replay: the picked ids (``out_ids``) and, when a row asks for logprobs, the sampling
candidates' ids and logprobs (``out_top_ids``, ``out_top_logprobs``: [rows, 32] each, not the
logits). Everything else the step needs from the host (logits of ``want_logits`` rows, prefill
picks) was read before ``submit`` returned, so ``result`` only waits on those reads' event and
fills the device-picked rows' tokens and logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tt_serve.model.interface import StepOutput
from tt_serve.model.tt.ops import Ops, PendingRead
from tt_serve.model.tt.runtime.sampling import logprob_dict


@dataclass(frozen=True)
class PickReads:
    """Reads in flight of one program's picks; ``rows``: (row index, buffer row, top_logprobs)
    of its device-picked rows. The candidate reads are there when some row wants logprobs."""

    ids: PendingRead
    top_ids: PendingRead | None
    top_logprobs: PendingRead | None
    rows: tuple[tuple[int, int, int], ...]


class PendingStep:
    """A submitted step whose device-picked rows' results may still be on their way."""

    def __init__(
        self,
        out: StepOutput,
        *,
        resident_slots: frozenset[int] = frozenset(),
        ops: Ops | None = None,
        reads: PickReads | None = None,
    ) -> None:
        if reads is not None and ops is None:
            raise ValueError("pending reads need the ops that started them")
        self._out = out
        self._resident = resident_slots
        self._ops, self._reads = ops, reads

    @property
    def resident_slots(self) -> frozenset[int]:
        return self._resident

    @property
    def done(self) -> bool:
        return self._reads is None

    def result(self) -> StepOutput:
        """Wait for the picks (once) and return the step's output."""
        reads = self._reads
        if reads is None:
            return self._out
        assert self._ops is not None
        finish = self._ops.read_finish
        ids = finish(reads.ids).reshape(-1).astype(np.int64)
        top_ids = top_lp = None
        if reads.top_ids is not None and reads.top_logprobs is not None:
            top_ids = finish(reads.top_ids).reshape(ids.shape[0], -1).astype(np.int64)
            top_lp = finish(reads.top_logprobs).reshape(ids.shape[0], -1)
        self._reads = None
        for i, b, k in reads.rows:
            self._out.token_ids[i] = int(ids[b])
            if k > 0:
                assert top_ids is not None and top_lp is not None
                self._out.logprobs[i] = logprob_dict(int(ids[b]), top_ids[b], top_lp[b], k)
        return self._out
